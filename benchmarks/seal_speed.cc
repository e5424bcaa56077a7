// Seal and open speed of one core: the AEAD the TCP records use (AES-256-GCM through
// csrc/common/crypto.h) and ChaCha20-Poly1305 (OpenSSL's EVP, for comparison), per
// record size, with memcpy as the floor, in bytes per second of this thread's CPU time. Prints one JSON object per line.
// Built and run by seal_speed.py.
#include <openssl/evp.h>

#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "csrc/common/crypto.h"

namespace {

// CPU time of this thread: the figure stays a core's speed on a busy machine.
struct Clock {
  using time_point = double;
  static double now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  }
};

constexpr size_t kTotalBytes = 512u << 20;  // plaintext per measurement

double seconds(double t0) { return Clock::now() - t0; }

void report(const char* cipher, const char* what, size_t record, double s) {
  std::printf("{\"cipher\": \"%s\", \"op\": \"%s\", \"record_bytes\": %zu, \"GBps\": %.3f}\n",
              cipher, what, record, kTotalBytes / s / 1e9);
}

void aesGcm(size_t record, std::vector<uint8_t>& in, std::vector<uint8_t>& out) {
  ringdist::Key key{};
  ringdist::randomBytes(key.data(), key.size());
  ringdist::Aead seal(key, true), open(key, false);
  uint8_t nonce[12] = {0}, aad[4] = {0}, tag[16];
  const size_t records = kTotalBytes / record;
  auto t0 = Clock::now();
  for (size_t i = 0; i < records; ++i) {
    std::memcpy(nonce + 4, &i, 8);
    seal.begin(nonce, aad, 4);
    seal.update(in.data(), out.data(), record);
    seal.seal(tag);
  }
  report("aes-256-gcm", "seal", record, seconds(t0));
  // Opens the last record sealed (out holds it) again and again: each must match.
  t0 = Clock::now();
  for (size_t i = 0; i < records; ++i) {
    open.begin(nonce, aad, 4);
    open.update(out.data(), in.data(), record);
    if (!open.open(tag)) std::abort();
  }
  report("aes-256-gcm", "open", record, seconds(t0));
}

void chacha(size_t record, std::vector<uint8_t>& in, std::vector<uint8_t>& out) {
  uint8_t key[32], nonce[12] = {0}, tag[16];
  ringdist::randomBytes(key, sizeof(key));
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  for (int enc : {1, 0}) {
    EVP_CipherInit_ex(ctx, EVP_chacha20_poly1305(), nullptr, key, nullptr, enc);
    auto t0 = Clock::now();
    for (size_t i = 0; i < kTotalBytes / record; ++i) {
      int n = 0;
      std::memcpy(nonce + 4, &i, 8);
      EVP_CipherInit_ex(ctx, nullptr, nullptr, nullptr, nonce, -1);
      EVP_CipherUpdate(ctx, enc ? out.data() : in.data(), &n, enc ? in.data() : out.data(),
                       static_cast<int>(record));
      if (!enc) EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, 16, tag);
      EVP_CipherFinal_ex(ctx, tag, &n);
      if (enc) EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, tag);
    }
    report("chacha20-poly1305", enc ? "seal" : "open", record, seconds(t0));
  }
  EVP_CIPHER_CTX_free(ctx);
}

void copy(size_t record, std::vector<uint8_t>& in, std::vector<uint8_t>& out) {
  auto t0 = Clock::now();
  for (size_t i = 0; i < kTotalBytes / record; ++i) {
    std::memcpy(out.data(), in.data(), record);
    asm volatile("" : : "r"(out.data()) : "memory");
  }
  report("memcpy", "copy", record, seconds(t0));
}

}  // namespace

int main(int argc, char** argv) {
  for (int a = 1; a < argc; ++a) {
    const size_t record = std::strtoull(argv[a], nullptr, 0);
    std::vector<uint8_t> in(record, 7), out(record);
    copy(record, in, out);
    aesGcm(record, in, out);
    chacha(record, in, out);
  }
  return 0;
}
