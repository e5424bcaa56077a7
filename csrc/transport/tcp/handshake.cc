#include "csrc/transport/tcp/handshake.h"

#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "csrc/common/error.h"
#include "csrc/common/hmac.h"
#include "csrc/common/logging.h"
#include "csrc/transport/tcp/channel.h"
#include "csrc/transport/tcp/socket.h"

namespace ringdist {
namespace tcp {

namespace {

constexpr uint32_t kHelloMagic = 0x52444832;  // "RDH2"
constexpr size_t kSecretBytes = 32;
constexpr size_t kNonceBytes = 16;
// A connection that has not completed its hello by then is dropped. Half-open
// connections are served concurrently, so a silent one delays no real peer.
constexpr auto kHelloTimeout = std::chrono::seconds(5);
// Longest poll of the accept loop, so expired half-open connections go soon.
constexpr int kAcceptPollMs = 200;

struct Challenge {
  uint32_t magic;
  uint32_t version;
  int32_t rank;
  uint8_t nonce[kNonceBytes];
};

struct Hello {
  uint32_t magic;
  uint32_t version;
  int32_t rank;
  int32_t size;
  uint8_t nonce[kNonceBytes];
  uint8_t mac[32];
};

struct Ack {
  uint32_t magic;
  uint8_t mac[32];
};

void randomBytes(uint8_t* out, size_t n) {
  RINGDIST_CHECK(::getrandom(out, n, 0) == static_cast<ssize_t>(n),
                 "ringdist: getrandom() failed: ", std::strerror(errno));
}

std::vector<uint8_t> groupSecret(Rendezvous& rendezvous, int rank,
                                 std::chrono::milliseconds timeout) {
  const std::string key = "ringdist/secret";
  if (rank == 0) {
    std::vector<uint8_t> secret(kSecretBytes);
    randomBytes(secret.data(), secret.size());
    rendezvous.set(key, secret);
    return secret;
  }
  auto secret = rendezvous.get(key, timeout);
  RINGDIST_CHECK(secret.size() == kSecretBytes, "ringdist: malformed group secret in store");
  return secret;
}

Digest proof(const std::vector<uint8_t>& secret, const char* label, const uint8_t* nonce,
             int32_t a, int32_t b, int32_t c) {
  uint8_t message[8 + kNonceBytes + 12] = {0};
  std::memcpy(message, label, std::min<size_t>(8, std::strlen(label)));
  std::memcpy(message + 8, nonce, kNonceBytes);
  std::memcpy(message + 8 + kNonceBytes, &a, 4);
  std::memcpy(message + 12 + kNonceBytes, &b, 4);
  std::memcpy(message + 16 + kNonceBytes, &c, 4);
  return hmacSha256(secret.data(), secret.size(), message, sizeof(message));
}

bool macMatches(const uint8_t* mac, const Digest& expected) {
  Digest got;
  std::memcpy(got.data(), mac, got.size());
  return digestsEqual(got, expected);
}

// Dialer side: answers the acceptor's challenge and checks its ack.
void authenticateToAcceptor(int fd, const std::vector<uint8_t>& secret, int rank, int size,
                            int peer, Clock::time_point deadline) {
  Challenge challenge{};
  recvAll(fd, &challenge, sizeof(challenge), deadline);
  RINGDIST_CHECK(challenge.magic == kHelloMagic && challenge.version == kProtocolVersion &&
                     challenge.rank == peer,
                 "the listener is not rank ", peer, " of this group (or speaks another protocol)");
  Hello hello{kHelloMagic, kProtocolVersion, rank, size, {}, {}};
  randomBytes(hello.nonce, kNonceBytes);
  Digest mac = proof(secret, "hello", challenge.nonce, rank, size, peer);
  std::memcpy(hello.mac, mac.data(), mac.size());
  sendAll(fd, &hello, sizeof(hello), deadline);
  Ack ack{};
  recvAll(fd, &ack, sizeof(ack), deadline);
  RINGDIST_CHECK(ack.magic == kHelloMagic &&
                     macMatches(ack.mac, proof(secret, "ack", hello.nonce, peer, rank, size)),
                 "rank ", peer, " did not prove it belongs to this group");
}

// Acceptor side: serves every half-open connection at once until each
// wanted higher rank has authenticated.
class Acceptor {
 public:
  Acceptor(const Socket& listener, const std::vector<uint8_t>& secret, int rank, int size,
           const MeshOptions& options, const SocketTuning& tuning,
           const std::vector<bool>& wanted, std::vector<std::unique_ptr<Channel>>& channels)
      : listener_(listener), secret_(secret), rank_(rank), size_(size), options_(options),
        tuning_(tuning), wanted_(wanted), channels_(channels) {}

