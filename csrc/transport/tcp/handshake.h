#pragma once

#include <memory>
#include <vector>

#include "csrc/common/options.h"
#include "csrc/common/rendezvous.h"
#include "csrc/transport/channel.h"

namespace ringdist {
namespace tcp {

// Wire version of the handshake and of everything after it (op headers);
// ranks that speak different versions refuse each other at connect time.
constexpr uint32_t kProtocolVersion = 6;

// Connects an authenticated TCP link to every rank r with wanted[r]; returns
// the channels by rank (null elsewhere). Each rank listens on
// options.bindIp (never a wildcard address) and publishes ip:port in the
// rendezvous; higher ranks dial lower ones.
//
// The handshake is mutual, HMAC-SHA256 over fresh nonces, keyed with a
// random 32-byte group secret rank 0 publishes (it never crosses the wire):
//   acceptor -> dialer   Challenge {magic, version, acceptor rank, nonceA}
//   dialer -> acceptor   Hello {magic, version, rank, size, nonceD,
//                               HMAC(secret, "hello", nonceA, rank, size, acceptor)}
//   acceptor -> dialer   Ack {magic, HMAC(secret, "ack", nonceD, acceptor, rank)}
// Anything else (garbage, wrong secret, replays, duplicate or absurd ranks,
// silent clients) is dropped and logged, served concurrently so it cannot
// delay real peers; the job is unaffected.
std::vector<std::unique_ptr<Channel>> connectAll(Rendezvous& rendezvous, int rank, int size,
                                                 const MeshOptions& options,
                                                 const std::vector<bool>& wanted);

}  // namespace tcp
}  // namespace ringdist
