#include "csrc/transport/tcp/handshake.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <atomic>
#include <future>
#include <mutex>
#include <string>

#include "csrc/common/error.h"
#include "csrc/common/crypto.h"
#include "csrc/common/logging.h"
#include "csrc/transport/tcp/channel.h"
#include "csrc/transport/tcp/socket.h"

namespace ringdist {
namespace tcp {

namespace {

constexpr uint32_t kHelloMagic = 0x52444833;    // "RDH3"
constexpr uint32_t kRefusedMagic = 0x52444858;  // "RDHX": an ack refusing the hello's proof
// The settings both ends of a link must share, in the challenge and the hello.
constexpr uint32_t kFlagEncrypt = 1;    // this rank seals its links (RINGDIST_TCP_ENCRYPT)
constexpr uint32_t kFlagChecksums = 2;  // a CRC trailer after every transfer (RINGDIST_CRC)
constexpr size_t kSecretBytes = 32;
constexpr size_t kNonceBytes = 16;
// A connection that has not completed its hello by then is dropped. Half-open
// connections are served concurrently, so a silent one delays no real peer.
constexpr auto kHelloTimeout = std::chrono::seconds(5);
// Longest poll of the accept loop, so expired half-open connections go soon.
constexpr int kAcceptPollMs = 200;
// Connects a kept listener (Door) may queue beyond the group's own: liveness probes (each check
// of who is alive sends one per peer) and strays, accepted and dropped at the next reconnect.
constexpr int kDoorBacklog = 512;

struct Challenge {
  uint32_t magic;
  uint32_t version;
  int32_t rank;
  uint32_t flags;
  uint8_t nonce[kNonceBytes];
  uint8_t key[32];  // the acceptor's ephemeral X25519 public key
};

struct Hello {
  uint32_t magic;
  uint32_t version;
  int32_t rank;
  int32_t size;
  uint32_t flags;
  uint8_t nonce[kNonceBytes];
  uint8_t key[32];  // the dialer's ephemeral X25519 public key
  uint8_t mac[32];
};

struct Ack {
  uint32_t magic;
  uint8_t mac[32];
};

uint32_t flagsOf(const MeshOptions& options) {
  return (options.security.encrypt ? kFlagEncrypt : 0) |
         (options.link.checksums ? kFlagChecksums : 0);
}

// Why two ranks' settings (their flags) cannot share a link; empty when they agree.
std::string flagsDisagree(uint32_t mine, uint32_t theirs, int rank, int peer) {
  const uint32_t differ = mine ^ theirs;
  if (differ & kFlagEncrypt) {
    return strCat("rank ", peer, (theirs & kFlagEncrypt) ? " encrypts" : " does not encrypt",
                  " its TCP links and rank ", rank, (mine & kFlagEncrypt) ? " does" : " does not",
                  ": RINGDIST_TCP_ENCRYPT must be the same on every rank");
  }
  if (differ & kFlagChecksums) {
    return strCat("RINGDIST_CRC differs between ranks: rank ", rank, " has ",
                  (mine & kFlagChecksums) ? 1 : 0, " but rank ", peer, " has ",
                  (theirs & kFlagChecksums) ? 1 : 0);
  }
  return differ == 0 ? "" : strCat("rank ", peer, " has link settings ", theirs, ", rank ", rank,
                                   " has ", mine);
}

// The key of the handshake's proofs: HKDF-Extract (an HMAC) of the user's
// secret, salted with the group's.
std::vector<uint8_t> proofKey(const std::vector<uint8_t>& group, const std::vector<uint8_t>& user) {
  Digest key = hmacSha256(group.data(), group.size(), user.data(), user.size());
  return std::vector<uint8_t>(key.begin(), key.end());
}

// Everything both sides said before the proofs: the challenge and the hello
// up to its MAC.
std::vector<uint8_t> transcriptOf(const Challenge& c, const Hello& h) {
  std::vector<uint8_t> t(sizeof(c) + offsetof(Hello, mac));
  std::memcpy(t.data(), &c, sizeof(c));
  std::memcpy(t.data() + sizeof(c), &h, offsetof(Hello, mac));
  return t;
}

// HMAC(key, label, 0, transcript): "hello" proves the dialer, "ack" the acceptor.
Digest proof(const std::vector<uint8_t>& key, const char* label,
             const std::vector<uint8_t>& transcript) {
  std::vector<uint8_t> message(label, label + std::strlen(label) + 1);
  message.insert(message.end(), transcript.begin(), transcript.end());
  return hmacSha256(key.data(), key.size(), message.data(), message.size());
}

bool macMatches(const uint8_t* mac, const Digest& expected) {
  Digest got;
  std::memcpy(got.data(), mac, got.size());
  return digestsEqual(got, expected);
}

// One key per direction: HKDF over the X25519 secret, salted with the proof
// key and bound to the transcript, so that only this connection's two
// proven ends hold them.
std::unique_ptr<SessionKeys> sessionKeys(const KeyExchange& mine, const uint8_t* peerKey,
                                         const std::vector<uint8_t>& key,
                                         const std::vector<uint8_t>& transcript, bool dialer) {
  Key peer;
  std::memcpy(peer.data(), peerKey, peer.size());
  const std::string label = "ringdist records";
  std::vector<uint8_t> info(label.size() + transcript.size());
  std::memcpy(info.data(), label.data(), label.size());
  std::memcpy(info.data() + label.size(), transcript.data(), transcript.size());
  const std::vector<uint8_t> okm = hkdfSha256(key, mine.sharedSecret(peer), info, 2 * sizeof(Key));
  auto keys = std::make_unique<SessionKeys>();
  const uint8_t* fromDialer = okm.data();
  const uint8_t* fromAcceptor = okm.data() + sizeof(Key);
  std::memcpy(keys->send.data(), dialer ? fromDialer : fromAcceptor, sizeof(Key));
  std::memcpy(keys->receive.data(), dialer ? fromAcceptor : fromDialer, sizeof(Key));
  return keys;
}

// Dialer side: answers the acceptor's challenge and checks its ack; the
// session keys (null on plaintext links).
std::unique_ptr<SessionKeys> authenticateToAcceptor(int fd, const std::vector<uint8_t>& key,
                                                    const MeshOptions& options, int rank,
                                                    int size, int peer,
                                                    Clock::time_point deadline) {
  Challenge challenge{};
  recvAll(fd, &challenge, sizeof(challenge), deadline);
  RINGDIST_CHECK(challenge.magic == kHelloMagic && challenge.version == kProtocolVersion &&
                     challenge.rank == peer,
                 "the listener is not rank ", peer, " of this group (or speaks another protocol)");
  KeyExchange exchange;
  Hello hello{kHelloMagic, kProtocolVersion, rank, size, flagsOf(options), {}, {}, {}};
  randomBytes(hello.nonce, kNonceBytes);
  std::memcpy(hello.key, exchange.publicKey().data(), sizeof(hello.key));
  const std::vector<uint8_t> transcript = transcriptOf(challenge, hello);
  Digest mac = proof(key, "hello", transcript);
  std::memcpy(hello.mac, mac.data(), mac.size());
  sendAll(fd, &hello, sizeof(hello), deadline);
  // Settings that differ end the connect on both ranks: the proven hello tells the acceptor.
  const std::string disagree = flagsDisagree(hello.flags, challenge.flags, rank, peer);
  RINGDIST_CHECK(disagree.empty(), disagree);
  const TcpSecurity& security = options.security;
  Ack ack{};
  recvAll(fd, &ack, sizeof(ack), deadline);
  RINGDIST_CHECK(ack.magic != kRefusedMagic, "rank ", peer,
                 " refused this rank's proof: the ranks were given different secrets "
                 "(RINGDIST_SECRET or RINGDIST_SECRET_FILE must be the same on every rank)");
  RINGDIST_CHECK(ack.magic == kHelloMagic && macMatches(ack.mac, proof(key, "ack", transcript)),
                 "rank ", peer, " did not prove it holds this group's secret");
  if (!security.encrypt) return nullptr;
  return sessionKeys(exchange, challenge.key, key, transcript, true);
}

// Acceptor side: serves every half-open connection at once until each
// wanted higher rank has authenticated.
class Acceptor {
 public:
  Acceptor(const Socket& listener, const std::vector<uint8_t>& key, int rank, int size,
           const MeshOptions& options, const SocketTuning& tuning,
           const std::vector<bool>& wanted, std::vector<std::unique_ptr<Channel>>& channels)
      : listener_(listener), key_(key), rank_(rank), size_(size), options_(options),
        tuning_(tuning), wanted_(wanted), channels_(channels) {}

