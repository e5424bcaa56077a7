#include "csrc/collectives/board.h"

#include <atomic>
#include <cstring>
#include <utility>

#include "csrc/collectives/communicator.h"
#include "csrc/collectives/waiter.h"
#include "csrc/common/error.h"
#include "csrc/common/types.h"

namespace ringdist {

namespace {

// A rank's board area (Board::area): written by its owner only.
struct BoardArea {
  alignas(64) std::atomic<uint64_t> published;  // seq of the last collective published, 0 at first
  struct alignas(64) Entry {
    OpHeader header;
    alignas(64) char data[kBoardDataBytes];
  } entry[2];  // by seq parity: a peer may still read the previous one
};
static_assert(sizeof(BoardArea) <= Board::kAreaBytes, "a board area holds two entries");

BoardArea* areaOf(Board& board, int rank) { return reinterpret_cast<BoardArea*>(board.area(rank)); }

}  // namespace

BoardProtocol::BoardProtocol(Communicator& comm, Waiter& waiter, std::shared_ptr<Board> board)
    : comm_(comm), waiter_(waiter), board_(std::move(board)) {}

const char* BoardProtocol::publish(const OpHeader& header, const void* data, size_t bytes) {
  RINGDIST_CHECK(bytes <= kBoardDataBytes, "ringdist: ", bytes, " bytes do not fit the board");
  const int rank = comm_.rank();
  const int size = comm_.size();
  // This entry last held seq - 2, which a peer reads until it starts seq - 1.
  for (int peer = 0; peer < size && header.seq > 1; ++peer) {
    if (peer != rank) waitForPublished(peer, header.seq - 1);
  }
  BoardArea* mine = areaOf(*board_, rank);
  BoardArea::Entry& entry = mine->entry[header.seq & 1];
  entry.header = header;
  if (bytes > 0) std::memcpy(entry.data, data, bytes);
  mine->published.store(header.seq, std::memory_order_release);
  bytesPublished_ += bytes;
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) board_->wake(peer);
  }
  return entry.data;
}

const char* BoardProtocol::published(int peer, const OpHeader& mine) {
  waitForPublished(peer, mine.seq);
  // Its entry for our seq: it cannot overwrite it before we publish seq + 1.
  const BoardArea::Entry& entry = areaOf(*board_, peer)->entry[mine.seq & 1];
  comm_.checkHeader(mine, entry.header, peer);
  bytesRead_ += mine.count * elementSize(static_cast<DataType>(mine.dtype));
  return entry.data;
}

OpHeader BoardProtocol::lastPublished(int peer) const {
  const BoardArea* area = areaOf(*board_, peer);
  const uint64_t seq = area->published.load(std::memory_order_acquire);
  // That entry stays until we publish seq: it is the one after ours, or we are done.
  return seq == 0 ? OpHeader{} : area->entry[seq & 1].header;
}

void BoardProtocol::waitForPublished(int peer, uint64_t seq) {
  const BoardArea* area = areaOf(*board_, peer);
  auto ready = [&] { return area->published.load(std::memory_order_acquire) >= seq; };
  if (ready()) return;
  waitsFor_ = peer;  // named if the wait times out
  struct Clear {
    int& peer;
    ~Clear() { peer = -1; }
  } clear{waitsFor_};
  waiter_.waitForPeer(comm_.channel(peer), comm_.deadline(), ready,
                      [&] { comm_.throwIfStopped(); });
}

}  // namespace ringdist
