#include "csrc/transport/mesh.h"

#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "csrc/common/error.h"
#include "csrc/common/logging.h"
#include "csrc/transport/tcp/channel.h"
#include "csrc/transport/tcp/socket.h"

namespace ringdist {

namespace {

using tcp::Clock;

constexpr uint32_t kHelloMagic = 0x52444831;  // "RDH1"
constexpr uint32_t kProtocolVersion = 1;
constexpr size_t kTokenBytes = 16;
// A dialer that connects but says nothing may stall the acceptor this long.
constexpr auto kHelloTimeout = std::chrono::seconds(5);

struct Hello {
  uint32_t magic;
  uint32_t version;
  int32_t rank;
  int32_t size;
  uint8_t token[kTokenBytes];
};

struct Ack {
  uint32_t magic;
  int32_t rank;
};

std::vector<uint8_t> groupToken(Rendezvous& rendezvous, int rank,
                                std::chrono::milliseconds timeout) {
  const std::string key = "ringdist/token";
  if (rank == 0) {
    std::vector<uint8_t> token(kTokenBytes);
    RINGDIST_CHECK(::getrandom(token.data(), token.size(), 0) ==
                       static_cast<ssize_t>(token.size()),
                   "ringdist: getrandom() failed: ", std::strerror(errno));
    rendezvous.set(key, token);
    return token;
  }
  auto token = rendezvous.get(key, timeout);
  RINGDIST_CHECK(token.size() == kTokenBytes, "ringdist: malformed group token in store");
  return token;
}

bool tokensEqual(const uint8_t* a, const uint8_t* b) {
  uint8_t diff = 0;  // constant time: do not leak how many bytes matched
  for (size_t i = 0; i < kTokenBytes; ++i) {
    diff |= a[i] ^ b[i];
  }
  return diff == 0;
}

}  // namespace

std::vector<std::unique_ptr<Channel>> connectMesh(Rendezvous& rendezvous, int rank, int size,
                                                  const MeshOptions& options) {
  std::vector<std::unique_ptr<Channel>> channels(size);
  if (size == 1) {
    return channels;
  }
  const auto deadline = Clock::now() + options.timeout;
  auto token = groupToken(rendezvous, rank, options.timeout);

  tcp::Socket listener = tcp::listenOn(options.bindIp, size + 16);
  std::string self = tcp::localAddress(listener.fd()).toString();
  rendezvous.set(strCat("ringdist/addr/", rank), std::vector<uint8_t>(self.begin(), self.end()));
  logDebug(strCat("rank ", rank, " listening on ", self));

  // Dial every lower rank. Their listeners queue our connection in the
  // kernel even before they reach accept(), so the order cannot deadlock.
  for (int peer = 0; peer < rank; ++peer) {
    auto raw = rendezvous.get(strCat("ringdist/addr/", peer), options.timeout);
    auto address = tcp::Address::parse(std::string(raw.begin(), raw.end()));
    tcp::Socket sock = tcp::connectTo(address, deadline);
    Hello hello{kHelloMagic, kProtocolVersion, rank, size, {}};
    std::memcpy(hello.token, token.data(), kTokenBytes);
    tcp::sendAll(sock.fd(), &hello, sizeof(hello), deadline);
    Ack ack{};
    try {
      tcp::recvAll(sock.fd(), &ack, sizeof(ack), deadline);
    } catch (const Error& e) {
      RINGDIST_FAIL("ringdist: rank ", rank, " connecting to rank ", peer, " at ",
                    address.toString(), ": ", e.what());
    }
    RINGDIST_CHECK(ack.magic == kHelloMagic && ack.rank == peer, "ringdist: rank ", rank,
                   " connected to ", address.toString(), " expecting rank ", peer,
                   " but got an invalid answer");
    channels[peer] = std::make_unique<tcp::TcpChannel>(peer, std::move(sock));
  }

  // Accept every higher rank; drop (and log) anything that is not one.
  int missing = size - 1 - rank;
  while (missing > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd pfd{listener.fd(), POLLIN, 0};
    int ready = left.count() > 0 ? ::poll(&pfd, 1, static_cast<int>(left.count())) : 0;
    if (ready == 0) {
      throw TimeoutError(strCat("ringdist: Timed out after ", options.timeout.count(),
                                " ms: rank ", rank, " is still waiting for ", missing,
                                " higher rank(s) to connect"));
    }
    if (ready < 0) {
      continue;  // EINTR
    }
    tcp::Socket sock(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!sock.valid()) {
      continue;
    }
    Hello hello{};
    try {
      tcp::recvAll(sock.fd(), &hello, sizeof(hello), std::min(deadline, Clock::now() + kHelloTimeout));
    } catch (const Error& e) {
      logWarning(strCat("rank ", rank, " dropped a connection that sent no valid hello: ", e.what()));
      continue;
    }
    bool valid = hello.magic == kHelloMagic && hello.version == kProtocolVersion &&
        hello.size == size && hello.rank > rank && hello.rank < size &&
        tokensEqual(hello.token, token.data());
    if (!valid || channels[hello.rank] != nullptr) {
      logWarning(strCat("rank ", rank, " dropped a connection with a ",
                        valid ? "duplicate rank" : "bad hello (wrong job, group or protocol)"));
      continue;
    }
    Ack ack{kHelloMagic, rank};
    tcp::sendAll(sock.fd(), &ack, sizeof(ack), deadline);
    channels[hello.rank] = std::make_unique<tcp::TcpChannel>(hello.rank, std::move(sock));
    --missing;
  }
  return channels;
}

}  // namespace ringdist
