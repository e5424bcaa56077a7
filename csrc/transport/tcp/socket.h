#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "csrc/transport/tcp/tuning.h"

namespace ringdist {
namespace tcp {

using Clock = std::chrono::steady_clock;

// Owns one file descriptor; closes it on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { reset(); }

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset();

 private:
  int fd_ = -1;
};

// An endpoint as published in the store: numeric IP (v4 or v6) and port.
struct Address {
  std::string ip;
  int port = 0;
  std::string toString() const;                 // "1.2.3.4:5" or "[::1]:5"
  static Address parse(const std::string& text);  // inverse of toString
};

// Listening socket bound to `ip` (never a wildcard address) on an ephemeral port.
Socket listenOn(const std::string& ip, int backlog);
Address localAddress(int fd);
Address peerAddress(int fd);

// Connects a socket set up with `tuning`, retrying refused connections until the deadline.
Socket connectTo(const Address& address, Clock::time_point deadline, const SocketTuning& tuning);

// For each address, whether its host answered a connect there with a refusal within `limit`:
// the host is up and nothing listens on that port, so a process that kept a listener open
// there is gone. All at once, from this thread; no answer (a host cut off, a stopped process's
// kernel still accepts) is false. Probes that connected are reset at once.
std::vector<bool> connectsRefused(const std::vector<Address>& addresses,
                                  std::chrono::milliseconds limit);

// The IPv4/IPv6 address of a network interface, e.g. "eth0".
std::string interfaceAddress(const std::string& ifname);
// The local address the kernel would use to reach `host` (no packet is sent).
std::string sourceAddressFor(const std::string& host);

// Blocking transfers with a deadline, used only during the handshake.
void sendAll(int fd, const void* data, size_t bytes, Clock::time_point deadline);
void recvAll(int fd, void* data, size_t bytes, Clock::time_point deadline);

void setNonBlocking(int fd);
void setNoDelay(int fd);

}  // namespace tcp
}  // namespace ringdist
