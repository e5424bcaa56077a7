#include "csrc/common/logging.h"

#include <cstdio>
#include <cstring>

#include "csrc/common/env.h"

namespace ringdist {

bool debugEnabled() {
  static const bool enabled = envInt("RINGDIST_DEBUG", 0) != 0 ||
      envString("TORCH_DISTRIBUTED_DEBUG", "") == "DETAIL";
  return enabled;
}

void logWarning(const std::string& message) {
  std::fprintf(stderr, "[ringdist] warning: %s\n", message.c_str());
}

void logDebug(const std::string& message) {
  if (debugEnabled()) {
    std::fprintf(stderr, "[ringdist] %s\n", message.c_str());
  }
}

}  // namespace ringdist
