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
#include "csrc/transport/shm/channel.h"
#include "csrc/transport/tcp/channel.h"
#include "csrc/transport/tcp/socket.h"

namespace ringdist {

namespace {

using tcp::Clock;

constexpr uint32_t kHelloMagic = 0x52444831;  // "RDH1"
constexpr uint32_t kProtocolVersion = 1;
constexpr size_t kTokenBytes = 16;
// Bytes per direction of a same-host shared-memory ring: several segments
// in flight so writer and reader rarely wait on each other.
constexpr int64_t kShmRingBytes = 4 << 20;
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

// Connects the TCP links of this rank: tcpPeer[r] says which ranks need one.
void connectTcp(Rendezvous& rendezvous, int rank, int size, const MeshOptions& options,
                const std::vector<bool>& tcpPeer, std::vector<std::unique_ptr<Channel>>& channels) {
  const auto deadline = Clock::now() + options.timeout;
  auto token = groupToken(rendezvous, rank, options.timeout);

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
  int missing = 0;
  for (int peer = rank + 1; peer < size; ++peer) {
    missing += tcpPeer[static_cast<size_t>(peer)] ? 1 : 0;
  }
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
        tcpPeer[static_cast<size_t>(hello.rank)] && tokensEqual(hello.token, token.data());
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
  const std::string identity = hostIdentity() + "\n" + policy;
  rendezvous.set(strCat("ringdist/host/", rank), std::vector<uint8_t>(identity.begin(), identity.end()));

  // Everyone's host and policy; the decisions below are symmetric, so both
  // ends of a pair pick the same transport.
  std::vector<std::string> hosts(static_cast<size_t>(size));
  std::vector<std::string> policies(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    auto raw = r == rank ? std::vector<uint8_t>(identity.begin(), identity.end())
                         : rendezvous.get(strCat("ringdist/host/", r), options.timeout);
    std::string text(raw.begin(), raw.end());
    auto cut = text.rfind('\n');
    hosts[static_cast<size_t>(r)] = text.substr(0, cut);
    policies[static_cast<size_t>(r)] = cut == std::string::npos ? "auto" : text.substr(cut + 1);
  }
  std::vector<int> local;  // same-host ranks sharing memory with us (incl. self)
  std::vector<bool> tcpPeer(static_cast<size_t>(size), false);
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
    } else if (peer != rank) {
      tcpPeer[p] = true;
    }
  }
  if (local.size() > 1) {
    connectShm(rendezvous, rank, local, options, mesh.channels);
  }
  if (std::find(tcpPeer.begin(), tcpPeer.end(), true) != tcpPeer.end()) {
    connectTcp(rendezvous, rank, size, options, tcpPeer, mesh.channels);
  }

  // Ring order: hosts in order of their lowest rank, ranks of a host together.
  std::vector<std::string> hostOrder;
  for (const auto& h : hosts) {
    if (std::find(hostOrder.begin(), hostOrder.end(), h) == hostOrder.end()) hostOrder.push_back(h);
  }
  for (const auto& h : hostOrder) {
    for (int r = 0; r < size; ++r) {
      if (hosts[static_cast<size_t>(r)] == h) mesh.ring.push_back(r);
    }
  }
  return mesh;
}

}  // namespace ringdist
