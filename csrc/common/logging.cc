#include "csrc/common/logging.h"

#include <atomic>
#include <cstdio>

namespace ringdist {

namespace {
std::atomic<bool> debugOn{false};
}  // namespace

void setDebugEnabled(bool on) {
  if (on) debugOn.store(true);  // one group asking for debug output turns it on for the process
}

bool debugEnabled() { return debugOn.load(); }

void logWarning(const std::string& message) {
  std::fprintf(stderr, "[ringdist] warning: %s\n", message.c_str());
}

void logDebug(const std::string& message) {
  if (debugEnabled()) {
    std::fprintf(stderr, "[ringdist] %s\n", message.c_str());
  }
}

}  // namespace ringdist
