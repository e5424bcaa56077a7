#include "csrc/collectives/p2p.h"

#include <algorithm>
#include <cstring>

#include "csrc/common/cpu.h"
#include "csrc/common/error.h"

namespace ringdist {

namespace {
// OpHeader::variant of a send: its payload is a DeviceMessage.
constexpr uint8_t kDeviceVariant = 1;
}  // namespace

PointToPoint::PointToPoint(Communicator& comm)
    : comm_(comm),
      mailboxes_(static_cast<size_t>(comm.size())),
      stuckAt_(static_cast<size_t>(comm.size()), UINT64_MAX) {}

void PointToPoint::send(const void* data, size_t bytes, DataType dtype, int peer, int tag,
                        Done done) {
  postHeader(peer, bytes, dtype, tag, 0);
  comm_.channel(peer).postSend(data, bytes, std::move(done));
}

void PointToPoint::sendDevice(const DeviceMessage* message, size_t bytes, DataType dtype, int peer,
                              int tag, Done done) {
  postHeader(peer, bytes, dtype, tag, kDeviceVariant);
  ++deviceSends_;
  comm_.channel(peer).postSend(message, sizeof(DeviceMessage), std::move(done));
}

void PointToPoint::postHeader(int peer, size_t bytes, DataType dtype, int tag, uint8_t variant) {
  OpHeader header = comm_.makeHeader(OpType::kSend, bytes, dtype, ReduceOp::kSum, -1);
  header.tag = tag;
  header.variant = variant;
  auto held = std::make_shared<OpHeader>(header);  // lives until it has left
  comm_.channel(peer).postSend(held.get(), sizeof(OpHeader), [held] {});
}

void PointToPoint::readHeader(int peer, bool ahead) {
  auto header = std::make_shared<OpHeader>();
  Channel& ch = comm_.channel(peer);
  auto read = [this, header, peer] { onHeader(peer, *header); };
  if (ahead) {
    ch.postRecvNext(header.get(), sizeof(OpHeader), std::move(read));
  } else {
    ch.postRecv(header.get(), sizeof(OpHeader), std::move(read));
  }
}

void PointToPoint::recv(void* data, size_t bytes, DataType dtype, int peer, int tag, Done done,
                        OnDevice onDevice) {
  Waiting w{data, bytes, dtype, tag, std::move(done), std::move(onDevice)};
  Mailbox& box = mailboxes_[static_cast<size_t>(peer)];
  for (auto it = box.unexpected.begin(); it != box.unexpected.end(); ++it) {
    Unexpected& message = **it;
    if (message.tag != tag || message.claim) {
      continue;
    }
    checkMatch(peer, w, message.bytes, message.dtype, message.device);
    if (message.arrived) {
      deliver(message, w, peer);
      box.unexpected.erase(it);
    } else {
      message.claim = std::make_unique<Waiting>(std::move(w));
    }
    return;  // a message already read: no header read of its own
  }
  box.waiting.push_back(std::move(w));
  readHeader(peer);
}

void PointToPoint::recvAny(void* data, size_t bytes, DataType dtype, int tag, DoneFrom done,
                           OnDevice onDevice) {
  anyWaiting_.push_back(AnyWaiting{data, bytes, dtype, tag, std::move(done), std::move(onDevice)});
  pollAny();
}

bool PointToPoint::pollAny() {
  bool matched = false;
  for (auto it = anyWaiting_.begin(); it != anyWaiting_.end();) {
    if (matchAny(*it)) {
      it = anyWaiting_.erase(it);
      matched = true;
    } else {
      ++it;
    }
  }
  // Wake the worker for bytes on idle links, except where the next message
  // was already found to be someone else's (it stays until they take it).
  for (int peer = 0; peer < comm_.size(); ++peer) {
    if (peer == comm_.rank()) continue;
    Channel& ch = comm_.channel(peer);
    comm_.setWatched(peer, !anyWaiting_.empty() && !ch.receiving() &&
                               stuckAt_[static_cast<size_t>(peer)] != ch.bytesReceived());
  }
  return matched;
}

bool PointToPoint::matchAny(AnyWaiting& any) {
  const int n = comm_.size();
  for (int i = 0; i < n - 1; ++i) {
    const int peer = (comm_.rank() + (anyNext_ + i - 1) % (n - 1) + 1) % n;
    Channel& ch = comm_.channel(peer);
    Mailbox& box = mailboxes_[static_cast<size_t>(peer)];
    const bool owed = std::any_of(box.waiting.begin(), box.waiting.end(),
                                  [&](const Waiting& w) { return w.tag == any.tag; });
    if (owed) {
      stuckAt_[static_cast<size_t>(peer)] = ch.bytesReceived();
      continue;
    }
    auto held = std::find_if(box.unexpected.begin(), box.unexpected.end(), [&](const auto& m) {
      return m->tag == any.tag && m->arrived && !m->claim;
    });
    if (held == box.unexpected.end() && ch.receiving()) {
      continue;  // the next bytes are owed to the receives queued there
    }
    auto done = [&any, peer] { return [fn = std::move(any.done), peer] { fn(peer); }; };
    OpHeader next;
    if (held != box.unexpected.end()) {
      Waiting w{any.data, any.bytes, any.dtype, any.tag, done(), std::move(any.onDevice)};
      checkMatch(peer, w, (*held)->bytes, (*held)->dtype, (*held)->device);
      deliver(**held, w, peer);
      box.unexpected.erase(held);
    } else if (!ch.peek(&next, sizeof(OpHeader))) {
      continue;  // not here yet
    } else if (isSendHeader(next) && next.tag == any.tag) {
      box.waiting.push_back(
          Waiting{any.data, any.bytes, any.dtype, any.tag, done(), std::move(any.onDevice)});
      readHeader(peer);
    } else {
      stuckAt_[static_cast<size_t>(peer)] = ch.bytesReceived();
      continue;
    }
    anyNext_ = anyNext_ % (n - 1) + 1;
    return true;
  }
  return false;
}

bool PointToPoint::isSendHeader(const OpHeader& header) {
  return header.magic == kOpMagic && header.type == static_cast<uint8_t>(OpType::kSend);
}

void PointToPoint::checkMatch(int peer, const Waiting& w, size_t bytes, DataType dtype,
                              bool device) const {
  RINGDIST_CHECK(bytes == w.bytes && dtype == w.dtype, "ringdist recv: rank ", comm_.rank(),
                 " expects ", w.bytes, " bytes of ", dataTypeName(w.dtype), " from rank ", peer,
                 " with tag ", w.tag, " but rank ", peer, " sent ", bytes, " bytes of ",
                 dataTypeName(dtype));
  RINGDIST_CHECK(!device || w.onDevice, "ringdist recv: rank ", comm_.rank(), " receives into host "
                 "memory from rank ", peer, " (tag ", w.tag, "), which sent GPU memory to be "
                 "taken on the GPU; receive into a tensor on the sender's device");
}

void PointToPoint::deliver(Unexpected& message, Waiting& w, int peer) {
  if (message.device) {
    w.onDevice(*reinterpret_cast<const DeviceMessage*>(message.payload.data()), peer);
  } else if (!message.payload.empty()) {
    copyBytes(w.data, message.payload.data(), message.payload.size());
  }
  w.done();
}

// Runs inside the link's progress, right after the header arrived and before
// anything else is read from that link.
void PointToPoint::onHeader(int peer, const OpHeader& header) {
  RINGDIST_CHECK(isSendHeader(header),
                 "ringdist recv: rank ", comm_.rank(), " expected a message from rank ", peer,
                 " but the next bytes on that link belong to a collective (",
                 opTypeName(static_cast<OpType>(header.type)),
                 "); the two ranks issued their operations in different orders");
  const auto dtype = static_cast<DataType>(header.dtype);
  RINGDIST_CHECK(header.dtype <= static_cast<uint8_t>(DataType::kBool), "ringdist recv: rank ",
                 comm_.rank(), " received a message with an invalid dtype from rank ", peer);
  Channel& ch = comm_.channel(peer);
  Mailbox& box = mailboxes_[static_cast<size_t>(peer)];
  auto match = std::find_if(box.waiting.begin(), box.waiting.end(),
                            [&](const Waiting& w) { return w.tag == header.tag; });
  const bool device = header.variant == kDeviceVariant;
  if (match != box.waiting.end()) {
    checkMatch(peer, *match, header.count, dtype, device);
    if (device) {
      auto message = std::make_shared<DeviceMessage>();
      ch.postRecvNext(message.get(), sizeof(DeviceMessage),
                      [message, peer, onDevice = std::move(match->onDevice),
                       done = std::move(match->done)] {
                        onDevice(*message, peer);
                        done();
                      });
    } else {
      ch.postRecvNext(match->data, match->bytes, std::move(match->done));
    }
    box.waiting.erase(match);
    return;
  }
  // The size comes from the wire: bounded before anything is allocated.
  const size_t limit = comm_.options().maxUnexpectedBytes;
  RINGDIST_CHECK(device || header.count <= limit, "ringdist recv: rank ", comm_.rank(),
                 " would have to buffer a ", header.count, "-byte message (tag ", header.tag,
                 ") from rank ", peer,
                 " that no receive matches yet; the limit is RINGDIST_MAX_UNEXPECTED_BYTES=",
                 limit);
  auto message = std::make_shared<Unexpected>();
  message->tag = header.tag;
  message->dtype = dtype;
  message->bytes = header.count;
  message->device = device;
  message->payload.resize(device ? sizeof(DeviceMessage) : header.count);
  box.unexpected.push_back(message);
  ch.postRecvNext(message->payload.data(), message->payload.size(), [this, peer, message] {
    message->arrived = true;
    // The header read this message took was a waiting receive's: read the
    // next header for it, ahead of anything posted since (a collective's
    // reads come after the messages its receives wait for).
    if (!mailboxes_[static_cast<size_t>(peer)].waiting.empty()) readHeader(peer, /*ahead=*/true);
    if (message->claim) {
      deliver(*message, *message->claim, peer);
      auto& list = mailboxes_[static_cast<size_t>(peer)].unexpected;
      list.erase(std::find(list.begin(), list.end(), message));
    }
  });
}

}  // namespace ringdist
