#include "csrc/transport/mesh.h"

#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "csrc/common/error.h"
#include "csrc/common/logging.h"
#include "csrc/common/env.h"
#include "csrc/common/hmac.h"
#include "csrc/transport/shm/channel.h"
#include "csrc/transport/tcp/channel.h"
#include "csrc/transport/tcp/socket.h"

namespace ringdist {

namespace {

using tcp::Clock;

constexpr uint32_t kHelloMagic = 0x52444832;  // "RDH2"
constexpr uint32_t kProtocolVersion = 2;
constexpr size_t kTokenBytes = 32;
constexpr size_t kNonceBytes = 16;
// Bytes per direction of a same-host shared-memory ring: several segments
// in flight so writer and reader rarely wait on each other.
constexpr int64_t kShmRingBytes = 4 << 20;
// A connection that has not completed its hello by then is dropped. Half-open
// connections are served concurrently, so a silent one delays no real peer.
constexpr auto kHelloTimeout = std::chrono::seconds(5);

// TCP handshake (mutual, HMAC-SHA256 over fresh nonces, keyed with the
// group's random secret from the store; the secret never crosses the wire):
//   acceptor -> dialer   Challenge {magic, version, acceptor rank, nonceA}
//   dialer -> acceptor   Hello {magic, version, rank, size, nonceD,
//                               HMAC(secret, "hello", nonceA, rank, size, acceptor)}
//   acceptor -> dialer   Ack {magic, HMAC(secret, "ack", nonceD, acceptor, rank)}
// Anything else is dropped and logged; the job is unaffected.
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
    std::vector<uint8_t> secret(kTokenBytes);
    randomBytes(secret.data(), secret.size());
    rendezvous.set(key, secret);
    return secret;
  }
  auto secret = rendezvous.get(key, timeout);
  RINGDIST_CHECK(secret.size() == kTokenBytes, "ringdist: malformed group secret in store");
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

// A connection accepted but not yet authenticated.
struct Pending {
  tcp::Socket sock;
  uint8_t nonce[kNonceBytes];
  Hello hello;
  size_t received;
  Clock::time_point expires;
};

// Connects the TCP links of this rank: tcpPeer[r] says which ranks need one.
void connectTcp(Rendezvous& rendezvous, int rank, int size, const MeshOptions& options,
                const std::vector<bool>& tcpPeer, std::vector<std::unique_ptr<Channel>>& channels) {
  const auto deadline = Clock::now() + options.timeout;
  const auto secret = groupSecret(rendezvous, rank, options.timeout);

  tcp::Socket listener = tcp::listenOn(options.bindIp, size + 16);
  std::string self = tcp::localAddress(listener.fd()).toString();
  rendezvous.set(strCat("ringdist/addr/", rank), std::vector<uint8_t>(self.begin(), self.end()));
  logDebug(strCat("rank ", rank, " listening on ", self));

  // Dial every lower rank. Their listeners queue our connection in the
  // kernel even before they reach accept(), so the order cannot deadlock.
  for (int peer = 0; peer < rank; ++peer) {
    if (!tcpPeer[static_cast<size_t>(peer)]) {
      continue;
    }
    auto raw = rendezvous.get(strCat("ringdist/addr/", peer), options.timeout);
    auto address = tcp::Address::parse(std::string(raw.begin(), raw.end()));
    tcp::Socket sock = tcp::connectTo(address, deadline);
    try {
      Challenge challenge{};
      tcp::recvAll(sock.fd(), &challenge, sizeof(challenge), deadline);
      RINGDIST_CHECK(challenge.magic == kHelloMagic && challenge.version == kProtocolVersion &&
                         challenge.rank == peer,
                     "the listener is not rank ", peer, " of this group (or speaks another protocol)");
      Hello hello{kHelloMagic, kProtocolVersion, rank, size, {}, {}};
      randomBytes(hello.nonce, kNonceBytes);
      Digest mac = proof(secret, "hello", challenge.nonce, rank, size, peer);
      std::memcpy(hello.mac, mac.data(), mac.size());
      tcp::sendAll(sock.fd(), &hello, sizeof(hello), deadline);
      Ack ack{};
      tcp::recvAll(sock.fd(), &ack, sizeof(ack), deadline);
      RINGDIST_CHECK(ack.magic == kHelloMagic &&
                         macMatches(ack.mac, proof(secret, "ack", hello.nonce, peer, rank, size)),
                     "rank ", peer, " did not prove it belongs to this group");
    } catch (const Error& e) {
      RINGDIST_FAIL("ringdist: rank ", rank, " connecting to rank ", peer, " at ",
                    address.toString(), ": ", e.what());
    }
    channels[static_cast<size_t>(peer)] = std::make_unique<tcp::TcpChannel>(peer, std::move(sock));
  }

  // Accept every higher rank. Half-open connections are served together;
  // each must complete a valid hello within kHelloTimeout or is dropped.
  int missing = 0;
  for (int peer = rank + 1; peer < size; ++peer) {
    missing += tcpPeer[static_cast<size_t>(peer)] ? 1 : 0;
  }
  std::vector<std::unique_ptr<Pending>> pending;
  auto drop = [&](size_t i, const std::string& why) {
    logWarning(strCat("rank ", rank, " dropped an incoming connection: ", why));
    pending.erase(pending.begin() + static_cast<long>(i));
  };
  while (missing > 0) {
    auto now = Clock::now();
    if (now >= deadline) {
      throw TimeoutError(strCat("ringdist: Timed out after ", options.timeout.count(),
                                " ms: rank ", rank, " is still waiting for ", missing,
                                " higher rank(s) to connect"));
    }
    for (size_t i = pending.size(); i-- > 0;) {
      if (pending[i]->expires <= now) {
        drop(i, "no valid hello in time");
      }
    }
    std::vector<pollfd> fds{pollfd{listener.fd(), POLLIN, 0}};
    for (auto& p : pending) {
      fds.push_back(pollfd{p->sock.fd(), POLLIN, 0});
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    int ready = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left.count(), 200)));
    if (ready <= 0) {
      continue;
    }
    for (size_t i = pending.size(); i-- > 0;) {
      if ((fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) == 0) {
        continue;
      }
      Pending& p = *pending[i];
      ssize_t n = ::recv(p.sock.fd(), reinterpret_cast<char*>(&p.hello) + p.received,
                         sizeof(Hello) - p.received, MSG_DONTWAIT);
      if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        drop(i, "closed before completing its hello");
        continue;
      }
      p.received += static_cast<size_t>(n);
      if (p.received < sizeof(Hello)) {
        continue;
      }
      const Hello& h = p.hello;
      if (h.magic != kHelloMagic || h.version != kProtocolVersion || h.size != size ||
          h.rank <= rank || h.rank >= size || !tcpPeer[static_cast<size_t>(h.rank)]) {
        drop(i, "not a ringdist hello for this group (wrong magic, version, size or rank)");
        continue;
      }
      if (!macMatches(h.mac, proof(secret, "hello", p.nonce, h.rank, h.size, rank))) {
        drop(i, strCat("claimed rank ", h.rank, " but failed authentication"));
        continue;
      }
      if (channels[static_cast<size_t>(h.rank)] != nullptr) {
        drop(i, strCat("duplicate connection for rank ", h.rank));
        continue;
      }
      Ack ack{kHelloMagic, {}};
      Digest mac = proof(secret, "ack", h.nonce, rank, h.rank, size);
      std::memcpy(ack.mac, mac.data(), mac.size());
      int peer = h.rank;
      tcp::Socket sock = std::move(p.sock);
      pending.erase(pending.begin() + static_cast<long>(i));
      try {
        tcp::sendAll(sock.fd(), &ack, sizeof(ack), deadline);
      } catch (const Error& e) {
        logWarning(strCat("rank ", rank, " lost rank ", peer, " during the handshake: ", e.what()));
        continue;  // a real peer retries nothing: it will fail and time out visibly
      }
      channels[static_cast<size_t>(peer)] = std::make_unique<tcp::TcpChannel>(peer, std::move(sock));
      --missing;
    }
    if ((fds[0].revents & POLLIN) != 0) {
      tcp::Socket sock(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (sock.valid()) {
        auto p = std::make_unique<Pending>();
        p->sock = std::move(sock);
        randomBytes(p->nonce, kNonceBytes);
        p->received = 0;
        p->expires = Clock::now() + kHelloTimeout;
        Challenge challenge{kHelloMagic, kProtocolVersion, rank, {}};
        std::memcpy(challenge.nonce, p->nonce, kNonceBytes);
        // 28 bytes into a fresh socket's empty buffer: never blocks.
        if (::send(p->sock.fd(), &challenge, sizeof(challenge), MSG_NOSIGNAL | MSG_DONTWAIT) ==
            static_cast<ssize_t>(sizeof(challenge))) {
          pending.push_back(std::move(p));
        }
      }
    }
  }
  while (!pending.empty()) {
    drop(pending.size() - 1, "still unauthenticated when every peer had connected");
  }
}

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

