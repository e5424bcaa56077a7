#include "csrc/common/crypto.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#include <memory>

#include "csrc/common/error.h"

namespace ringdist {

namespace {

struct FreePkeyCtx {
  void operator()(EVP_PKEY_CTX* ctx) const { EVP_PKEY_CTX_free(ctx); }
};
struct FreePkey {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using PkeyCtx = std::unique_ptr<EVP_PKEY_CTX, FreePkeyCtx>;
using Pkey = std::unique_ptr<EVP_PKEY, FreePkey>;

// Every call below returns 1 on success; anything else is a failure of the
// library or of its input, never a state to carry on from.
void check(bool ok, const char* what) {
  RINGDIST_CHECK(ok, "ringdist: OpenSSL ", what, " failed");
}

int length(size_t bytes) {
  RINGDIST_CHECK(bytes <= (1u << 30), "ringdist: a cryptographic input of ", bytes,
                 " bytes is too long");
  return static_cast<int>(bytes);
}

}  // namespace

Digest hmacSha256(const void* key, size_t keyBytes, const void* message, size_t messageBytes) {
  Digest out;
  unsigned int outBytes = 0;
  check(HMAC(EVP_sha256(), key, length(keyBytes), static_cast<const unsigned char*>(message),
             messageBytes, out.data(), &outBytes) != nullptr &&
            outBytes == out.size(),
        "HMAC-SHA256");
  return out;
}

bool digestsEqual(const Digest& a, const Digest& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::vector<uint8_t> hkdfSha256(const std::vector<uint8_t>& salt, const std::vector<uint8_t>& ikm,
                                const std::vector<uint8_t>& info, size_t bytes) {
  PkeyCtx ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr));
  check(ctx != nullptr && EVP_PKEY_derive_init(ctx.get()) == 1 &&
            EVP_PKEY_CTX_set_hkdf_md(ctx.get(), EVP_sha256()) == 1 &&
            EVP_PKEY_CTX_set1_hkdf_salt(ctx.get(), salt.data(), length(salt.size())) == 1 &&
            EVP_PKEY_CTX_set1_hkdf_key(ctx.get(), ikm.data(), length(ikm.size())) == 1 &&
            EVP_PKEY_CTX_add1_hkdf_info(ctx.get(), info.data(), length(info.size())) == 1,
        "HKDF setup");
  std::vector<uint8_t> out(bytes);
  size_t outBytes = bytes;
  check(EVP_PKEY_derive(ctx.get(), out.data(), &outBytes) == 1 && outBytes == bytes, "HKDF");
  return out;
}

void randomBytes(uint8_t* out, size_t bytes) {
  check(RAND_bytes(out, length(bytes)) == 1, "RAND_bytes");
}

KeyExchange::KeyExchange() {
  PkeyCtx ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, nullptr));
  check(ctx != nullptr && EVP_PKEY_keygen_init(ctx.get()) == 1 &&
            EVP_PKEY_keygen(ctx.get(), &key_) == 1,
        "X25519 key generation");
  size_t bytes = public_.size();
  check(EVP_PKEY_get_raw_public_key(key_, public_.data(), &bytes) == 1 && bytes == public_.size(),
        "X25519 public key");
}

KeyExchange::~KeyExchange() { EVP_PKEY_free(key_); }

std::vector<uint8_t> KeyExchange::sharedSecret(const Key& peerPublic) const {
  Pkey peer(EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, peerPublic.data(),
                                        peerPublic.size()));
  PkeyCtx ctx(EVP_PKEY_CTX_new(key_, nullptr));
  std::vector<uint8_t> secret(32);
  size_t bytes = secret.size();
  // Derivation refuses a peer key whose shared secret is all zeros.
  RINGDIST_CHECK(peer != nullptr && ctx != nullptr && EVP_PKEY_derive_init(ctx.get()) == 1 &&
                     EVP_PKEY_derive_set_peer(ctx.get(), peer.get()) == 1 &&
                     EVP_PKEY_derive(ctx.get(), secret.data(), &bytes) == 1 &&
                     bytes == secret.size(),
                 "the peer's X25519 key yields no shared secret");
  return secret;
}

Aead::Aead(const Key& key, bool encrypt) : ctx_(EVP_CIPHER_CTX_new()), encrypt_(encrypt) {
  check(ctx_ != nullptr &&
            EVP_CipherInit_ex(ctx_, EVP_aes_256_gcm(), nullptr, key.data(), nullptr,
                              encrypt ? 1 : 0) == 1,
        "AES-256-GCM setup");
}

Aead::~Aead() { EVP_CIPHER_CTX_free(ctx_); }

void Aead::begin(const uint8_t* nonce, const void* aad, size_t aadBytes) {
  int unused = 0;
  // The key schedule stays; only the nonce is new.
  check(EVP_CipherInit_ex(ctx_, nullptr, nullptr, nullptr, nonce, -1) == 1 &&
            EVP_CipherUpdate(ctx_, nullptr, &unused, static_cast<const unsigned char*>(aad),
                             length(aadBytes)) == 1,
        "AES-256-GCM nonce");
}

void Aead::update(const void* in, void* out, size_t bytes) {
  int written = 0;
  check(EVP_CipherUpdate(ctx_, static_cast<unsigned char*>(out), &written,
                         static_cast<const unsigned char*>(in), length(bytes)) == 1 &&
            written == static_cast<int>(bytes),
        "AES-256-GCM");
}

void Aead::seal(uint8_t* tag) {
  unsigned char none[16];  // GCM's final step writes no bytes
  int written = 0;
  check(encrypt_ && EVP_CipherFinal_ex(ctx_, none, &written) == 1 &&
            EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG, kTagBytes, tag) == 1,
        "AES-256-GCM tag");
}

bool Aead::open(const uint8_t* tag) {
  unsigned char none[16];
  int written = 0;
  check(!encrypt_ && EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_TAG, kTagBytes,
                                         const_cast<uint8_t*>(tag)) == 1,
        "AES-256-GCM tag");
  return EVP_CipherFinal_ex(ctx_, none, &written) == 1;
}

}  // namespace ringdist
