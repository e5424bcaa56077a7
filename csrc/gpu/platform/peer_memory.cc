#include "csrc/gpu/platform/peer_memory.h"

#include <algorithm>
#include <cstring>

namespace ringdist {

PeerMemoryCache::PeerMemoryCache(PeerMemoryOpener& opener, size_t capacity)
    : opener_(opener), capacity_(capacity) {}

PeerMemoryCache::~PeerMemoryCache() {
  for (auto& entry : entries_) opener_.close(entry.base);
}

char* PeerMemoryCache::map(const MemoryRecord& record, uint32_t seq) {
  auto same = [&](const Entry& entry) {
    return std::memcmp(entry.handle.data(), record.handle, sizeof(record.handle)) == 0;
  };
  auto it = std::find_if(entries_.begin(), entries_.end(), same);
  if (it == entries_.end()) {
    Entry entry{};
    std::memcpy(entry.handle.data(), record.handle, sizeof(record.handle));
    entry.base = opener_.open(record);
    ++opens_;
    entries_.push_front(entry);
  } else if (it != entries_.begin()) {
    entries_.splice(entries_.begin(), entries_, it);
  }
  entries_.front().lastSeq = seq;
  return static_cast<char*>(entries_.front().base) + record.offset;
}

void PeerMemoryCache::trim(const std::function<bool(uint32_t)>& finished) {
  while (entries_.size() > capacity_ && finished(entries_.back().lastSeq)) {
    opener_.close(entries_.back().base);
    entries_.pop_back();
  }
}

}  // namespace ringdist
