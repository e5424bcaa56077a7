#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace ringdist {

using Digest = std::array<uint8_t, 32>;

// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104): what the handshake needs
// to prove knowledge of the group secret without sending it.
Digest sha256(const void* data, size_t bytes);
Digest hmacSha256(const void* key, size_t keyBytes, const void* message, size_t messageBytes);

// Constant-time comparison (no early exit on the first difference).
bool digestsEqual(const Digest& a, const Digest& b);

}  // namespace ringdist
