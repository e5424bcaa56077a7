#pragma once

#include <chrono>
#include <string>

#include "csrc/common/options.h"

namespace ringdist {

// The group's Options from the RINGDIST_* environment variables (listed in
// README.md), validated: a malformed or out-of-range value raises, naming the
// variable, instead of being ignored.
Options optionsFromEnvironment(int rank, int size, std::chrono::milliseconds timeout,
                               const std::string& bindIp);

// RINGDIST_SOCKET_IFNAME, the interface a group listens on ("" when unset):
// the API chooses the bind address from it before there is a group.
std::string socketInterfaceFromEnvironment();

}  // namespace ringdist
