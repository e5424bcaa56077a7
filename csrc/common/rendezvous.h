#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ringdist {

// The small key-value interface the engine needs to find its peers. The
// backend implements it on top of the c10d store (already prefixed per group);
// tests can implement it in memory.
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Blocks until the key exists or the timeout passes (then throws TimeoutError).
  virtual std::vector<uint8_t> get(const std::string& key,
                                   std::chrono::milliseconds timeout) = 0;
  // Non-blocking existence check.
  virtual bool check(const std::string& key) = 0;
  // Atomic add; returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Atomic: stores `value` unless the key exists; returns the key's value after (ours, or the
  // one stored first). One round trip where check, then get or set, take several.
  virtual std::vector<uint8_t> setFirst(const std::string& key,
                                        const std::vector<uint8_t>& value) = 0;
  // get() of every key, in order. A store that fetches several keys in one round trip
  // overrides it: across a WAN each round trip to the store costs tens of milliseconds.
  virtual std::vector<std::vector<uint8_t>> getMany(const std::vector<std::string>& keys,
                                                    std::chrono::milliseconds timeout) {
    std::vector<std::vector<uint8_t>> values;
    values.reserve(keys.size());
    for (const auto& key : keys) values.push_back(get(key, timeout));
    return values;
  }
};

}  // namespace ringdist
