#pragma once

#include <cstdint>
#include <string>

namespace ringdist {

// All tunables read from the environment carry the RINGDIST_ prefix and are
// listed in README.md. Malformed values raise instead of being ignored.
std::string envString(const char* name, const std::string& fallback);
int64_t envInt(const char* name, int64_t fallback);

}  // namespace ringdist
