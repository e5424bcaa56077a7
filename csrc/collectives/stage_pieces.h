#pragma once

// How a StageGate (collectives.h) moves its buffer in pieces: the one rule
// the CUDA pinned twin (gpu/stage/device_stage.cc's PipelinedTwin) and its CPU
// rehearsal (backend/testing_gated.cc) share. The plan's ranges are grouped
// into pieces of up to `pieceBytes` (a range joins one of the last few pieces
// when it continues it, so ranges the ring reads side by side from two chunks
// grow two pieces); pieces are issued in the order first needed, kAhead
// beyond the last one needed. Final ranges are gathered the same way into
// runs, each flushed once it holds a piece's worth, the rest at finish().

#include <cstddef>
#include <map>
#include <utility>
#include <vector>

namespace ringdist {

class StagePieces {
 public:
  static constexpr size_t kAhead = 4;    // pieces issued beyond the last one needed
  static constexpr size_t kGrowing = 8;  // pieces (runs) being gathered at once

  explicit StagePieces(size_t pieceBytes) : pieceBytes_(pieceBytes) {}

  // The plan (StageGate::plan); then issues the first pieces.
  template <typename Issue>
  void plan(const std::vector<std::pair<size_t, size_t>>& ranges, Issue issue) {
    for (const auto& [offset, length] : ranges) pieceOf_[offset] = gather(pieces_, offset, length);
    issueThrough(kAhead, issue);
  }

  // The piece holding the planned range at `offset`, issued (with kAhead
  // more) if it was not yet; issue(offset, bytes) is called per new piece.
  template <typename Issue>
  size_t need(size_t offset, Issue issue) {
    const size_t piece = pieceOf_.at(offset);
    issueThrough(piece + kAhead, issue);
    return piece;
  }

  // A final range; flush(offset, bytes) gets each run once it is full.
  template <typename Flush>
  void produced(size_t offset, size_t length, Flush flush) {
    const size_t run = gather(runs_, offset, length);
    if (runs_[run].second >= pieceBytes_) spend(run, flush);
  }

  // Every run not yet flushed.
  template <typename Flush>
  void finish(Flush flush) {
    for (size_t run = 0; run < runs_.size(); ++run) spend(run, flush);
  }

  size_t pieces() const { return pieces_.size(); }
  size_t issued() const { return issued_; }

 private:
  using Ranges = std::vector<std::pair<size_t, size_t>>;  // (offset, bytes)

  // Appends [offset, offset + length) to one of the last kGrowing entries it
  // continues, if that stays within a piece, else as a new entry; its index.
  size_t gather(Ranges& entries, size_t offset, size_t length) const {
    const size_t from = entries.size() > kGrowing ? entries.size() - kGrowing : 0;
    for (size_t i = entries.size(); i-- > from;) {
      auto& [begin, bytes] = entries[i];
      if (bytes > 0 && begin + bytes == offset && bytes + length <= pieceBytes_) {
        bytes += length;
        return i;
      }
    }
    entries.emplace_back(offset, length);
    return entries.size() - 1;
  }

  template <typename Issue>
  void issueThrough(size_t last, Issue issue) {
    for (; issued_ <= last && issued_ < pieces_.size(); ++issued_) {
      issue(pieces_[issued_].first, pieces_[issued_].second);
    }
  }

  template <typename Flush>
  void spend(size_t run, Flush flush) {
    auto& [offset, bytes] = runs_[run];
    if (bytes == 0) return;
    flush(offset, bytes);
    bytes = 0;  // spent: never continued again
  }

  const size_t pieceBytes_;
  Ranges pieces_;
  std::map<size_t, size_t> pieceOf_;  // planned range's offset -> its piece
  size_t issued_ = 0;
  Ranges runs_;
};

}  // namespace ringdist
