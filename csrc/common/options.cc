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

}  // namespace ringdist
