#include "csrc/backend/environment.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "csrc/common/error.h"

namespace ringdist {

namespace {

std::string envString(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return (value == nullptr || *value == '\0') ? fallback : std::string(value);
}

// An integer with an optional K/M/G suffix (binary units) for byte sizes.
int64_t envInt(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    return fallback;
  }
  char* end = nullptr;
  errno = 0;
  long long parsed = std::strtoll(value, &end, 0);
  int64_t scale = 1;
  if (end != nullptr && (*end == 'k' || *end == 'K')) { scale = 1 << 10; ++end; }
  else if (end != nullptr && (*end == 'm' || *end == 'M')) { scale = 1 << 20; ++end; }
  else if (end != nullptr && (*end == 'g' || *end == 'G')) { scale = 1 << 30; ++end; }
  RINGDIST_CHECK(errno == 0 && end != value && *end == '\0',
                 "ringdist: environment variable ", name, "='", value, "' is not an integer");
  return static_cast<int64_t>(parsed) * scale;
}

bool envFlag(const char* name, bool fallback) { return envInt(name, fallback ? 1 : 0) != 0; }

size_t envBytes(const char* name, size_t fallback, int64_t minimum) {
  int64_t value = envInt(name, static_cast<int64_t>(fallback));
  RINGDIST_CHECK(value >= minimum, "ringdist: ", name, " must be >= ", minimum, ", got ", value);
  return static_cast<size_t>(value);
}

SingleCopyMode singleCopyMode(size_t singleCopyBytes) {
  std::string name = envString("RINGDIST_SINGLE_COPY", "auto");
  SingleCopyMode mode = SingleCopyMode::kAuto;
  RINGDIST_CHECK(singleCopyModeFromName(name, &mode),
                 "ringdist: RINGDIST_SINGLE_COPY must be auto, 1 or 0, got '", name, "'");
  return singleCopyBytes == 0 ? SingleCopyMode::kOff : mode;
}

RouteMode routeMode() {
  const std::string name = envString("RINGDIST_ROUTE", "auto");
  RINGDIST_CHECK(name == "auto" || name == "ring" || name == "direct" ||
                     name == "halving-doubling" || name == "pair",
                 "ringdist: RINGDIST_ROUTE must be auto, ring, direct, halving-doubling or pair, "
                 "got '", name, "'");
  return name == "ring"               ? RouteMode::kRing
         : name == "direct"           ? RouteMode::kDirect
         : name == "halving-doubling" ? RouteMode::kHalvingDoubling
         : name == "pair"             ? RouteMode::kPair
                                      : RouteMode::kAuto;
}

TransportPolicy transportPolicy() {
  std::string name = envString("RINGDIST_TRANSPORT", "auto");
  TransportPolicy policy = TransportPolicy::kAuto;
  RINGDIST_CHECK(transportPolicyFromName(name, &policy),
                 "ringdist: RINGDIST_TRANSPORT must be auto, tcp or shm, got '", name, "'");
  return policy;
}

// RINGDIST_HOST_ID="a,b,a,b" assigns ranks to hosts by hand (rank r takes
// entry r): tests use it to build multi-host topologies on one machine.
std::string hostLabel(int rank, int size) {
  std::string assigned = envString("RINGDIST_HOST_ID", "");
  if (assigned.empty()) {
    return "";
  }
  std::vector<std::string> entries;
  size_t begin = 0;
  for (size_t end; (end = assigned.find(',', begin)) != std::string::npos; begin = end + 1) {
    entries.push_back(assigned.substr(begin, end - begin));
  }
  entries.push_back(assigned.substr(begin));
  RINGDIST_CHECK(static_cast<int>(entries.size()) == size, "ringdist: RINGDIST_HOST_ID has ",
                 entries.size(), " entries but the group has ", size, " ranks");
  return entries[static_cast<size_t>(rank)];
}

// The user's secret: RINGDIST_SECRET's bytes, or RINGDIST_SECRET_FILE's
// content without its trailing line break; empty when neither is set.
std::vector<uint8_t> userSecret() {
  const std::string inline_ = envString("RINGDIST_SECRET", "");
  const std::string path = envString("RINGDIST_SECRET_FILE", "");
  RINGDIST_CHECK(inline_.empty() || path.empty(),
                 "ringdist: set RINGDIST_SECRET or RINGDIST_SECRET_FILE, not both");
  std::string secret = inline_;
  if (!path.empty()) {
    std::ifstream file(path, std::ios::binary);
    RINGDIST_CHECK(file.good(), "ringdist: cannot read RINGDIST_SECRET_FILE '", path,
                   "': ", std::strerror(errno));
    secret.assign(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) {
      secret.pop_back();
    }
  }
  RINGDIST_CHECK(path.empty() || !secret.empty(), "ringdist: RINGDIST_SECRET_FILE '", path,
                 "' is empty");
  RINGDIST_CHECK(secret.empty() || secret.size() >= kMinSecretBytes,
                 "ringdist: the secret of ", path.empty() ? "RINGDIST_SECRET" : "RINGDIST_SECRET_FILE",
                 " has ", secret.size(), " bytes; it needs at least ", kMinSecretBytes,
                 " (e.g. the output of `openssl rand -hex 32`)");
  return std::vector<uint8_t>(secret.begin(), secret.end());
}

}  // namespace

