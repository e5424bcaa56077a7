#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "csrc/common/options.h"
#include "csrc/transport/channel.h"

namespace ringdist {
namespace tcp {

// What every TCP socket of a group gets, chosen once at connect time
// (chooseTuning) and applied to the listener, whose accepted sockets inherit
// it, and to each socket that dials (applyTuning).
struct SocketTuning {
  std::string congestion;  // empty: the socket keeps the system's default
  int sendBuffer = 0;      // bytes asked for (the kernel doubles them); 0: autotuned
  int recvBuffer = 0;
  bool force = false;      // CAP_NET_ADMIN: SO_*BUFFORCE, above wmem_max / rmem_max
};

// Reads the kernel's limits (/proc/sys/net/...) and tries the congestion
// control on a scratch socket of `family`. Throws, naming
// RINGDIST_TCP_CONGESTION, when an algorithm asked for by name is unknown or
// refused; "auto" falls back to the system's default instead.
SocketTuning chooseTuning(int family, const TcpOptions& options);

// The window one TCP stream of this process can open, in bytes: the smaller of its send and
// receive buffers as `tuning` sets them, or where left to autotuning, the kernel's autotuning
// maximum (net.ipv4.tcp_wmem / tcp_rmem); 0 where unknown.
uint64_t streamWindowBytes(const SocketTuning& tuning);

// Sets `tuning` on a socket before it listens or connects; throws if the kernel refuses.
void applyTuning(int fd, const SocketTuning& tuning);

// A connected socket as the kernel reports it: congestion control and the
// buffer sizes it holds (SO_SNDBUF/SO_RCVBUF, the doubled figure), and
// whether each was set or is left to autotuning.
std::map<std::string, std::string> describeSocket(int fd, const SocketTuning& tuning);

// The smallest round trip the kernel measured on a connected socket so far
// (TCP_INFO min_rtt, microseconds; from the SYN on, so a connected socket has
// one); 0 if unknown.
uint32_t minRoundTripUs(int fd);
// TCP_INFO's bytes_acked, busy_time and min_rtt (Channel::sendTotals); zeros if unknown.
Channel::SendTotals sendTotalsOf(int fd);
// TCP_INFO's last_data_recv: milliseconds since data last arrived (Channel::quietMs); -1 if
// unknown.
int64_t lastDataReceivedMs(int fd);

}  // namespace tcp
}  // namespace ringdist
