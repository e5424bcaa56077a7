#include "csrc/common/options.h"

namespace ringdist {

const char* transportPolicyName(TransportPolicy policy) {
  switch (policy) {
    case TransportPolicy::kAuto: return "auto";
    case TransportPolicy::kTcp: return "tcp";
    case TransportPolicy::kShm: return "shm";
  }
  return "unknown";
}

bool transportPolicyFromName(const std::string& name, TransportPolicy* out) {
  for (TransportPolicy p : {TransportPolicy::kAuto, TransportPolicy::kTcp, TransportPolicy::kShm}) {
    if (name == transportPolicyName(p)) {
      *out = p;
      return true;
    }
  }
  return false;
}

const char* singleCopyModeName(SingleCopyMode mode) {
  switch (mode) {
    case SingleCopyMode::kAuto: return "auto";
    case SingleCopyMode::kOn: return "1";
    case SingleCopyMode::kOff: return "0";
  }
  return "unknown";
}

bool singleCopyModeFromName(const std::string& name, SingleCopyMode* out) {
  for (SingleCopyMode m : {SingleCopyMode::kAuto, SingleCopyMode::kOn, SingleCopyMode::kOff}) {
    if (name == singleCopyModeName(m)) {
      *out = m;
      return true;
    }
  }
  return false;
}

}  // namespace ringdist