  void run(Clock::time_point deadline);

 private:
  // A connection accepted but not yet authenticated.
  struct Pending {
    Socket sock;
    uint8_t nonce[kNonceBytes];
    Hello hello;
    size_t received = 0;
    Clock::time_point expires;
  };

  void acceptOne();
  // Reads what arrived on pending connection i; on a complete valid hello,
  // acks it and turns it into a channel; anything invalid is dropped.
  void serve(size_t i, Clock::time_point deadline);
  std::string judge(const Hello& h) const;  // empty: authentic
  void drop(size_t i, const std::string& why) {
    logWarning(strCat("rank ", rank_, " dropped an incoming connection: ", why));
    pending_.erase(pending_.begin() + static_cast<long>(i));
  }

  const Socket& listener_;
  const std::vector<uint8_t>& secret_;
  const int rank_;
  const int size_;
  const MeshOptions& options_;
  const SocketTuning& tuning_;  // the listener's: accepted sockets inherit it
  const std::vector<bool>& wanted_;
  std::vector<std::unique_ptr<Channel>>& channels_;
  std::vector<std::unique_ptr<Pending>> pending_;
  int missing_ = 0;
};

void Acceptor::run(Clock::time_point deadline) {
  for (int peer = rank_ + 1; peer < size_; ++peer) {
    missing_ += wanted_[static_cast<size_t>(peer)] ? 1 : 0;
  }
  while (missing_ > 0) {
    auto now = Clock::now();
    if (now >= deadline) {
      std::string waiting;  // the higher ranks connect to this one: those that never did
      for (int peer = rank_ + 1; peer < size_; ++peer) {
        if (wanted_[static_cast<size_t>(peer)] && !channels_[static_cast<size_t>(peer)]) {
          waiting += strCat(waiting.empty() ? "" : ", ", peer);
        }
      }
      throw TimeoutError(strCat(
          "ringdist: Timed out after ", options_.timeout.count(), " ms: rank ", rank_,
          " is still waiting for rank(s) ", waiting, " to connect to it. Usually they were not "
          "started, or cannot reach this rank's address (a firewall, or another interface: "
          "set RINGDIST_SOCKET_IFNAME)"));
    }
    for (size_t i = pending_.size(); i-- > 0;) {
      if (pending_[i]->expires <= now) drop(i, "no valid hello in time");
    }
    std::vector<pollfd> fds{pollfd{listener_.fd(), POLLIN, 0}};
    for (auto& p : pending_) {
      fds.push_back(pollfd{p->sock.fd(), POLLIN, 0});
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    int ready = ::poll(fds.data(), fds.size(),
                       static_cast<int>(std::min<int64_t>(left.count(), kAcceptPollMs)));
    if (ready <= 0) {
      continue;
    }
    for (size_t i = pending_.size(); i-- > 0;) {
      if ((fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) serve(i, deadline);
    }
    if ((fds[0].revents & POLLIN) != 0) {
      acceptOne();
    }
  }
  while (!pending_.empty()) {
    drop(pending_.size() - 1, "still unauthenticated when every peer had connected");
  }
}

void Acceptor::acceptOne() {
  Socket sock(::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (!sock.valid()) {
    return;
  }
  auto p = std::make_unique<Pending>();
  p->sock = std::move(sock);
  randomBytes(p->nonce, kNonceBytes);
  p->expires = Clock::now() + kHelloTimeout;
  Challenge challenge{kHelloMagic, kProtocolVersion, rank_, {}};
  std::memcpy(challenge.nonce, p->nonce, kNonceBytes);
  // 28 bytes into a fresh socket's empty buffer: never blocks.
  if (::send(p->sock.fd(), &challenge, sizeof(challenge), MSG_NOSIGNAL | MSG_DONTWAIT) ==
      static_cast<ssize_t>(sizeof(challenge))) {
    pending_.push_back(std::move(p));
  }
}

std::string Acceptor::judge(const Hello& h) const {
  if (h.magic != kHelloMagic || h.version != kProtocolVersion || h.size != size_ ||
      h.rank <= rank_ || h.rank >= size_ || !wanted_[static_cast<size_t>(h.rank)]) {
    return "not a ringdist hello for this group (wrong magic, version, size or rank)";
  }
  return "";
}

void Acceptor::serve(size_t i, Clock::time_point deadline) {
  Pending& p = *pending_[i];
  ssize_t n = ::recv(p.sock.fd(), reinterpret_cast<char*>(&p.hello) + p.received,
                     sizeof(Hello) - p.received, MSG_DONTWAIT);
  if (n <= 0) {
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    return drop(i, "closed before completing its hello");
  }
  p.received += static_cast<size_t>(n);
  if (p.received < sizeof(Hello)) {
    return;
  }
  const Hello& h = p.hello;
  std::string bad = judge(h);
  if (!bad.empty()) {
    return drop(i, bad);
  }
  if (!macMatches(h.mac, proof(secret_, "hello", p.nonce, h.rank, h.size, rank_))) {
    return drop(i, strCat("claimed rank ", h.rank, " but failed authentication"));
  }
  if (channels_[static_cast<size_t>(h.rank)] != nullptr) {
    return drop(i, strCat("duplicate connection for rank ", h.rank));
  }
  Ack ack{kHelloMagic, {}};
  Digest mac = proof(secret_, "ack", h.nonce, rank_, h.rank, size_);
  std::memcpy(ack.mac, mac.data(), mac.size());
  const int peer = h.rank;
  Socket sock = std::move(p.sock);
  pending_.erase(pending_.begin() + static_cast<long>(i));
  try {
    sendAll(sock.fd(), &ack, sizeof(ack), deadline);
  } catch (const Error& e) {
    logWarning(strCat("rank ", rank_, " lost rank ", peer, " during the handshake: ", e.what()));
    return;  // a real peer retries nothing: it will fail and time out visibly
  }
  channels_[static_cast<size_t>(peer)] =
      std::make_unique<TcpChannel>(peer, std::move(sock), options_.link, tuning_);
  --missing_;
}

}  // namespace

std::vector<std::unique_ptr<Channel>> connectAll(Rendezvous& rendezvous, int rank, int size,
                                                 const MeshOptions& options,
                                                 const std::vector<bool>& wanted) {
  std::vector<std::unique_ptr<Channel>> channels(static_cast<size_t>(size));
  const auto deadline = Clock::now() + options.timeout;
  const auto secret = groupSecret(rendezvous, rank, options.timeout);

  Socket listener = listenOn(options.bindIp, size + 16);
  const Address self = localAddress(listener.fd());
  const int family = self.ip.find(':') == std::string::npos ? AF_INET : AF_INET6;
  const SocketTuning tuning = chooseTuning(family, options.tcp);
  // Before the address is published, so no peer connects before the listener has it.
  applyTuning(listener.fd(), tuning);
  const std::string published = self.toString();
  rendezvous.set(strCat("ringdist/addr/", rank),
                 std::vector<uint8_t>(published.begin(), published.end()));
  logDebug(strCat("rank ", rank, " listening on ", published));

  // Dial every lower rank. Their listeners queue our connection in the
  // kernel even before they reach accept(), so the order cannot deadlock.
  for (int peer = 0; peer < rank; ++peer) {
    if (!wanted[static_cast<size_t>(peer)]) {
      continue;
    }
    auto raw = rendezvous.get(strCat("ringdist/addr/", peer), options.timeout);
    auto address = Address::parse(std::string(raw.begin(), raw.end()));
    Socket sock = connectTo(address, deadline, tuning);
    try {
      authenticateToAcceptor(sock.fd(), secret, rank, size, peer, deadline);
    } catch (const Error& e) {
      RINGDIST_FAIL("ringdist: rank ", rank, " connecting to rank ", peer, " at ",
                    address.toString(), ": ", e.what());
    }
    channels[static_cast<size_t>(peer)] =
        std::make_unique<TcpChannel>(peer, std::move(sock), options.link, tuning);
  }

  // Accept every higher rank; the listener closes when this returns.
  Acceptor(listener, secret, rank, size, options, tuning, wanted, channels).run(deadline);
  return channels;
}

}  // namespace tcp
}  // namespace ringdist