  void run(Clock::time_point deadline);
  // From another thread: run() returns at its next poll (a dial of this connect failed).
  void cancel() { cancelled_ = true; }

 private:
  // A connection accepted but not yet authenticated.
  struct Pending {
    Socket sock;
    Challenge challenge;
    KeyExchange exchange;
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
  const std::vector<uint8_t>& key_;  // of the proofs
  const int rank_;
  const int size_;
  const MeshOptions& options_;
  const SocketTuning& tuning_;  // the listener's: accepted sockets inherit it
  const std::vector<bool>& wanted_;
  std::vector<std::unique_ptr<Channel>>& channels_;
  std::vector<std::unique_ptr<Pending>> pending_;
  int missing_ = 0;
  std::string refused_;  // ranks claimed by hellos whose proof failed
  std::atomic<bool> cancelled_{false};
};

void Acceptor::run(Clock::time_point deadline) {
  for (int peer = rank_ + 1; peer < size_; ++peer) {
    missing_ += wanted_[static_cast<size_t>(peer)] ? 1 : 0;
  }
  while (missing_ > 0 && !cancelled_) {
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
          "set RINGDIST_SOCKET_IFNAME)",
          refused_.empty() ? "" : strCat(". Connections that claimed rank(s) ", refused_,
                                         " were refused: they proved another secret "
                                         "(RINGDIST_SECRET or RINGDIST_SECRET_FILE must be the "
                                         "same on every rank)")));
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
  p->expires = Clock::now() + kHelloTimeout;
  Challenge& challenge = p->challenge;
  challenge = Challenge{kHelloMagic, kProtocolVersion, rank_, flagsOf(options_), {}, {}};
  randomBytes(challenge.nonce, kNonceBytes);
  std::memcpy(challenge.key, p->exchange.publicKey().data(), sizeof(challenge.key));
  // 64 bytes into a fresh socket's empty buffer: never blocks.
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
    if (p.received == 0) {  // a liveness probe (goneBehind) queued at a kept listener, or a stray
      logDebug(strCat("rank ", rank_, " dropped a connection closed before any hello"));
      pending_.erase(pending_.begin() + static_cast<long>(i));
      return;
    }
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
  const std::vector<uint8_t> transcript = transcriptOf(p.challenge, h);
  if (!macMatches(h.mac, proof(key_, "hello", transcript))) {
    // Tell the dialer why (it learns nothing it did not know), then drop it.
    const Ack refusal{kRefusedMagic, {}};
    (void)::send(p.sock.fd(), &refusal, sizeof(refusal), MSG_NOSIGNAL | MSG_DONTWAIT);
    refused_ += strCat(refused_.empty() ? "" : ", ", h.rank);
    return drop(i, strCat("claimed rank ", h.rank, " but failed authentication (another secret)"));
  }
  // A proven member with other settings: the group cannot form (its dialer fails too).
  const std::string disagree = flagsDisagree(flagsOf(options_), h.flags, rank_, h.rank);
  RINGDIST_CHECK(disagree.empty(), disagree);
  if (channels_[static_cast<size_t>(h.rank)] != nullptr) {
    return drop(i, strCat("duplicate connection for rank ", h.rank));
  }
  std::unique_ptr<SessionKeys> keys;
  if (options_.security.encrypt) {
    try {
      keys = sessionKeys(p.exchange, h.key, key_, transcript, false);
    } catch (const Error& e) {
      return drop(i, strCat("rank ", h.rank, ": ", e.what()));
    }
  }
  Ack ack{kHelloMagic, {}};
  Digest mac = proof(key_, "ack", transcript);
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
      std::make_unique<TcpChannel>(peer, std::move(sock), options_.link, tuning_, keys.get());
  --missing_;
}

// Connects to each rank of `lower` (their published addresses, in order) at once, one thread
// each; every thread joined before the first error is thrown.
void dialLower(const std::vector<Address>& addresses, const std::vector<int>& lower,
               int rank, int size, const std::vector<uint8_t>& key, const MeshOptions& options,
               const SocketTuning& tuning, Clock::time_point deadline,
               std::vector<std::unique_ptr<Channel>>& channels) {
  std::vector<std::future<void>> dials;
  for (size_t i = 0; i < lower.size(); ++i) {
    dials.push_back(std::async(std::launch::async, [&, i] {
      const int peer = lower[i];
      const Address& address = addresses[i];
      Socket sock = connectTo(address, deadline, tuning);
      std::unique_ptr<SessionKeys> keys;
      try {
        keys = authenticateToAcceptor(sock.fd(), key, options, rank, size, peer, deadline);
      } catch (const Error& e) {
        RINGDIST_FAIL("ringdist: rank ", rank, " connecting to rank ", peer, " at ",
                      address.toString(), ": ", e.what());
      }
      channels[static_cast<size_t>(peer)] =
          std::make_unique<TcpChannel>(peer, std::move(sock), options.link, tuning, keys.get());
    }));
  }
  std::exception_ptr failed;
  for (auto& dial : dials) {
    try {
      dial.get();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
}

// Connects this rank to every wanted rank through `listener` (the higher ranks dial it) and
// by dialing the lower ones at `lowerAddresses` (in rank order), at once: a peer answers a
// dial only once it accepts, so dialing first and accepting after would chain the ranks'
// connects one after another (several round trips each on a long link).
std::vector<std::unique_ptr<Channel>> connectThrough(
    const Socket& listener, const SocketTuning& tuning, const std::vector<uint8_t>& key, int rank,
    int size, const MeshOptions& options, const std::vector<bool>& wanted,
    const std::vector<Address>& lowerAddresses) {
  std::vector<std::unique_ptr<Channel>> channels(static_cast<size_t>(size));
  const auto deadline = Clock::now() + options.timeout;
  std::vector<int> lower;
  for (int peer = 0; peer < rank; ++peer) {
    if (wanted[static_cast<size_t>(peer)]) lower.push_back(peer);
  }
  Acceptor acceptor(listener, key, rank, size, options, tuning, wanted, channels);
  std::exception_ptr failed;
  {
    auto dialing = std::async(std::launch::async, [&] {
      try {
        dialLower(lowerAddresses, lower, rank, size, key, options, tuning, deadline, channels);
      } catch (...) {
        acceptor.cancel();
        throw;
      }
    });
    try {
      acceptor.run(deadline);
    } catch (...) {
      failed = std::current_exception();
    }
    try {
      dialing.get();  // its error first: a failed dial cancels the accepting
    } catch (...) {
      failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
  return channels;
}

}  // namespace

std::vector<std::unique_ptr<Channel>> connectAll(Rendezvous& rendezvous, int rank, int size,
                                                 const MeshOptions& options,
                                                 const std::vector<bool>& wanted,
                                                 std::shared_ptr<Door>* door) {
  // Room for the connects a kept listener queues between groups (a shrink's, probes).
  auto listener = std::make_shared<Socket>(listenOn(options.bindIp, size + kDoorBacklog));
  const Address self = localAddress(listener->fd());
  const int family = self.ip.find(':') == std::string::npos ? AF_INET : AF_INET6;
  const SocketTuning tuning = chooseTuning(family, options.tcp);
  // Before the address is published, so no peer connects before the listener has it.
  applyTuning(listener->fd(), tuning);
  // The group secret keeps concurrent jobs that share a user secret apart; it proves nothing,
  // as anyone who reaches the store can read it. Rank 0 makes it.
  const std::string secretKey = "ringdist/secret";
  std::vector<uint8_t> secret;
  if (rank == 0) {
    secret.resize(kSecretBytes);
    randomBytes(secret.data(), secret.size());
    rendezvous.set(secretKey, secret);
  }
  const std::string published = self.toString();
  rendezvous.set(strCat("ringdist/addr/", rank),
                 std::vector<uint8_t>(published.begin(), published.end()));
  logDebug(strCat("rank ", rank, " listening on ", published));
  // One fetch (across a WAN every store round trip counts): the secret and the addresses of
  // the lower ranks this one dials.
  std::vector<std::string> keys;
  if (rank != 0) keys.push_back(secretKey);
  for (int peer = 0; peer < rank; ++peer) {
    if (wanted[static_cast<size_t>(peer)]) keys.push_back(strCat("ringdist/addr/", peer));
  }
  auto values = rendezvous.getMany(keys, options.timeout);
  auto addressValues = values.begin();
  if (rank != 0) {
    secret = std::move(*addressValues++);
    RINGDIST_CHECK(secret.size() == kSecretBytes, "ringdist: malformed group secret in store");
  }
  std::vector<Address> lower;
  for (; addressValues != values.end(); ++addressValues) {
    lower.push_back(Address::parse(std::string(addressValues->begin(), addressValues->end())));
  }
  const auto key = proofKey(secret, options.security.secret);
  auto channels = connectThrough(*listener, tuning, key, rank, size, options, wanted, lower);
  // The mesh fills in every rank's address from the host records (no round trip of its own).
  if (door != nullptr) *door = std::make_shared<Door>(Door{listener, self, tuning, key, {}});
  return channels;
}

namespace {

// Fences the kept links (TcpChannel::beginFence) all at once, so no end waits on a peer that
// is busy fencing another link, under a digest of the new group's key, and renumbers each to
// its new rank. A link whose fence fails, or has not passed by `deadline`, is closed and
// dropped from `kept` (that pair connects afresh).
void fenceKept(const std::vector<uint8_t>& key, Clock::time_point deadline,
               std::vector<std::unique_ptr<Channel>>& kept) {
  static const char kFenceLabel[] = "ringdist/fence";
  const Digest digest = hmacSha256(key.data(), key.size(),
                                   reinterpret_cast<const uint8_t*>(kFenceLabel),
                                   sizeof kFenceLabel - 1);
  std::vector<TcpChannel*> fencing(kept.size(), nullptr);
  for (size_t peer = 0; peer < kept.size(); ++peer) {
    auto* link = dynamic_cast<TcpChannel*>(kept[peer].get());
    if (link == nullptr || !link->keepable()) {
      kept[peer].reset();
      continue;
    }
    link->renumber(static_cast<int>(peer));
    link->beginFence(digest.data());
    fencing[peer] = link;
  }
  auto drop = [&](size_t peer, const char* why) {
    logDebug(strCat("ringdist shrink: the link to rank ", peer, " is connected afresh: ", why));
    kept[peer]->close();
    kept[peer].reset();
    fencing[peer] = nullptr;
  };
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<size_t> of;
    for (size_t peer = 0; peer < fencing.size(); ++peer) {
      if (fencing[peer] == nullptr) continue;
      try {
        if (fencing[peer]->progressFence()) {
          fencing[peer] = nullptr;
          continue;
        }
      } catch (const std::exception& e) {
        drop(peer, e.what());
        continue;
      }
      fds.push_back({fencing[peer]->incomingFd(), fencing[peer]->fenceEvents(), 0});
      of.push_back(peer);
    }
    if (fds.empty()) return;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      for (size_t peer : of) drop(peer, "its fence did not arrive in time");
      return;
    }
    ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left, kAcceptPollMs)));
  }
}

}  // namespace

std::vector<std::unique_ptr<Channel>> reconnect(const Door& door, const std::vector<int>& members,
                                                int rank, const std::string& label,
                                                const MeshOptions& options,
                                                std::shared_ptr<Door>* newDoor,
                                                std::vector<std::unique_ptr<Channel>> kept) {
  const auto deadline = Clock::now() + options.timeout;
  const Digest derived = hmacSha256(door.key.data(), door.key.size(),
                                    reinterpret_cast<const uint8_t*>(label.data()), label.size());
  auto next = std::make_shared<Door>(Door{door.listener, door.self, door.tuning,
                                          std::vector<uint8_t>(derived.begin(), derived.end()), {}});
  for (int member : members) next->addresses.push_back(door.addresses[static_cast<size_t>(member)]);
  const size_t size = members.size();
  kept.resize(size);
  fenceKept(next->key, deadline, kept);
  std::vector<bool> wanted(size);  // the pairs without a kept link connect
  for (size_t peer = 0; peer < size; ++peer) {
    wanted[peer] = peer != static_cast<size_t>(rank) && !kept[peer];
  }
  MeshOptions rest = options;  // within the same deadline as the fences
  rest.timeout = std::max(std::chrono::milliseconds(1),
                          std::chrono::duration_cast<std::chrono::milliseconds>(
                              deadline - Clock::now()));
  auto channels = connectThrough(
      *door.listener, door.tuning, next->key, rank, static_cast<int>(size), rest, wanted,
      std::vector<Address>(next->addresses.begin(), next->addresses.begin() + rank));
  for (size_t peer = 0; peer < size; ++peer) {
    if (kept[peer]) channels[peer] = std::move(kept[peer]);
  }
  *newDoor = std::move(next);
  return channels;
}

std::vector<int> goneBehind(const Door& door, const std::vector<int>& peers,
                            std::chrono::milliseconds limit) {
  std::vector<Address> addresses;
  for (int peer : peers) addresses.push_back(door.addresses[static_cast<size_t>(peer)]);
  const std::vector<bool> refused = connectsRefused(addresses, limit);
  std::vector<int> gone;
  for (size_t i = 0; i < peers.size(); ++i) {
    if (refused[i]) gone.push_back(peers[i]);
  }
  return gone;
}

void warnOnceIfUnauthenticated(const TcpSecurity& security) {
  static std::once_flag once;
  if (!security.secret.empty()) return;
  std::call_once(once, [&] {
    logWarning(security.encrypt
                   ? "ringdist: TCP links are encrypted, but peers are not authenticated: give "
                     "every rank the same secret in RINGDIST_SECRET or RINGDIST_SECRET_FILE"
                   : "ringdist: TCP links are neither encrypted (RINGDIST_TCP_ENCRYPT=0) nor "
                     "authenticated (no RINGDIST_SECRET or RINGDIST_SECRET_FILE)");
  });
}

}  // namespace tcp
}  // namespace ringdist
