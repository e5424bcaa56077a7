#pragma once

#include <cstddef>
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
class PointToPoint {
 public:
  using Done = std::function<void()>;

  explicit PointToPoint(Communicator& comm);

  // Both only queue work and return; `done` runs on the worker thread once
  // the bytes have left / arrived.
  void send(const void* data, size_t bytes, DataType dtype, int peer, int tag, Done done);
  void recv(void* data, size_t bytes, DataType dtype, int peer, int tag, Done done);

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

  void onHeader(int peer, const OpHeader& header);
  void checkMatch(int peer, const Waiting& w, size_t bytes, DataType dtype) const;
  static void deliver(Unexpected& message, Waiting& w);

  Communicator& comm_;
  std::vector<Mailbox> mailboxes_;
};

}  // namespace ringdist