Options optionsFromEnvironment(int rank, int size, std::chrono::milliseconds timeout,
                               const std::string& bindIp) {
  Options o;
  o.mesh.bindIp = bindIp;
  o.mesh.timeout = timeout;
  o.mesh.transport = transportPolicy();
  o.mesh.shmRingBytes = envBytes("RINGDIST_SHM_RING_BYTES", kDefaultShmRingBytes, 4096);
  o.mesh.hostLabel = hostLabel(rank, size);
  o.mesh.link.checksums = envFlag("RINGDIST_CRC", false);
  o.mesh.tcp.congestion = envString("RINGDIST_TCP_CONGESTION", kDefaultTcpCongestion);
  o.mesh.tcp.bufferBytes = envBytes("RINGDIST_TCP_BUFFER_BYTES", kDefaultTcpBufferBytes, 0);
  RINGDIST_CHECK(o.mesh.tcp.bufferBytes <= (1u << 30),
                 "ringdist: RINGDIST_TCP_BUFFER_BYTES must be <= 1G, got ", o.mesh.tcp.bufferBytes);
  o.mesh.tcp.lanes = static_cast<int>(envInt("RINGDIST_TCP_LANES", kDefaultTcpLanes));
  RINGDIST_CHECK(o.mesh.tcp.lanes >= 1 && o.mesh.tcp.lanes <= kMaxTcpLanes,
                 "ringdist: RINGDIST_TCP_LANES must be 1..", kMaxTcpLanes, ", got ", o.mesh.tcp.lanes);
  o.mesh.security.encrypt = envFlag("RINGDIST_TCP_ENCRYPT", true);
  o.mesh.security.secret = userSecret();

  o.collectives.segmentBytes = envBytes("RINGDIST_SEGMENT_BYTES", kDefaultSegmentBytes, 1);
  o.collectives.smallAllreduceBytes =
      envBytes("RINGDIST_SMALL_ALLREDUCE_BYTES", kDefaultSmallAllreduceBytes, 0);
  o.collectives.pairAllreduceBytes =
      envBytes("RINGDIST_PAIR_ALLREDUCE_BYTES", kDefaultPairAllreduceBytes, 0);
  o.collectives.singleCopyBytes =
      envBytes("RINGDIST_SINGLE_COPY_BYTES", kDefaultSingleCopyBytes, 0);
  o.mesh.singleCopy = singleCopyMode(o.collectives.singleCopyBytes);
  o.collectives.hierarchical = envFlag("RINGDIST_HIERARCHICAL", true);
  o.collectives.route = routeMode();
  o.collectives.checkResults = envFlag("RINGDIST_CHECK_RESULTS", false);
  o.collectives.maxUnexpectedBytes =
      envBytes("RINGDIST_MAX_UNEXPECTED_BYTES", kDefaultMaxUnexpectedBytes, 0);
  o.collectives.deviceBufferBytes =
      envBytes("RINGDIST_CUDA_IPC_BYTES", kDefaultDeviceBufferBytes, 0);
  RINGDIST_CHECK(o.collectives.deviceBufferBytes == 0 || o.collectives.deviceBufferBytes >= 4096,
                 "ringdist: RINGDIST_CUDA_IPC_BYTES must be 0 (off) or >= 4096, got ",
                 o.collectives.deviceBufferBytes);
  o.collectives.deviceMinBytes =
      envBytes("RINGDIST_CUDA_IPC_MIN_BYTES", kDefaultDeviceMinBytes, 0);
  o.collectives.devicePipelineBytes =
      envBytes("RINGDIST_CUDA_PIPELINE_BYTES", kDefaultDevicePipelineBytes, 0);
  o.collectives.deviceFused = envFlag("RINGDIST_CUDA_FUSED", false);
#if RINGDIST_TESTING
  // Fault injection, in test builds only (TORCH_RINGDIST_TESTING): a release never reads these.
  o.mesh.link.corruptSendAt = envBytes("RINGDIST_TEST_CORRUPT_SEND", 0, 0);
  o.mesh.link.writeDelay =
      std::chrono::milliseconds(envInt("RINGDIST_TEST_SINGLE_COPY_WRITE_DELAY_MS", 0));
  o.collectives.corruptResultAt = envBytes("RINGDIST_TEST_CORRUPT_RESULT", 0, 0);
  o.mesh.testRoundTripUs = static_cast<uint32_t>(envInt("RINGDIST_TEST_ROUND_TRIP_US", 0));
  o.mesh.testShmMapDelay = std::chrono::milliseconds(envInt("RINGDIST_TEST_SHM_MAP_DELAY_MS", 0));
#endif

  const int64_t shrinkSeconds = envInt(
      "RINGDIST_SHRINK_TIMEOUT",
      std::chrono::duration_cast<std::chrono::seconds>(kDefaultShrinkTimeout).count());
  RINGDIST_CHECK(shrinkSeconds > 0, "ringdist: RINGDIST_SHRINK_TIMEOUT must be > 0 seconds, got ",
                 shrinkSeconds);
  o.shrinkTimeout = std::chrono::seconds(shrinkSeconds);

  o.traceEntries = envBytes("RINGDIST_TRACE_BUFFER", kDefaultTraceEntries, 0);
  o.traceDump = envString("RINGDIST_TRACE_DUMP", "");

  o.debug = envFlag("RINGDIST_DEBUG", false) ||
      envString("TORCH_DISTRIBUTED_DEBUG", "") == "DETAIL";
  return o;
}

std::string socketInterfaceFromEnvironment() { return envString("RINGDIST_SOCKET_IFNAME", ""); }

}  // namespace ringdist