std::string transportPolicy() {
  std::string policy = envString("RINGDIST_TRANSPORT", "auto");
  RINGDIST_CHECK(policy == "auto" || policy == "tcp" || policy == "shm",
                 "ringdist: RINGDIST_TRANSPORT must be auto, tcp or shm, got '", policy, "'");
  return policy;
}

// Maps (or, on the lowest local rank, creates) the host segment shared by
// the ranks in `local` (sorted) and returns one channel per local peer.
void connectShm(Rendezvous& rendezvous, int rank, const std::vector<int>& local,
                const MeshOptions& options, std::vector<std::unique_ptr<Channel>>& channels) {
  const int leader = local.front();
  const int count = static_cast<int>(local.size());
  const int self = static_cast<int>(std::find(local.begin(), local.end(), rank) - local.begin());
  const std::string nameKey = strCat("ringdist/shm/", leader);
  const std::string mappedKey = nameKey + "/mapped";
  std::shared_ptr<shm::Segment> segment;
  if (rank == leader) {
    int64_t ringBytes = envInt("RINGDIST_SHM_RING_BYTES", static_cast<int64_t>(kShmRingBytes));
    RINGDIST_CHECK(ringBytes >= 4096, "ringdist: RINGDIST_SHM_RING_BYTES must be >= 4096");
    segment = std::make_shared<shm::Segment>(shm::Segment::create(count, static_cast<size_t>(ringBytes)));
    rendezvous.set(nameKey, std::vector<uint8_t>(segment->name().begin(), segment->name().end()));
    // Unlink as soon as every local rank has mapped it: from then on the
    // memory lives exactly as long as the mappings, crash or not.
    const auto deadline = Clock::now() + options.timeout;
    auto pause = std::chrono::microseconds(50);
    while (rendezvous.add(mappedKey, 0) < count - 1) {
      if (Clock::now() > deadline) {
        throw TimeoutError(strCat("ringdist: Timed out after ", options.timeout.count(),
                                  " ms: rank ", rank, " waits for its same-host peers to map ",
                                  "shared memory"));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(20000));
    }
    segment->unlinkName();
    rendezvous.set(nameKey + "/unlinked", {1});
  } else {
    auto raw = rendezvous.get(nameKey, options.timeout);
    segment = std::make_shared<shm::Segment>(shm::Segment::open(std::string(raw.begin(), raw.end())));
    RINGDIST_CHECK(segment->localRanks() == count, "ringdist: rank ", rank,
                   " mapped a shared-memory segment for ", segment->localRanks(),
                   " ranks but expected ", count);
    rendezvous.add(mappedKey, 1);
    // Return only once the name is gone, so nothing of ours is visible in
    // /dev/shm after init on any rank.
    rendezvous.get(nameKey + "/unlinked", options.timeout);
  }
  segment->bell(self)->pid = static_cast<int32_t>(::getpid());
  segment->bell(self)->startTime = shm::processStartTime(::getpid());
  auto doorbell = std::make_shared<shm::LocalDoorbell>(segment->bell(self));
  for (int i = 0; i < count; ++i) {
    if (i != self) {
      int peer = local[static_cast<size_t>(i)];
      channels[static_cast<size_t>(peer)] =
          std::make_unique<shm::ShmChannel>(peer, segment, self, i, doorbell);
    }
  }
}

}  // namespace

