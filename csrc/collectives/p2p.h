#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "csrc/collectives/communicator.h"
#include "csrc/gpu/platform/peer_memory.h"

namespace ringdist {

// Point-to-point sends and receives with tag matching.
//
// A message is an OpHeader (type send, tag, byte count, dtype) followed by
// its payload, on the ordered link between two ranks. Every receive that
// must wait queues exactly one header read on the link when it is issued, so
// point-to-point traffic keeps its place relative to collectives. When a
// header arrives it is matched, by tag, to the oldest receive still waiting
// for that tag; the payload then goes straight into that receive's buffer.
// A message whose receive has not been issued yet (tags posted in another
// order than sent) is held in an unexpected-message buffer until it is; the
// header read it took belonged to a waiting receive, so another is queued at
// once, ahead of anything posted since, and a receive matched from the buffer
// queues none. Header reads outstanding always equal receives waiting.
//
// A receive from any source cannot queue a header read (on which link?). It
// waits in its own list, and pollAny() looks at every link: a held message
// with its tag, or, on a link with no receive queued, a send with its tag
// peeked at the head of the stream, becomes an ordinary receive on that
// link. A link where an earlier receive waits for the same tag is passed
// over: its next message of that tag is owed to someone else.
//
// A device message (ranks sharing a GPU, gpu/same_gpu.h) travels the same way,
// matched by the same rules: its header names the tensor's size and dtype,
// its payload is the DeviceMessage telling the receiver where the data is.
// A receive that can take one (onDevice) gets it instead of bytes; the sender
// picks the form per message, so every receive of CUDA memory takes both.
class PointToPoint {
 public:
  using Done = std::function<void()>;
  using DoneFrom = std::function<void(int source)>;
  // Runs before the receive's done, on the worker thread.
  using OnDevice = std::function<void(const DeviceMessage& message, int source)>;

  explicit PointToPoint(Communicator& comm);

  // Both only queue work and return; `done` runs on the worker thread once
  // the bytes have left / arrived.
  void send(const void* data, size_t bytes, DataType dtype, int peer, int tag, Done done);
  // `bytes` of `dtype` handed over on the device (message stays valid until done).
  void sendDevice(const DeviceMessage* message, size_t bytes, DataType dtype, int peer, int tag,
                  Done done);
  void recv(void* data, size_t bytes, DataType dtype, int peer, int tag, Done done,
            OnDevice onDevice = nullptr);
  void recvAny(void* data, size_t bytes, DataType dtype, int tag, DoneFrom done,
               OnDevice onDevice = nullptr);
  // Matches pending any-source receives to links; true if one matched. The
  // worker calls it between operations (it may throw like a receive).
  bool pollAny();
  bool anyPending() const { return !anyWaiting_.empty(); }
  // Messages sent GPU to GPU (sendDevice).
  uint64_t deviceSends() const { return deviceSends_; }

 private:
  struct Waiting {
    void* data;
    size_t bytes;
    DataType dtype;
    int tag;
    Done done;
    OnDevice onDevice;
  };
  struct Unexpected {
    int tag;
    DataType dtype;
    size_t bytes;  // the message's (a device message's payload is its DeviceMessage)
    bool device;
    std::vector<char> payload;
    bool arrived = false;
    std::unique_ptr<Waiting> claim;  // a receive matched while still arriving
  };
  struct Mailbox {
    std::deque<Waiting> waiting;
    std::deque<std::shared_ptr<Unexpected>> unexpected;
  };

  struct AnyWaiting {
    void* data;
    size_t bytes;
    DataType dtype;
    int tag;
    DoneFrom done;
    OnDevice onDevice;
  };

  // ahead: from inside a receive callback, ahead of every read posted.
  void readHeader(int peer, bool ahead = false);
  void postHeader(int peer, size_t bytes, DataType dtype, int tag, uint8_t variant);
  static bool isSendHeader(const OpHeader& header);
  bool matchAny(AnyWaiting& w);
  void onHeader(int peer, const OpHeader& header);
  void checkMatch(int peer, const Waiting& w, size_t bytes, DataType dtype, bool device) const;
  static void deliver(Unexpected& message, Waiting& w, int peer);

  Communicator& comm_;
  std::vector<Mailbox> mailboxes_;
  std::deque<AnyWaiting> anyWaiting_;
  // By peer: bytesReceived() of a link whose next message an any-source
  // receive looked at and left (another tag, a collective, or owed).
  std::vector<uint64_t> stuckAt_;
  int anyNext_ = 1;
  uint64_t deviceSends_ = 0;  // ring offset of the first peer pollAny() looks at (fairness)
};

}  // namespace ringdist
