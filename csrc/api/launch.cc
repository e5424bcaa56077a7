// The launch environment (include/torch_ringdist/ringdist.h): which launcher
// started this process, and the store its ranks meet through.
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cerrno>
#include <cstdlib>
#include <limits>

#include "torch_ringdist/ringdist.h"

namespace torch_ringdist {

namespace {

constexpr int kDefaultMasterPort = 29500;  // torchrun's default

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return (value != nullptr && *value != '\0') ? value : nullptr;
}

int envInt(const char* name, int minimum, int maximum) {
  const char* text = env(name);
  TORCH_CHECK(text != nullptr, "torch_ringdist launch: ", name, " is not set");
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  TORCH_CHECK(errno == 0 && end != text && *end == '\0' && value >= minimum && value <= maximum,
              "torch_ringdist launch: ", name, "='", text, "' is not an integer in [", minimum, ", ",
              maximum, "]");
  return static_cast<int>(value);
}

int envIntOr(const char* name, int fallback, int minimum, int maximum) {
  return env(name) != nullptr ? envInt(name, minimum, maximum) : fallback;
}

constexpr int kMaxInt = std::numeric_limits<int>::max();

// MASTER_ADDR and MASTER_PORT; for ranks that are all on this host (an
// mpirun without them) loopback and torchrun's default port. One rank meets
// no one: none needed.
void readMaster(Launch& launch, bool allLocal) {
  if (launch.size == 1) {
    return;
  }
  const char* addr = env("MASTER_ADDR");
  TORCH_CHECK(addr != nullptr || allLocal, "torch_ringdist launch (", launch.launcher,
              "): MASTER_ADDR is not set: set MASTER_ADDR and MASTER_PORT to the host and port "
              "where rank 0 serves the store (mpirun: -x MASTER_ADDR=<host> -x MASTER_PORT=<port>)");
  launch.masterAddr = addr != nullptr ? addr : "127.0.0.1";
  launch.masterPort = allLocal ? envIntOr("MASTER_PORT", kDefaultMasterPort, 1, 65535)
                               : envInt("MASTER_PORT", 1, 65535);
}

// The variables an MPI launcher sets: Open MPI's, or MPICH's and Intel MPI's.
struct MpiVariables {
  const char* size;
  const char* rank;
  const char* localRank;
  const char* localSize;
};

void readMpi(Launch& launch, const MpiVariables& names) {
  launch.launcher = "mpirun";
  launch.size = envInt(names.size, 1, kMaxInt);
  launch.rank = envInt(names.rank, 0, launch.size - 1);
  launch.localRank = envIntOr(names.localRank, -1, 0, launch.size - 1);
  readMaster(launch, envIntOr(names.localSize, 0, 0, kMaxInt) == launch.size);
}

}  // namespace

Launch launchFromEnvironment() {
  Launch launch;
  if (env("TORCHELASTIC_RUN_ID") != nullptr || env("TORCHELASTIC_USE_AGENT_STORE") != nullptr) {
    launch.launcher = "torchrun";
    launch.size = envInt("WORLD_SIZE", 1, kMaxInt);
    launch.rank = envInt("RANK", 0, launch.size - 1);
    launch.localRank = envInt("LOCAL_RANK", 0, launch.size - 1);
    readMaster(launch, false);
    const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
    launch.agentStore = agent != nullptr && std::string(agent) == "True";
    if (launch.agentStore) {  // as torch's env:// rendezvous
      launch.storePrefix = "/worker/attempt_" +
          std::to_string(envIntOr("TORCHELASTIC_RESTART_COUNT", 0, 0, kMaxInt));
    }
  } else if (env("RANK") != nullptr || env("WORLD_SIZE") != nullptr) {
    launch.launcher = "env";
    launch.size = envInt("WORLD_SIZE", 1, kMaxInt);
    launch.rank = envInt("RANK", 0, launch.size - 1);
    launch.localRank = envIntOr("LOCAL_RANK", -1, 0, launch.size - 1);
    readMaster(launch, false);
  } else if (env("OMPI_COMM_WORLD_SIZE") != nullptr) {
    readMpi(launch, {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                     "OMPI_COMM_WORLD_LOCAL_SIZE"});
  } else if (env("PMI_SIZE") != nullptr) {
    readMpi(launch, {"PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"});
  }
  return launch;
}

c10::intrusive_ptr<c10d::Store> storeFor(const Launch& launch, std::chrono::milliseconds timeout) {
  if (launch.size == 1) {  // no one to meet
    return c10::make_intrusive<c10d::HashStore>();
  }
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(launch.masterPort);
  options.isServer = !launch.agentStore && launch.rank == 0;
  options.numWorkers = launch.size;
  options.waitWorkers = false;  // the group's connect waits for every rank, bounded
  options.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store =
      c10::make_intrusive<c10d::TCPStore>(launch.masterAddr, options);
  if (!launch.storePrefix.empty()) {
    store = c10::make_intrusive<c10d::PrefixStore>(launch.storePrefix, store);
  }
  return store;
}

c10::intrusive_ptr<c10d::ProcessGroup> init(std::chrono::milliseconds timeout) {
  const Launch launch = launchFromEnvironment();
  return createProcessGroup(storeFor(launch, timeout), launch.rank, launch.size, timeout);
}

}  // namespace torch_ringdist