std::string hostIdentityOf(int rank, int size) {
  // RINGDIST_HOST_ID="a,b,a,b" assigns ranks to hosts by hand (rank r takes
  // entry r): tests use it to build multi-host topologies on one machine.
  std::string assigned = envString("RINGDIST_HOST_ID", "");
  if (assigned.empty()) {
    return hostIdentity();
  }
  std::vector<std::string> entries;
  size_t begin = 0;
  for (size_t end; (end = assigned.find(',', begin)) != std::string::npos; begin = end + 1) {
    entries.push_back(assigned.substr(begin, end - begin));
  }
  entries.push_back(assigned.substr(begin));
  RINGDIST_CHECK(static_cast<int>(entries.size()) == size, "ringdist: RINGDIST_HOST_ID has ",
                 entries.size(), " entries but the group has ", size, " ranks");
  // Keep the real identity too: ranks on different machines never share memory.
  return hostIdentity() + "|assigned:" + entries[static_cast<size_t>(rank)];
}

std::string hostIdentity() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  struct stat st{};
  std::string shmMount = ::stat("/dev/shm", &st) == 0 ? strCat(st.st_dev, ":", st.st_ino) : "none";
  return strCat(host, "|", readFileLine("/proc/sys/kernel/random/boot_id"), "|", shmMount, "|",
                linkTarget("/proc/self/ns/pid"));
}

