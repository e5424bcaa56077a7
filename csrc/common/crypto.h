#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

// OpenSSL's types, declared here so that no header includes OpenSSL.
struct evp_cipher_ctx_st;
struct evp_pkey_st;

namespace ringdist {

// The cryptography the TCP transport uses, every primitive OpenSSL's libcrypto
// (no hand-written cryptography): HMAC-SHA256, HKDF-SHA256, X25519, AES-256-GCM.

using Digest = std::array<uint8_t, 32>;
using Key = std::array<uint8_t, 32>;

Digest hmacSha256(const void* key, size_t keyBytes, const void* message, size_t messageBytes);
// Constant-time comparison (no early exit on the first difference).
bool digestsEqual(const Digest& a, const Digest& b);
// HKDF-SHA256 (RFC 5869), extract and expand: `bytes` of output keying material.
std::vector<uint8_t> hkdfSha256(const std::vector<uint8_t>& salt, const std::vector<uint8_t>& ikm,
                                const std::vector<uint8_t>& info, size_t bytes);
// Bytes from the operating system's generator.
void randomBytes(uint8_t* out, size_t bytes);

// An ephemeral X25519 key pair: one per connection, so that recorded traffic
// stays sealed when a long-lived secret leaks later (forward secrecy).
class KeyExchange {
 public:
  KeyExchange();
  ~KeyExchange();
  KeyExchange(const KeyExchange&) = delete;
  KeyExchange& operator=(const KeyExchange&) = delete;

  const Key& publicKey() const { return public_; }
  // The secret shared with the holder of `peerPublic`; throws for a peer key
  // that yields none (a low-order point).
  std::vector<uint8_t> sharedSecret(const Key& peerPublic) const;

 private:
  evp_pkey_st* key_ = nullptr;
  Key public_{};
};

// AES-256-GCM with one key, one message at a time: begin with a 12-byte
// nonce (never twice with one key) and the associated data, then update over
// the message in as many pieces as it comes in, then seal (writes the
// 16-byte tag) or open (checks it).
class Aead {
 public:
  static constexpr size_t kNonceBytes = 12;
  static constexpr size_t kTagBytes = 16;

  Aead(const Key& key, bool encrypt);
  ~Aead();
  Aead(const Aead&) = delete;
  Aead& operator=(const Aead&) = delete;

  void begin(const uint8_t* nonce, const void* aad, size_t aadBytes);
  void update(const void* in, void* out, size_t bytes);
  void seal(uint8_t* tag);
  // False if the tag does not match: the message is not authentic.
  bool open(const uint8_t* tag);

 private:
  evp_cipher_ctx_st* ctx_ = nullptr;
  const bool encrypt_;
};

}  // namespace ringdist
