#include "csrc/transport/shm/connect.h"

#include <unistd.h>

#include <algorithm>
#include <thread>

#include "csrc/common/error.h"
#include "csrc/transport/shm/channel.h"

namespace ringdist {
namespace shm {

namespace {

using Clock = std::chrono::steady_clock;

std::shared_ptr<Segment> createAndPublish(Rendezvous& rendezvous, int rank, int count,
                                          const std::string& nameKey,
                                          const MeshOptions& options) {
  auto segment = std::make_shared<Segment>(Segment::create(count, options.shmRingBytes));
  rendezvous.set(nameKey, std::vector<uint8_t>(segment->name().begin(), segment->name().end()));
  // Unlink as soon as every local rank has mapped it: from then on the
  // memory lives exactly as long as the mappings, crash or not.
  const auto deadline = Clock::now() + options.timeout;
  auto pause = std::chrono::microseconds(50);
  while (rendezvous.add(nameKey + "/mapped", 0) < count - 1) {
    if (Clock::now() > deadline) {
      throw TimeoutError(strCat("ringdist: Timed out after ", options.timeout.count(),
                                " ms: rank ", rank, " waits for its same-host peers to map ",
                                "shared memory"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
  segment->unlinkName();
  rendezvous.set(nameKey + "/unlinked", {1});
  return segment;
}

std::shared_ptr<Segment> mapPublished(Rendezvous& rendezvous, int rank, int count,
                                      const std::string& nameKey, const MeshOptions& options) {
  auto raw = rendezvous.get(nameKey, options.timeout);
  auto segment = std::make_shared<Segment>(Segment::open(std::string(raw.begin(), raw.end())));
  RINGDIST_CHECK(segment->localRanks() == count, "ringdist: rank ", rank,
                 " mapped a shared-memory segment for ", segment->localRanks(),
                 " ranks but expected ", count);
  rendezvous.add(nameKey + "/mapped", 1);
  // Return only once the name is gone, so nothing of ours is visible in
  // /dev/shm after init on any rank.
  rendezvous.get(nameKey + "/unlinked", options.timeout);
  return segment;
}

}  // namespace

void connectLocal(Rendezvous& rendezvous, int rank, const std::vector<int>& local,
                  const MeshOptions& options, std::vector<std::unique_ptr<Channel>>& channels) {
  const int leader = local.front();
  const int count = static_cast<int>(local.size());
  const int self = static_cast<int>(std::find(local.begin(), local.end(), rank) - local.begin());
  const std::string nameKey = strCat("ringdist/shm/", leader);
  std::shared_ptr<Segment> segment = rank == leader
      ? createAndPublish(rendezvous, rank, count, nameKey, options)
      : mapPublished(rendezvous, rank, count, nameKey, options);
  segment->bell(self)->pid = static_cast<int32_t>(::getpid());
  segment->bell(self)->startTime = processStartTime(::getpid());
  segment->bell(self)->cpu.store(-1);
  auto doorbell = std::make_shared<LocalDoorbell>(segment->bell(self));
  for (int i = 0; i < count; ++i) {
    if (i != self) {
      int peer = local[static_cast<size_t>(i)];
      channels[static_cast<size_t>(peer)] =
          std::make_unique<ShmChannel>(peer, segment, self, i, doorbell, options.link);
    }
  }
}

}  // namespace shm
}  // namespace ringdist
