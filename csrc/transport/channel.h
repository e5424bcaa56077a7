#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "csrc/common/error.h"

namespace ringdist {

// Something a waiting rank sleeps on when its pending channels have no file
// descriptor (shared memory): peers ring it after moving bytes. arm() then a
// final progress check then sleep() cannot miss a ring.
class Doorbell {
 public:
  virtual ~Doorbell() = default;
  virtual uint32_t arm() = 0;
  virtual void sleep(uint32_t armed, std::chrono::microseconds timeout) = 0;
  virtual void disarm() = 0;
  // Any thread: ends a current sleep() (or the next, if between arm and sleep).
  virtual void ring() = 0;
  // Tells the peers which CPU this rank runs on (Channel::peerCpu).
  virtual void publishCpu(int cpu) = 0;
  // CPUs the ranks of this host may run on together (the union of their
  // affinities at connect time): ranks each pinned to a core of their own
  // have as many cores as ranks, though each process sees only one.
  virtual int hostCores() const = 0;
};

// A Channel is one bidirectional, ordered byte stream to one peer rank.
//
// Terms used by every transport:
//   post    queue a send or a receive of a fixed number of bytes; sends leave
//           in post order and receives are filled in post order, so both
//           sides must post matching sizes in the same order (the wire has no
//           per-message framing; collectives add their own headers).
//   ticket  the 1-based position of a post in its direction; a ticket is
//           done once every byte of that post (and every earlier one) moved.
//   progress  move as many bytes as possible without blocking.
//
// Completion callbacks run on the progress thread right after the post
// completes, before any later post on the same direction is touched; a
// receive callback may call postRecvNext() to read a payload whose size it
// learnt from a header it just received.
class Channel {
 public:
  using Callback = std::function<void()>;

  virtual ~Channel() = default;

  int peer() const { return peer_; }

  // dst[i] = combine(a[i], b[i]) over `count` elements (a reduction kernel).
  using Combine = void (*)(void* dst, const void* a, const void* b, size_t count);

  virtual uint64_t postSend(const void* data, size_t bytes, Callback done = nullptr) = 0;
  virtual uint64_t postRecv(void* data, size_t bytes, Callback done = nullptr) = 0;
  // A receive that combines the incoming bytes with `other` on arrival:
  // dst = combine(incoming, other), element by element (elementBytes each);
  // combine(other, incoming) with incomingFirst false (a reduction in rank
  // order whose first operand is ours: min/max keep the first of two NaNs).
  // dst may alias other. Lets a transport reduce straight out of its own
  // buffers instead of landing the bytes somewhere first.
  virtual uint64_t postRecvReduce(void* dst, const void* other, size_t bytes, size_t elementBytes,
                                  Combine combine, bool incomingFirst = true) = 0;
  // From inside a receive callback only: queue a receive ahead of every
  // receive posted so far (it continues the message just read).
  virtual uint64_t postRecvNext(void* data, size_t bytes, Callback done = nullptr) = 0;

  virtual bool sendDone(uint64_t ticket) const = 0;
  virtual bool recvDone(uint64_t ticket) const = 0;
  virtual bool hasPending() const = 0;
  // True while receives are queued: the next incoming bytes are theirs.
  virtual bool receiving() const = 0;
  // With no receive queued: copies the next `bytes` of the incoming stream
  // into dst without consuming them; false if fewer have arrived. Lets a
  // receive from any source look at a link without taking anything off it.
  virtual bool peek(void* dst, size_t bytes) = 0;

  // Moves bytes without blocking; returns true if any byte moved. Throws
  // ringdist::Error when the peer is gone or the stream is broken.
  virtual bool progress() = 0;

  // For blocking waits: a file descriptor and poll(2) events that signal
  // this channel can progress; -1 when the channel has nothing pending.
  virtual int pollFd() const = 0;
  virtual short pollEvents() const = 0;
  // A descriptor readable (POLLIN) when bytes arrive that no receive asked
  // for yet; -1 for transports that ring the doorbell instead.
  virtual int incomingFd() const { return -1; }
  // True when incoming bytes wait in the channel's own buffers, off the
  // descriptor (TCP's sealed records read ahead): a poll would not announce
  // them, so a waiter must not sleep while a receive or a watch wants them.
  virtual bool bufferedInput() const { return false; }

