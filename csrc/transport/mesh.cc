#include "csrc/transport/mesh.h"

#include <arpa/inet.h>
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <future>
#include <thread>

#include "csrc/common/error.h"
#include "csrc/transport/host_identity.h"
#include "csrc/transport/shm/connect.h"
#include "csrc/transport/tcp/handshake.h"
#include "csrc/transport/tcp/socket.h"
#include "csrc/transport/tcp/tuning.h"

namespace ringdist {

namespace {

// A host record is a few hundred bytes; a length past this is not one.
constexpr uint32_t kMaxRecordBytes = 64 << 10;

// Every rank's record (ours included). Sent over the links just
// made: each rank sends its own to every peer and reads theirs, half a round trip once every
// rank has connected (through the store it took a set and a wait-and-fetch, three round trips
// and more). Nothing else has crossed these links yet; a record is its length and its bytes.
std::vector<PeerRecord> exchangeRecords(std::vector<std::unique_ptr<Channel>>& channels, int rank,
                                        const MeshOptions& options, uint32_t roundTripUs,
                                        const tcp::Door* door,
                                        std::chrono::steady_clock::time_point deadline) {
  const int size = static_cast<int>(channels.size());
  PeerRecord mine{HostIdentity::detect(options.hostLabel), options.transport, roundTripUs,
                  door != nullptr ? door->self.toString() : std::string(),
                  door != nullptr ? tcp::streamWindowBytes(door->tuning) : 0};
  const std::vector<uint8_t> encoded = mine.encode();
  const uint32_t length = static_cast<uint32_t>(encoded.size());
  std::vector<uint32_t> lengths(static_cast<size_t>(size));
  std::vector<std::vector<uint8_t>> raw(static_cast<size_t>(size));
  std::vector<char> arrived(static_cast<size_t>(size), 0);
  std::vector<uint64_t> sent(static_cast<size_t>(size), 0);
  for (int peer = 0; peer < size; ++peer) {
    Channel* ch = channels[static_cast<size_t>(peer)].get();
    if (ch == nullptr) continue;
    const auto i = static_cast<size_t>(peer);
    ch->postSend(&length, sizeof length);
    sent[i] = ch->postSend(encoded.data(), encoded.size());
    ch->postRecv(&lengths[i], sizeof(uint32_t), [&, ch, i, peer] {
      RINGDIST_CHECK(lengths[i] > 0 && lengths[i] <= kMaxRecordBytes, "ringdist: rank ", peer,
                     " sent no host record (", lengths[i], " bytes): another ringdist version?");
      raw[i].resize(lengths[i]);
      ch->postRecvNext(raw[i].data(), raw[i].size(), [&arrived, i] { arrived[i] = 1; });
    });
  }
  for (;;) {
    std::vector<pollfd> fds;
    std::string missing;
    for (int peer = 0; peer < size; ++peer) {
      Channel* ch = channels[static_cast<size_t>(peer)].get();
      if (ch == nullptr) continue;
      const auto i = static_cast<size_t>(peer);
      ch->progress();
      if (arrived[i] && ch->sendDone(sent[i])) continue;
      missing += strCat(missing.empty() ? "" : ", ", peer);
      if (ch->pollFd() >= 0) fds.push_back(pollfd{ch->pollFd(), ch->pollEvents(), 0});
    }
    if (missing.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    RINGDIST_CHECK(left.count() > 0, "ringdist: rank ", rank, " timed out exchanging host "
                   "records with rank(s) ", missing, " after connecting to them");
    ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left.count(), 100)));
  }
  std::vector<PeerRecord> records(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    records[static_cast<size_t>(r)] =
        r == rank ? mine : PeerRecord::decode(raw[static_cast<size_t>(r)], r);
  }
  return records;
}

// Same-host pairs share memory unless either side refuses it. The decisions
// are symmetric, so both ends of a pair pick the same transport. Returns the
// ranks sharing memory with us (ourselves included, sorted).
std::vector<int> chooseTransports(const std::vector<PeerRecord>& records, int rank, Mesh& mesh) {
  const PeerRecord& mine = records[static_cast<size_t>(rank)];
  std::vector<int> local;
  for (int peer = 0; peer < static_cast<int>(records.size()); ++peer) {
    const PeerRecord& theirs = records[static_cast<size_t>(peer)];
    const bool sameHost = theirs.host == mine.host;
    const bool wantsShm =
        mine.transport == TransportPolicy::kShm || theirs.transport == TransportPolicy::kShm;
    const bool refusesShm =
        mine.transport == TransportPolicy::kTcp || theirs.transport == TransportPolicy::kTcp;
    if (peer != rank && wantsShm && !sameHost) {
      RINGDIST_FAIL("ringdist: RINGDIST_TRANSPORT=shm but ranks ", rank, " and ", peer,
                    " are on different hosts (or do not share /dev/shm)");
    }
    if (sameHost && !refusesShm) {
      local.push_back(peer);
      if (peer != rank) mesh.transportOf[static_cast<size_t>(peer)] = "shm";
    }
  }
  return local;
}

