// The C++ API's groups (include/torch_ringdist/ringdist.h): the backend with
// the bind-address rules of Python's registration, its ProcessGroup, and
// ringdist's own calls on either.
#include "torch_ringdist/ringdist.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/headeronly/version.h>

#include <cstdlib>

#include "csrc/backend/environment.h"
#include "csrc/backend/process_group.h"
#include "csrc/transport/mesh.h"

namespace torch_ringdist {

namespace {

// Launcher variables only (MASTER_ADDR): RINGDIST_* are read in
// csrc/backend/environment.cc.
std::string envOr(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : fallback;
}

// The host of the TCPStore behind (possibly nested) PrefixStores; "" for
// other stores.
std::string storeHost(const c10::intrusive_ptr<c10d::Store>& store) {
  c10d::Store* current = store.get();
  for (int depth = 0; current != nullptr && depth < 16; ++depth) {
    if (auto* tcp = dynamic_cast<c10d::TCPStore*>(current)) {
      return tcp->getHost();
    }
    auto* prefix = dynamic_cast<c10d::PrefixStore*>(current);
    if (prefix == nullptr) {
      break;
    }
    current = prefix->getUnderlyingStore().get();
  }
  return "";
}

// RINGDIST_SOCKET_IFNAME's address, else the one that routes to the store's
// host; throws ringdist::Error.
std::string chooseAddress(const c10::intrusive_ptr<c10d::Store>& store) {
  std::string host = store ? storeHost(store) : "";
  if (host.empty()) {
    host = envOr("MASTER_ADDR", "");
  }
  return ringdist::chooseListenAddress(ringdist::socketInterfaceFromEnvironment(), host);
}

ringdist::ProcessGroupRingdist& asRingdist(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  return ringdist::ringdistOf(group, "torch_ringdist");
}

}  // namespace

std::string listenAddress(const c10::intrusive_ptr<c10d::Store>& store) {
  try {
    return chooseAddress(store);
  } catch (const ringdist::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

c10::intrusive_ptr<c10d::Backend> createBackend(const c10::intrusive_ptr<c10d::Store>& store,
                                                int rank, int size,
                                                std::chrono::milliseconds timeout) {
  TORCH_CHECK(store, "ringdist init: rank ", rank, ": the store is null");
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "ringdist init: rank ", rank,
              " is not in a group of ", size, " ranks");
  TORCH_CHECK(timeout.count() > 0, "ringdist init: rank ", rank, ": the timeout must be > 0, got ",
              timeout.count(), " ms");
  std::string bindIp;
  try {
    bindIp = chooseAddress(store);
  } catch (const ringdist::Error& e) {
    C10_THROW_ERROR(DistBackendError, c10::str("ringdist init: rank ", rank, ": ", e.what()));
  }
  return ringdist::createBackend(store, rank, size, timeout, bindIp);
}

c10::intrusive_ptr<c10d::ProcessGroup> createProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout) {
  auto backend = createBackend(store, rank, size, timeout);
  // As init_process_group makes a group of a third-party backend: CUSTOM, on
  // every device the backend serves.
  const auto custom = c10d::ProcessGroup::BackendType::CUSTOM;
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  group->setDefaultBackend(custom);
  group->setBackend(c10::DeviceType::CPU, custom, backend);
  if (cudaCompiled()) {
    group->setBackend(c10::DeviceType::CUDA, custom, backend);
  }
  return group;
}

void shutdown(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  ringdistBackend(group)->shutdown();
}

c10::intrusive_ptr<c10d::Backend> ringdistBackend(
    const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  asRingdist(group);  // raises for a group of another backend
  return group->getBackend(c10::DeviceType::CPU);
}

c10::intrusive_ptr<c10d::Work> allreduceCompressed(
    const c10::intrusive_ptr<c10d::ProcessGroup>& group, at::Tensor& tensor,
    const std::string& codec, bool average, const at::Tensor& residual) {
  return asRingdist(group).allreduceCompressed(tensor, codec, average,
                                               std::chrono::milliseconds(0), residual);
}

std::map<std::string, OpStats> stats(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  std::map<std::string, OpStats> out;
  for (const auto& [name, s] : asRingdist(group).stats()) {
    OpStats& o = out[name];
    o.calls = s.calls;
    o.bytesSent = s.bytesSent;
    o.bytesReceived = s.bytesReceived;
    o.bytesSentAcrossHosts = s.bytesSentAcrossHosts;
    o.payloadBytes = s.payloadBytes;
    o.seconds = s.seconds;
    o.inlineCalls = s.inlineCalls;
    o.singleCopyBytes = s.singleCopyBytes;
  }
  return out;
}

void resetStats(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  asRingdist(group).resetStats();
}

bool cudaCompiled() { return ringdist::kCudaCompiled; }

std::string builtWithTorch() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

}  // namespace torch_ringdist