Mesh connectMesh(Rendezvous& rendezvous, int rank, int size, const MeshOptions& options) {
  Mesh mesh;
  mesh.channels.resize(static_cast<size_t>(size));
  mesh.transportOf.assign(static_cast<size_t>(size), "tcp");
  mesh.transportOf[static_cast<size_t>(rank)] = "self";
  const std::string policy = transportPolicy();

  // 1. An authenticated TCP link to every peer, first: listeners serve (and
  //    drop foreign clients) from the start, without waiting on anyone.
  if (size > 1) {
    std::vector<bool> everyone(static_cast<size_t>(size), true);
    everyone[static_cast<size_t>(rank)] = false;
    connectTcp(rendezvous, rank, size, options, everyone, mesh.channels);
  }

  // 2. Everyone's host and policy; the decisions below are symmetric, so both
  //    ends of a pair pick the same transport.
  const bool checksums = envInt("RINGDIST_CRC", 0) != 0;
  const std::string identity =
      hostIdentityOf(rank, size) + "\n" + policy + (checksums ? "|crc" : "|nocrc");
  rendezvous.set(strCat("ringdist/host/", rank), std::vector<uint8_t>(identity.begin(), identity.end()));
  std::vector<std::string> hosts(static_cast<size_t>(size));
  std::vector<std::string> policies(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    auto raw = r == rank ? std::vector<uint8_t>(identity.begin(), identity.end())
                         : rendezvous.get(strCat("ringdist/host/", r), options.timeout);
    std::string text(raw.begin(), raw.end());
    auto cut = text.rfind('\n');
    hosts[static_cast<size_t>(r)] = text.substr(0, cut);
    std::string rest = cut == std::string::npos ? "auto|nocrc" : text.substr(cut + 1);
    auto bar = rest.find('|');
    policies[static_cast<size_t>(r)] = rest.substr(0, bar);
    bool theirs = bar != std::string::npos && rest.substr(bar + 1) == "crc";
    // Checksummed links carry a trailer per transfer: both ends must agree.
    RINGDIST_CHECK(theirs == checksums, "ringdist: RINGDIST_CRC differs between ranks: rank ", rank,
                   " has ", checksums ? 1 : 0, " but rank ", r, " has ", theirs ? 1 : 0);
  }

  // 3. Same-host pairs move to shared memory unless either side refuses it;
  //    their TCP link is closed (nothing was sent on it after the handshake).
  std::vector<int> local;  // same-host ranks sharing memory with us (incl. self)
  for (int peer = 0; peer < size; ++peer) {
    const auto p = static_cast<size_t>(peer);
    bool sameHost = hosts[p] == hosts[static_cast<size_t>(rank)];
    bool wantsShm = policy == "shm" || policies[p] == "shm";
    bool refusesShm = policy == "tcp" || policies[p] == "tcp";
    if (peer != rank && wantsShm && !sameHost) {
      RINGDIST_FAIL("ringdist: RINGDIST_TRANSPORT=shm but ranks ", rank, " and ", peer,
                    " are on different hosts (or do not share /dev/shm)");
    }
    if (sameHost && !refusesShm) {
      local.push_back(peer);
      if (peer != rank) mesh.transportOf[p] = "shm";
    }
  }
  if (local.size() > 1) {
    connectShm(rendezvous, rank, local, options, mesh.channels);
  }

  for (auto& ch : mesh.channels) {
    if (ch) {
      static_cast<QueuedChannel*>(ch.get())->enableChecksums(checksums);
    }
  }

  // Ring order: hosts in order of their lowest rank, ranks of a host together.
  std::vector<std::string> hostOrder;
  for (const auto& h : hosts) {
    if (std::find(hostOrder.begin(), hostOrder.end(), h) == hostOrder.end()) hostOrder.push_back(h);
  }
  mesh.hostOf.assign(static_cast<size_t>(size), 0);
  for (size_t h = 0; h < hostOrder.size(); ++h) {
    for (int r = 0; r < size; ++r) {
      if (hosts[static_cast<size_t>(r)] == hostOrder[h]) {
        mesh.ring.push_back(r);
        mesh.hostOf[static_cast<size_t>(r)] = static_cast<int>(h);
      }
    }
  }
  return mesh;
}

}  // namespace ringdist
