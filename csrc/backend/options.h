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

}  // namespace ringdist