  // Bytes handed to the transport that the peer has not acknowledged yet
  // (TCP: the socket's send queue, SIOCOUTQ). A done send may still be on
  // the wire; collectives that must not overlap two transfers on one link
  // wait for this to drain. 0 where a done send is already readable.
  virtual size_t unacknowledgedBytes() const { return 0; }
  // Any thread (the worker may be sending): the bytes the peer acknowledged since the link
  // opened, and the microseconds the link spent with bytes unacknowledged (TCP_INFO's
  // bytes_acked and busy_time): their ratio is the rate the path delivers while there is
  // something to deliver, also where the sender idles in between; the link's smallest
  // round trip (min_rtt), against which a busy time means something; and the bytes not
  // acknowledged yet (unacknowledgedBytes). Zeros where not measured (shared memory) or once
  // closed.
  struct SendTotals {
    uint64_t bytesAcked = 0;
    uint64_t busyUs = 0;
    uint64_t roundTripUs = 0;
    uint64_t unacknowledged = 0;
  };
  virtual SendTotals sendTotals() const { return {}; }
  // Any thread: milliseconds since data from the peer last arrived (TCP: the kernel's count,
  // tcpi_last_data_recv), -1 where unknown (shared memory, closed). A stopped peer sends
  // nothing; a live one whose beats queue behind a congested link still does.
  virtual int64_t quietMs() const { return -1; }
  // Any thread: caps the rate this link sends at (bytes per second; 0 lifts the cap), for
  // tests and emulation of a slow link (TCP: the kernel paces it). False where unsupported.
  virtual bool capSendRate(uint64_t bytesPerSecond) {
    (void)bytesPerSecond;
    return false;
  }
  // Channels without a pollable fd return their Doorbell instead.
  virtual Doorbell* doorbell() const { return nullptr; }
  // The CPU the peer last began an op or a wait on (Doorbell::publishCpu), -1 if
  // unknown: a rank does not spin for a peer that needs its core.
  virtual int peerCpu() const { return -1; }
  // Throws when the peer is known to be gone (for transports that cannot
  // see a hang-up on a file descriptor).
  virtual void checkAlive() const {}
  // Throws when the peer closed the link (it aborted): for waits that do
  // not go through the link (the board, Communicator::publish).
  virtual void checkOpen() const {}
  // True when the peer's process is known to be gone (same host: its pid no
  // longer runs the process that connected); false when alive or unknown.
  // Safe from any thread, also after close().
  virtual bool peerDead() const { return false; }

  // Single copy (same host): true when this process can read and write the
  // peer's memory directly, agreed by every rank of the host at connect time.
  virtual bool copiesPeerMemory() const { return false; }
  // Copies `bytes` at address `from` of the peer's memory into dst. The peer
  // must keep that memory unchanged until told the read is done. Throws,
  // naming the peer, if the read fails or the peer closed the link (it
  // aborted, so the memory may have been reused mid-read): a completed call
  // read what the peer lent. Only where copiesPeerMemory() is true.
  virtual void readPeerMemory(uint64_t from, void* dst, size_t bytes) {
    (void)from, (void)dst, (void)bytes;
    RINGDIST_FAIL("ringdist: no single-copy reads from rank ", peer_);
  }
  // Copies `bytes` from src to address `to` of the peer's memory, which the
  // peer lent for writing: until it is told the write is done it does not
  // return, and closing the link (abort) waits for a write in flight, so a
  // write never lands in memory the peer may have reused. Throws, naming
  // the peer, if the link is closed or the write fails.
  virtual void writePeerMemory(uint64_t to, const void* src, size_t bytes) {
    (void)to, (void)src, (void)bytes;
    RINGDIST_FAIL("ringdist: no single-copy writes to rank ", peer_);
  }

  // The smallest round trip measured on this link so far, in microseconds
  // (TCP: the kernel's min_rtt, sampled from the connection's handshake on);
  // 0 where nothing is measured (shared memory).
  virtual uint32_t roundTripUs() const { return 0; }

  // What the transport chose for this link, as it reported it at connect time
  // (TCP: congestion control and socket buffers), for users and tests; empty
  // where there is nothing to tell.
  virtual std::map<std::string, std::string> details() const { return {}; }

  // Drops the connection at once (abort). Idempotent.
  virtual void close() = 0;
  // Whether a shrunk group may keep this link (its transport can fence it: TCP
  // with sealed records, still open); see TcpChannel::beginFence.
  virtual bool keepable() const { return false; }
  // The peer's rank in the group the link serves from now on (a shrink renumbers).
  virtual void renumber(int peer) { peer_ = peer; }

  // Payload and header bytes moved so far (statistics).
  uint64_t bytesSent() const { return bytesSent_; }
  uint64_t bytesReceived() const { return bytesReceived_; }

 protected:
  explicit Channel(int peer) : peer_(peer) {}
  int peer_;
  uint64_t bytesSent_ = 0;
  uint64_t bytesReceived_ = 0;
};

// The longest round trip (Channel::roundTripUs) of these links, null ones skipped; 0 where
// none is measured. `reportedUs` > 0 stands for it instead (tests: a rank that reports a long
// link on one machine).
inline uint32_t longestRoundTripUs(const std::vector<std::unique_ptr<Channel>>& channels,
                                   uint32_t reportedUs = 0) {
  if (reportedUs > 0) return reportedUs;
  uint32_t longest = 0;
  for (const auto& channel : channels) {
    if (channel && channel->roundTripUs() > longest) longest = channel->roundTripUs();
  }
  return longest;
}

}  // namespace ringdist
