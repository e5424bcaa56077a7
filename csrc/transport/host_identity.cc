#include "csrc/transport/host_identity.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>

#include "csrc/common/error.h"

namespace ringdist {

namespace {

// Record layout: these lines, then one line per field, '\n'-separated.
constexpr const char* kRecordTag = "ringdist-peer/5";
constexpr size_t kRecordFields = 10;

std::string readFileLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string linkTarget(const char* path) {
  char buf[256] = {0};
  ssize_t n = ::readlink(path, buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

}  // namespace

HostIdentity HostIdentity::detect(const std::string& label) {
  RINGDIST_CHECK(label.find('\n') == std::string::npos, "ringdist: a host label has no newline");
  HostIdentity id;
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  id.hostname = host;
  id.bootId = readFileLine("/proc/sys/kernel/random/boot_id");
  struct stat st{};
  id.shmMount = ::stat("/dev/shm", &st) == 0 ? strCat(st.st_dev, ":", st.st_ino) : "none";
  id.pidNamespace = linkTarget("/proc/self/ns/pid");
  id.label = label;
  return id;
}

bool HostIdentity::operator==(const HostIdentity& o) const {
  return hostname == o.hostname && bootId == o.bootId && shmMount == o.shmMount &&
      pidNamespace == o.pidNamespace && label == o.label;
}

std::vector<uint8_t> PeerRecord::encode() const {
  std::string text = strCat(kRecordTag, "\n", host.hostname, "\n", host.bootId, "\n",
                            host.shmMount, "\n", host.pidNamespace, "\n", host.label, "\n",
                            transportPolicyName(transport), "\n", roundTripUs, "\n", door, "\n",
                            windowBytes);
  return std::vector<uint8_t>(text.begin(), text.end());
}

PeerRecord PeerRecord::decode(const std::vector<uint8_t>& bytes, int rank) {
  std::vector<std::string> f(1);
  for (uint8_t b : bytes) {
    if (b == '\n') f.emplace_back(); else f.back() += static_cast<char>(b);
  }
  const std::string family = "ringdist-peer/";
  RINGDIST_CHECK(f[0] == kRecordTag || f[0].compare(0, family.size(), family) != 0,
                 "ringdist: rank ", rank, " runs another version of ringdist (its host record is ",
                 f[0], ", this rank's ", kRecordTag, "): every rank must run the same version");
  RINGDIST_CHECK(f.size() == kRecordFields && f[0] == kRecordTag,
                 "ringdist: rank ", rank, " sent a malformed host record");
  PeerRecord r;
  r.host = HostIdentity{f[1], f[2], f[3], f[4], f[5]};
  RINGDIST_CHECK(transportPolicyFromName(f[6], &r.transport),
                 "ringdist: rank ", rank, " sent a malformed host record");
  char* end = nullptr;
  const unsigned long rtt = std::strtoul(f[7].c_str(), &end, 10);
  RINGDIST_CHECK(!f[7].empty() && *end == '\0' && rtt <= UINT32_MAX,
                 "ringdist: rank ", rank, " sent a malformed host record");
  r.roundTripUs = static_cast<uint32_t>(rtt);
  r.door = f[8];
  const unsigned long long window = std::strtoull(f[9].c_str(), &end, 10);
  RINGDIST_CHECK(!f[9].empty() && *end == '\0', "ringdist: rank ", rank,
                 " sent a malformed host record");
  r.windowBytes = window;
  return r;
}

}  // namespace ringdist
