#include "csrc/transport/tcp/tuning.h"

#include <netinet/in.h>
#include <linux/tcp.h>  // struct tcp_info with min_rtt (glibc's stops short of it)
#include <sys/socket.h>

#include <algorithm>
#include <cstddef>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <tuple>
#include <vector>

#include "csrc/common/error.h"
#include "csrc/common/logging.h"
#include "csrc/transport/tcp/socket.h"

namespace ringdist {
namespace tcp {

namespace {

// The words of a /proc/sys file ("" when it cannot be read).
std::vector<std::string> procWords(const char* path) {
  std::ifstream file(path);
  std::vector<std::string> words;
  for (std::string word; file >> word;) words.push_back(word);
  return words;
}

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + w;
  return out.empty() ? "?" : out;
}

// Read once: the list changes only when a module loads.
const std::vector<std::string>& availableCongestion() {
  static const auto words = procWords("/proc/sys/net/ipv4/tcp_available_congestion_control");
  return words;
}

// A limit in bytes from /proc/sys (the `index`-th number); 0 if unreadable.
int64_t procLimit(const char* path, size_t index) {
  auto words = procWords(path);
  return index < words.size() ? std::atoll(words[index].c_str()) : 0;
}

bool setCongestion(int fd, const std::string& name) {
  return ::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(),
                      static_cast<socklen_t>(name.size())) == 0;
}

std::string congestionOf(int fd) {
  char name[32] = {0};
  socklen_t len = sizeof(name) - 1;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return "?";
  return std::string(name, strnlen(name, len));
}

int bufferOf(int fd, int option) {
  int value = 0;
  socklen_t len = sizeof(value);
  ::getsockopt(fd, SOL_SOCKET, option, &value, &len);
  return value;
}

std::string chooseCongestion(int probe, const std::string& wanted) {
  if (wanted == "system") {
    return "";
  }
  const bool automatic = wanted == "auto";
  const std::string name = automatic ? "bbr" : wanted;
  const auto& available = availableCongestion();
  const bool offered = std::find(available.begin(), available.end(), name) != available.end();
  if (offered && setCongestion(probe, name)) {
    return name;
  }
  const int err = offered ? errno : ENOENT;
  const std::string allowed =
      joined(procWords("/proc/sys/net/ipv4/tcp_allowed_congestion_control"));
  if (automatic) {
    logDebug(strCat("tcp: bbr not usable here (", std::strerror(err), "; available: ",
                    joined(available), "; allowed without CAP_NET_ADMIN: ", allowed,
                    "): sockets keep the system's congestion control"));
    return "";
  }
  RINGDIST_FAIL("ringdist: RINGDIST_TCP_CONGESTION='", wanted, "': ",
                offered ? "the kernel refused it" : "the kernel does not offer it", " (",
                std::strerror(err), "); available: ", joined(available),
                "; allowed without CAP_NET_ADMIN: ", allowed,
                "; or use auto (bbr where possible) or system");
}

// The buffer to ask for in one direction, or 0 to leave it to autotuning:
// a set buffer (doubled by the kernel) must beat what autotuning may reach.
int chooseBuffer(size_t cap, bool force, int64_t unprivilegedMax, int64_t autotuneMax) {
  int64_t asked = static_cast<int64_t>(cap);
  if (!force) asked = std::min(asked, unprivilegedMax);
  return 2 * asked > autotuneMax ? static_cast<int>(asked) : 0;
}

// TCP_INFO of fd into *info: false when fd is closed, the call fails, or the kernel's struct
// ends before `needed` bytes (a kernel older than the field wanted).
bool tcpInfo(int fd, tcp_info* info, size_t needed) {
  socklen_t len = sizeof(*info);
  return fd >= 0 && ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, info, &len) == 0 && len >= needed;
}

}  // namespace

