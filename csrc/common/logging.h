#pragma once

#include <string>

namespace ringdist {

// Warnings always go to stderr; debug lines only once a group was created
// with debug output on (RINGDIST_DEBUG or TORCH_DISTRIBUTED_DEBUG=DETAIL).
void logWarning(const std::string& message);
void logDebug(const std::string& message);
void setDebugEnabled(bool on);
bool debugEnabled();

}  // namespace ringdist
