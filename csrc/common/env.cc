#include "csrc/common/env.h"

#include <cerrno>
#include <cstdlib>

#include "csrc/common/error.h"

namespace ringdist {

std::string envString(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return (value == nullptr || *value == '\0') ? fallback : std::string(value);
}

int64_t envInt(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    return fallback;
  }
  char* end = nullptr;
  errno = 0;
  long long parsed = std::strtoll(value, &end, 0);
  // Accept an optional K/M/G suffix (binary units) for byte sizes.
  int64_t scale = 1;
  if (end != nullptr && (*end == 'k' || *end == 'K')) { scale = 1 << 10; ++end; }
  else if (end != nullptr && (*end == 'm' || *end == 'M')) { scale = 1 << 20; ++end; }
  else if (end != nullptr && (*end == 'g' || *end == 'G')) { scale = 1 << 30; ++end; }
  RINGDIST_CHECK(errno == 0 && end != value && *end == '\0',
                 "ringdist: environment variable ", name, "='", value,
                 "' is not an integer");
  return static_cast<int64_t>(parsed) * scale;
}

}  // namespace ringdist
