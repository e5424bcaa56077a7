// Debug check (RINGDIST_CHECK_RESULTS=1): after an operation whose result
// must be identical on every rank, all ranks allgather a CRC32C of their
// result and compare, so silent divergence (memory corruption, a bug) is
// reported with the ranks that disagree instead of training on garbage.
#include <map>
#include <vector>

#include "csrc/collectives/collectives.h"
#include "csrc/common/crc32c.h"
#include "csrc/common/error.h"

namespace ringdist {

namespace {
// Testing (CollectiveOptions::corruptResultAt = k): flip one bit of this
// process's k-th checked result, as a silent memory error would.
bool corruptThisResult(uint64_t target) {
  static uint64_t count = 0;
  return target > 0 && ++count == target;
}
}  // namespace

void checkIdenticalResults(Communicator& comm, void* data, size_t bytes, const char* opName) {
  if (corruptThisResult(comm.options().corruptResultAt) && bytes > 0) {
    static_cast<unsigned char*>(data)[bytes / 2] ^= 1;
  }
  const int n = comm.size();
  if (n == 1) {
    return;
  }
  uint64_t mine = (static_cast<uint64_t>(crc32c(data, bytes)) << 32) | (bytes & 0xffffffffu);
  std::vector<uint64_t> all(static_cast<size_t>(n));
  std::vector<void*> outputs(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    outputs[static_cast<size_t>(r)] = &all[static_cast<size_t>(r)];
  }
  allgather(comm, &mine, outputs.data(), 1, DataType::kInt64);
  std::map<uint64_t, std::vector<int>> groups;
  for (int r = 0; r < n; ++r) {
    groups[all[static_cast<size_t>(r)]].push_back(r);
  }
  if (groups.size() == 1) {
    return;
  }
  std::string detail;
  for (const auto& [hash, ranks] : groups) {
    detail += detail.empty() ? "" : "; ";
    detail += "ranks";
    for (int r : ranks) {
      detail += strCat(" ", r);
    }
    detail += strCat(" have crc32c ", hash >> 32);
  }
  RINGDIST_FAIL("ringdist ", opName, ": rank ", comm.rank(),
                ": results differ across ranks (RINGDIST_CHECK_RESULTS): ", detail);
}

}  // namespace ringdist