SocketTuning chooseTuning(int family, const TcpOptions& options) {
  Socket probe(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  RINGDIST_CHECK(probe.valid(), "ringdist: socket() failed: ", std::strerror(errno));
  SocketTuning tuning;
  tuning.congestion = chooseCongestion(probe.fd(), options.congestion);
  if (options.bufferBytes > 0) {
    // The kernel's own privilege check (CAP_NET_ADMIN in the socket's network namespace).
    int cap = static_cast<int>(options.bufferBytes);
    tuning.force = ::setsockopt(probe.fd(), SOL_SOCKET, SO_SNDBUFFORCE, &cap, sizeof(cap)) == 0;
    tuning.sendBuffer =
        chooseBuffer(options.bufferBytes, tuning.force, procLimit("/proc/sys/net/core/wmem_max", 0),
                     procLimit("/proc/sys/net/ipv4/tcp_wmem", 2));
    tuning.recvBuffer =
        chooseBuffer(options.bufferBytes, tuning.force, procLimit("/proc/sys/net/core/rmem_max", 0),
                     procLimit("/proc/sys/net/ipv4/tcp_rmem", 2));
  }
  logDebug(strCat("tcp: congestion control ",
                  tuning.congestion.empty() ? "the system's" : tuning.congestion,
                  "; send buffer ",
                  tuning.sendBuffer ? strCat(tuning.sendBuffer, " B") : "autotuned",
                  ", receive buffer ",
                  tuning.recvBuffer ? strCat(tuning.recvBuffer, " B") : "autotuned",
                  tuning.force ? " (CAP_NET_ADMIN: forced)" : ""));
  return tuning;
}

uint64_t streamWindowBytes(const SocketTuning& tuning) {
  const int64_t send = tuning.sendBuffer ? tuning.sendBuffer
                                         : procLimit("/proc/sys/net/ipv4/tcp_wmem", 2);
  const int64_t recv = tuning.recvBuffer ? tuning.recvBuffer
                                         : procLimit("/proc/sys/net/ipv4/tcp_rmem", 2);
  return static_cast<uint64_t>(std::max<int64_t>(0, std::min(send, recv)));
}

void applyTuning(int fd, const SocketTuning& tuning) {
  RINGDIST_CHECK(tuning.congestion.empty() || setCongestion(fd, tuning.congestion),
                 "ringdist: cannot set TCP congestion control '", tuning.congestion,
                 "': ", std::strerror(errno));
  for (auto [option, forced, bytes] : {std::tuple{SO_SNDBUF, SO_SNDBUFFORCE, tuning.sendBuffer},
                                       std::tuple{SO_RCVBUF, SO_RCVBUFFORCE, tuning.recvBuffer}}) {
    if (bytes == 0) continue;
    int which = tuning.force ? forced : option;
    RINGDIST_CHECK(::setsockopt(fd, SOL_SOCKET, which, &bytes, sizeof(bytes)) == 0,
                   "ringdist: cannot set a TCP socket buffer of ", bytes,
                   " bytes: ", std::strerror(errno));
  }
}

std::map<std::string, std::string> describeSocket(int fd, const SocketTuning& tuning) {
  return {{"local", localAddress(fd).toString()},
          {"peer", peerAddress(fd).toString()},
          {"congestion", congestionOf(fd)},
          {"send_buffer", std::to_string(bufferOf(fd, SO_SNDBUF))},
          {"recv_buffer", std::to_string(bufferOf(fd, SO_RCVBUF))},
          {"round_trip_us", std::to_string(minRoundTripUs(fd))},
          {"send_buffer_set", tuning.sendBuffer ? "1" : "0"},
          {"recv_buffer_set", tuning.recvBuffer ? "1" : "0"}};
}

uint32_t minRoundTripUs(int fd) {
  tcp_info info{};
  if (!tcpInfo(fd, &info, offsetof(tcp_info, tcpi_min_rtt) + sizeof(info.tcpi_min_rtt)) ||
      info.tcpi_min_rtt == ~0U) {
    return 0;
  }
  return info.tcpi_min_rtt;
}

int64_t lastDataReceivedMs(int fd) {
  tcp_info info{};
  if (!tcpInfo(fd, &info,
               offsetof(tcp_info, tcpi_last_data_recv) + sizeof(info.tcpi_last_data_recv))) {
    return -1;
  }
  return info.tcpi_last_data_recv;
}

Channel::SendTotals sendTotalsOf(int fd) {
  tcp_info info{};
  if (!tcpInfo(fd, &info, offsetof(tcp_info, tcpi_busy_time) + sizeof(info.tcpi_busy_time))) {
    return {};
  }
  return {info.tcpi_bytes_acked, info.tcpi_busy_time,
          info.tcpi_min_rtt == ~0U ? 0 : info.tcpi_min_rtt};
}

}  // namespace tcp
}  // namespace ringdist