// Hosts in order of their lowest rank, the ranks of a host together.
void orderRing(const std::vector<PeerRecord>& records, Mesh& mesh) {
  std::vector<const HostIdentity*> hosts;
  for (const auto& r : records) {
    auto same = [&](const HostIdentity* h) { return *h == r.host; };
    if (std::none_of(hosts.begin(), hosts.end(), same)) hosts.push_back(&r.host);
  }
  mesh.hostOf.assign(records.size(), 0);
  for (size_t h = 0; h < hosts.size(); ++h) {
    for (size_t r = 0; r < records.size(); ++r) {
      if (records[r].host == *hosts[h]) {
        mesh.ring.push_back(static_cast<int>(r));
        mesh.hostOf[r] = static_cast<int>(h);
      }
    }
  }
}

// The rendezvous under a prefix: a second connect of the same ranks (a lane) publishes its
// addresses and group secret apart from the first's.
class PrefixedRendezvous final : public Rendezvous {
 public:
  PrefixedRendezvous(Rendezvous& inner, std::string prefix)
      : inner_(inner), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    inner_.set(prefix_ + key, value);
  }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    return inner_.get(prefix_ + key, timeout);
  }
  std::vector<std::vector<uint8_t>> getMany(const std::vector<std::string>& keys,
                                            std::chrono::milliseconds timeout) override {
    std::vector<std::string> prefixed;
    for (const auto& key : keys) prefixed.push_back(prefix_ + key);
    return inner_.getMany(prefixed, timeout);
  }
  bool check(const std::string& key) override { return inner_.check(prefix_ + key); }
  int64_t add(const std::string& key, int64_t delta) override { return inner_.add(prefix_ + key, delta); }
  std::vector<uint8_t> setFirst(const std::string& key, const std::vector<uint8_t>& value) override {
    return inner_.setFirst(prefix_ + key, value);
  }

 private:
  Rendezvous& inner_;
  const std::string prefix_;
};

// Connections to each peer on the other host (TcpOptions::lanes at most): enough streams that
// their windows (`windowBytes` each; 0: unknown) cover kDefaultTcpBufferBytes per 100 ms of the
// group's round trip.
int lanesFor(int maxLanes, uint32_t roundTripUs, uint64_t windowBytes) {
  const double needed = static_cast<double>(kDefaultTcpBufferBytes) * roundTripUs / 100000.0;
  if (windowBytes == 0) return maxLanes;
  const double streams = std::ceil(needed / static_cast<double>(windowBytes));
  return static_cast<int>(std::clamp(streams, 1.0, static_cast<double>(std::max(maxLanes, 1))));
}

