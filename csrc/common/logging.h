#pragma once

#include <string>

namespace ringdist {

// Warnings always go to stderr; debug lines only when RINGDIST_DEBUG is set
// (or TORCH_DISTRIBUTED_DEBUG=DETAIL).
void logWarning(const std::string& message);
void logDebug(const std::string& message);
bool debugEnabled();

}  // namespace ringdist
