#include "csrc/transport/tcp/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "csrc/common/error.h"

namespace ringdist {
namespace tcp {

namespace {

int remainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

// Fills a sockaddr_storage from a numeric IP; returns its length.
socklen_t toSockaddr(const std::string& ip, int port, sockaddr_storage* out) {
  std::memset(out, 0, sizeof(*out));
  auto* v4 = reinterpret_cast<sockaddr_in*>(out);
  if (inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    return sizeof(sockaddr_in);
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(out);
  if (inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    return sizeof(sockaddr_in6);
  }
  RINGDIST_FAIL("ringdist: '", ip, "' is not a numeric IPv4 or IPv6 address");
}

std::string ipOf(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof(buf));
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

}  // namespace

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

int Socket::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void Socket::reset() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

std::string Address::toString() const {
  if (ip.find(':') != std::string::npos) {
    return strCat("[", ip, "]:", port);
  }
  return strCat(ip, ":", port);
}

Address Address::parse(const std::string& text) {
  auto colon = text.rfind(':');
  RINGDIST_CHECK(colon != std::string::npos && colon + 1 < text.size(),
                 "ringdist: malformed peer address '", text, "'");
  Address address;
  address.ip = text.substr(0, colon);
  if (address.ip.size() >= 2 && address.ip.front() == '[' && address.ip.back() == ']') {
    address.ip = address.ip.substr(1, address.ip.size() - 2);
  }
  address.port = std::atoi(text.c_str() + colon + 1);
  RINGDIST_CHECK(address.port > 0 && address.port < 65536, "ringdist: malformed peer address '",
                 text, "'");
  return address;
}

Socket listenOn(const std::string& ip, int backlog) {
  sockaddr_storage sa;
  socklen_t len = toSockaddr(ip, 0, &sa);
  Socket sock(::socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  RINGDIST_CHECK(sock.valid(), "ringdist: socket() failed: ", std::strerror(errno));
  RINGDIST_CHECK(::bind(sock.fd(), reinterpret_cast<sockaddr*>(&sa), len) == 0,
                 "ringdist: cannot bind to ", ip, ": ", std::strerror(errno));
  RINGDIST_CHECK(::listen(sock.fd(), backlog) == 0, "ringdist: listen() failed: ",
                 std::strerror(errno));
  return sock;
}

namespace {

Address addressOf(const sockaddr_storage& sa) {
  Address address;
  address.ip = ipOf(reinterpret_cast<const sockaddr*>(&sa));
  address.port = sa.ss_family == AF_INET
      ? ntohs(reinterpret_cast<const sockaddr_in*>(&sa)->sin_port)
      : ntohs(reinterpret_cast<const sockaddr_in6*>(&sa)->sin6_port);
  return address;
}

// getsockname or getpeername of fd, as an Address.
Address queriedAddress(int fd, int (*query)(int, sockaddr*, socklen_t*), const char* name) {
  sockaddr_storage sa;
  socklen_t len = sizeof(sa);
  RINGDIST_CHECK(query(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0, "ringdist: ", name,
                 "() failed: ", std::strerror(errno));
  return addressOf(sa);
}

}  // namespace

Address localAddress(int fd) { return queriedAddress(fd, ::getsockname, "getsockname"); }

Address peerAddress(int fd) { return queriedAddress(fd, ::getpeername, "getpeername"); }

Socket connectTo(const Address& address, Clock::time_point deadline, const SocketTuning& tuning) {
  sockaddr_storage sa;
  socklen_t len = toSockaddr(address.ip, address.port, &sa);
  auto backoff = std::chrono::milliseconds(1);
  for (;;) {
    Socket sock(::socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    RINGDIST_CHECK(sock.valid(), "ringdist: socket() failed: ", std::strerror(errno));
    applyTuning(sock.fd(), tuning);
    int rc = ::connect(sock.fd(), reinterpret_cast<sockaddr*>(&sa), len);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      pollfd pfd{sock.fd(), POLLOUT, 0};
      int ready = ::poll(&pfd, 1, remainingMs(deadline));
      if (ready == 1) {
        socklen_t errLen = sizeof(err);
        ::getsockopt(sock.fd(), SOL_SOCKET, SO_ERROR, &err, &errLen);
      } else {
        err = ETIMEDOUT;
      }
    }
    if (err == 0) {
      // The handshake uses blocking I/O with poll deadlines; channels switch
      // back to non-blocking afterwards.
      int flags = ::fcntl(sock.fd(), F_GETFL);
      ::fcntl(sock.fd(), F_SETFL, flags & ~O_NONBLOCK);
      return sock;
    }
    bool retry = err == ECONNREFUSED || err == ECONNRESET || err == EAGAIN || err == EINTR;
    if (!retry || Clock::now() + backoff >= deadline) {
      throw TimeoutError(strCat("ringdist: Timed out or failed connecting to ",
                                address.toString(), ": ", std::strerror(err)));
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
  }
}

std::vector<bool> connectsRefused(const std::vector<Address>& addresses,
                                  std::chrono::milliseconds limit) {
  std::vector<bool> refused(addresses.size(), false);
  std::vector<Socket> probes(addresses.size());
  std::vector<pollfd> waiting;
  std::vector<size_t> waitingFor;
  for (size_t i = 0; i < addresses.size(); ++i) {
    sockaddr_storage sa;
    const socklen_t len = toSockaddr(addresses[i].ip, addresses[i].port, &sa);
    probes[i] = Socket(::socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!probes[i].valid()) continue;
    const linger reset{1, 0};  // close sends a reset: no FIN exchange, no TIME_WAIT
    ::setsockopt(probes[i].fd(), SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
    if (::connect(probes[i].fd(), reinterpret_cast<sockaddr*>(&sa), len) == 0) continue;
    if (errno == ECONNREFUSED) {
      refused[i] = true;
    } else if (errno == EINPROGRESS) {
      waiting.push_back(pollfd{probes[i].fd(), POLLOUT, 0});
      waitingFor.push_back(i);
    }
  }
  const auto deadline = Clock::now() + limit;
  while (!waiting.empty() && Clock::now() < deadline) {
    if (::poll(waiting.data(), waiting.size(), remainingMs(deadline)) <= 0) continue;
    for (size_t w = waiting.size(); w-- > 0;) {
      if (waiting[w].revents == 0) continue;
      int err = 0;
      socklen_t errLen = sizeof(err);
      ::getsockopt(waiting[w].fd, SOL_SOCKET, SO_ERROR, &err, &errLen);
      refused[waitingFor[w]] = err == ECONNREFUSED;
      waiting.erase(waiting.begin() + static_cast<long>(w));
      waitingFor.erase(waitingFor.begin() + static_cast<long>(w));
    }
  }
  return refused;
}

std::string interfaceAddress(const std::string& ifname) {
  ifaddrs* list = nullptr;
  RINGDIST_CHECK(::getifaddrs(&list) == 0, "ringdist: getifaddrs() failed: ",
                 std::strerror(errno));
  std::string v4;
  std::string v6;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || ifname != it->ifa_name) {
      continue;
    }
    if (it->ifa_addr->sa_family == AF_INET && v4.empty()) {
      v4 = ipOf(it->ifa_addr);
    } else if (it->ifa_addr->sa_family == AF_INET6 && v6.empty()) {
      // Link-local v6 needs a scope id we do not publish; skip it.
      auto* sin6 = reinterpret_cast<sockaddr_in6*>(it->ifa_addr);
      if (!IN6_IS_ADDR_LINKLOCAL(&sin6->sin6_addr)) {
        v6 = ipOf(it->ifa_addr);
      }
    }
  }
  ::freeifaddrs(list);
  RINGDIST_CHECK(!v4.empty() || !v6.empty(), "ringdist: RINGDIST_SOCKET_IFNAME='", ifname,
                 "' names no interface with an IPv4 or global IPv6 address");
  return v4.empty() ? v6 : v4;
}

std::string sourceAddressFor(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* result = nullptr;
  int rc = ::getaddrinfo(host.c_str(), "9", &hints, &result);
  RINGDIST_CHECK(rc == 0, "ringdist: cannot resolve store host '", host, "': ", gai_strerror(rc));
  std::string ip;
  for (addrinfo* it = result; it != nullptr && ip.empty(); it = it->ai_next) {
    Socket probe(::socket(it->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    // connect() on a datagram socket only selects a route: nothing is sent.
    if (probe.valid() && ::connect(probe.fd(), it->ai_addr, it->ai_addrlen) == 0) {
      ip = localAddress(probe.fd()).ip;
    }
  }
  ::freeaddrinfo(result);
  RINGDIST_CHECK(!ip.empty(), "ringdist: no local address routes to store host '", host,
                 "'; set RINGDIST_SOCKET_IFNAME");
  return ip;
}

void sendAll(int fd, const void* data, size_t bytes, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    pollfd pfd{fd, POLLOUT, 0};
    int ready = ::poll(&pfd, 1, remainingMs(deadline));
    if (ready == 0) {
      throw TimeoutError("ringdist: Timed out sending handshake");
    }
    ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      continue;
    }
    RINGDIST_CHECK(n > 0, "ringdist: handshake send failed: ", std::strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void recvAll(int fd, void* data, size_t bytes, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    pollfd pfd{fd, POLLIN, 0};
    int ready = ::poll(&pfd, 1, remainingMs(deadline));
    if (ready == 0) {
      throw TimeoutError("ringdist: Timed out receiving handshake");
    }
    ssize_t n = ::recv(fd, p, bytes, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      continue;
    }
    RINGDIST_CHECK(n != 0, "ringdist: connection closed during handshake");
    RINGDIST_CHECK(n > 0, "ringdist: handshake recv failed: ", std::strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void setNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  RINGDIST_CHECK(flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0,
                 "ringdist: fcntl(O_NONBLOCK) failed: ", std::strerror(errno));
}

void setNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace tcp
}  // namespace ringdist