// Lanes 1.. to every peer that stays on TCP, when the group spans two hosts (the pair exchange,
// the one route that sends on lanes) and its links are long: the same on every rank (the round
// trip, hosts, transports and windows are agreed). Each lane is a connect of its own (several
// round trips on a long link), so they run side by side, one thread each.
std::vector<std::unique_ptr<Channel>> connectLanes(Rendezvous& rendezvous, int rank, int size,
                                                   const MeshOptions& options, const Mesh& mesh) {
  std::vector<std::unique_ptr<Channel>> lanes;
  const int hosts = 1 + *std::max_element(mesh.hostOf.begin(), mesh.hostOf.end());
  const int count = lanesFor(options.tcp.lanes, mesh.roundTripUs, mesh.windowBytes);
  if (count <= 1 || hosts != 2 || mesh.roundTripUs < kLanesRoundTripUs) return lanes;
  std::vector<bool> wanted(static_cast<size_t>(size));
  for (size_t peer = 0; peer < wanted.size(); ++peer) wanted[peer] = mesh.transportOf[peer] == "tcp";
  if (std::find(wanted.begin(), wanted.end(), true) == wanted.end()) return lanes;
  std::vector<std::future<std::vector<std::unique_ptr<Channel>>>> connecting;
  for (int lane = 1; lane < count; ++lane) {
    connecting.push_back(std::async(std::launch::async, [&, lane] {
      PrefixedRendezvous prefixed(rendezvous, strCat("lane", lane, "/"));
      return tcp::connectAll(prefixed, rank, size, options, wanted);
    }));
  }
  std::exception_ptr failed;
  for (auto& lane : connecting) {  // every thread joined before anything is thrown
    try {
      for (auto& channel : lane.get()) {
        if (channel) lanes.push_back(std::move(channel));
      }
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
  return lanes;
}

bool isLoopback(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  in6_addr v6{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  return ::inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

Mesh emptyMesh(int rank, int size) {
  Mesh mesh;
  mesh.channels.resize(static_cast<size_t>(size));
  mesh.transportOf.assign(static_cast<size_t>(size), "tcp");
  mesh.transportOf[static_cast<size_t>(rank)] = "self";
  return mesh;
}

// The stages after the TCP links, once every rank's record is known: same-host pairs move
// to shared memory (replacing their TCP link, on which nothing was sent after the
// handshake), the ring, and lanes.
void finishMesh(Rendezvous& rendezvous, int rank, const MeshOptions& options, Mesh& mesh) {
  const int size = static_cast<int>(mesh.records.size());
  for (const auto& record : mesh.records) {
    mesh.roundTripUs = std::max(mesh.roundTripUs, record.roundTripUs);
    if (record.windowBytes > 0) {
      mesh.windowBytes = mesh.windowBytes == 0 ? record.windowBytes
                                               : std::min(mesh.windowBytes, record.windowBytes);
    }
  }
  const std::vector<int> local = chooseTransports(mesh.records, rank, mesh);
  // Without a secret, say so where someone else could have joined or reads the
  // links: a peer kept on TCP, or a listener other hosts could reach. A
  // one-host job on loopback is as exposed as torch's own store, no more.
  const bool onTcp = std::count(mesh.transportOf.begin(), mesh.transportOf.end(), "tcp") > 0;
  if (size > 1 && (onTcp || !isLoopback(options.bindIp))) {
    tcp::warnOnceIfUnauthenticated(options.security);
  }
  if (local.size() > 1) {
    std::shared_ptr<Board> board;
    mesh.sameHostCopy = shm::connectLocal(rendezvous, rank, local, options, mesh.channels, &board);
    if (static_cast<int>(local.size()) == size) mesh.board = std::move(board);
  } else {
    mesh.sameHostCopy.why = "no other rank of the group shares memory with this one";
  }
  orderRing(mesh.records, mesh);
  mesh.lanes = connectLanes(rendezvous, rank, size, options, mesh);
}

}  // namespace

Mesh connectMesh(Rendezvous& rendezvous, int rank, int size, const MeshOptions& options) {
  const auto connectStart = std::chrono::steady_clock::now();
  Mesh mesh = emptyMesh(rank, size);
  // 1. An authenticated TCP link to every peer first: listeners serve (and
  //    drop foreign clients) from the start, without waiting on anyone.
  if (size > 1) {
    std::vector<bool> everyone(static_cast<size_t>(size), true);
    everyone[static_cast<size_t>(rank)] = false;
    mesh.channels = tcp::connectAll(rendezvous, rank, size, options, everyone, &mesh.door);
  }
  // 2. Everyone's host and policy; 3. the stages that depend on them.
  mesh.records = exchangeRecords(mesh.channels, rank, options,
                                 longestRoundTripUs(mesh.channels, options.testRoundTripUs),
                                 mesh.door.get(), connectStart + options.timeout);
  if (mesh.door != nullptr) {
    for (const auto& record : mesh.records) {
      mesh.door->addresses.push_back(tcp::Address::parse(record.door));
    }
  }
  finishMesh(rendezvous, rank, options, mesh);
  return mesh;
}

Mesh reconnectMesh(Rendezvous& rendezvous, const tcp::Door& door,
                   const std::vector<PeerRecord>& records, const std::vector<int>& members,
                   int rank, const std::string& label, const MeshOptions& options,
                   std::vector<std::unique_ptr<Channel>> kept) {
  Mesh mesh = emptyMesh(rank, static_cast<int>(members.size()));
  mesh.channels = tcp::reconnect(door, members, rank, label, options, &mesh.door, std::move(kept));
  for (int member : members) mesh.records.push_back(records[static_cast<size_t>(member)]);
  finishMesh(rendezvous, rank, options, mesh);
  return mesh;
}

std::vector<int> goneAtDoors(const tcp::Door& door, const std::vector<int>& peers,
                             std::chrono::milliseconds limit) {
  return tcp::goneBehind(door, peers, limit);
}

std::string chooseListenAddress(const std::string& ifname, const std::string& storeHost) {
  if (!ifname.empty()) {
    return tcp::interfaceAddress(ifname);
  }
  if (storeHost.empty()) {
    return "127.0.0.1";
  }
  if (isLoopback(storeHost)) {
    return storeHost == "localhost" ? "127.0.0.1" : storeHost;
  }
  return tcp::sourceAddressFor(storeHost);
}

}  // namespace ringdist
