#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "csrc/collectives/communicator.h"

namespace ringdist {

// Point-to-point sends and receives with tag matching.
//
// A message is an OpHeader (type send, tag, byte count, dtype) followed by
// its payload, on the ordered link between two ranks. Every receive queues
// exactly one header read on the link at the moment it is issued, so
// point-to-point traffic keeps its place relative to collectives. When a
// header arrives it is matched, by tag, to the oldest receive still waiting
// for that tag; the payload then goes straight into that receive's buffer.
// A message whose receive has not been issued yet (tags posted in another
// order than sent) is held in an unexpected-message buffer until it is.
//
// A receive from any source cannot queue a header read (on which link?). It
// waits in its own list, and pollAny() looks at every link with no receive
// queued: a held message with its tag, or a send with its tag peeked at the
// head of the stream, becomes an ordinary receive on that link. A link whose
// receives are queued, or where an earlier receive waits for the same tag,
// is passed over: its next message of that tag is owed to someone else.
class PointToPoint {
 public:
  using Done = std::function<void()>;
  using DoneFrom = std::function<void(int source)>;

  explicit PointToPoint(Communicator& comm);

  // Both only queue work and return; `done` runs on the worker thread once
  // the bytes have left / arrived.
  void send(const void* data, size_t bytes, DataType dtype, int peer, int tag, Done done);
  void recv(void* data, size_t bytes, DataType dtype, int peer, int tag, Done done);
  void recvAny(void* data, size_t bytes, DataType dtype, int tag, DoneFrom done);
  // Matches pending any-source receives to links; true if one matched. The
  // worker calls it between operations (it may throw like a receive).
  bool pollAny();
  bool anyPending() const { return !anyWaiting_.empty(); }

 private:
  struct Waiting {
    void* data;
    size_t bytes;
    DataType dtype;
    int tag;
    Done done;
  };
  struct Unexpected {
    int tag;
    DataType dtype;
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
  };

  void readHeader(int peer);
  static bool isSendHeader(const OpHeader& header);
  bool matchAny(AnyWaiting& w);
  void onHeader(int peer, const OpHeader& header);
  void checkMatch(int peer, const Waiting& w, size_t bytes, DataType dtype) const;
  static void deliver(Unexpected& message, Waiting& w);

  Communicator& comm_;
  std::vector<Mailbox> mailboxes_;
  std::deque<AnyWaiting> anyWaiting_;
  // By peer: bytesReceived() of a link whose next message an any-source
  // receive looked at and left (another tag, a collective, or owed).
  std::vector<uint64_t> stuckAt_;
  int anyNext_ = 1;  // ring offset of the first peer pollAny() looks at (fairness)
};

}  // namespace ringdist
