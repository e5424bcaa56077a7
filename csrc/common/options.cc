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

}  // namespace ringdist
