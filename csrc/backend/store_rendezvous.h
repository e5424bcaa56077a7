#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdlib>

#include "csrc/common/error.h"
#include "csrc/common/rendezvous.h"

namespace ringdist {

// The engine's Rendezvous on top of the c10d store torch hands the backend
// (already prefixed per process group, so groups never share keys). torchrun
// keeps its store across restarts of a failed job, so keys are also
// prefixed with the restart attempt: a restarted rank never reads a dead
// attempt's addresses or secret.
class StoreRendezvous final : public Rendezvous {
 public:
  explicit StoreRendezvous(c10::intrusive_ptr<c10d::Store> store)
      : store_(std::move(store)), prefix_(strCat("attempt", attempt(), "/")) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    store_->set(prefix_ + key, value);
  }

  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    return getMany({key}, timeout).front();
  }

  // One wait for all the keys, then one multiGet: three round trips to the store in all
  // (the multiGet waits again), where a get per key takes three each.
  std::vector<std::vector<uint8_t>> getMany(const std::vector<std::string>& keys,
                                            std::chrono::milliseconds timeout) override {
    std::vector<std::string> prefixed;
    prefixed.reserve(keys.size());
    for (const auto& key : keys) prefixed.push_back(prefix_ + key);
    if (prefixed.empty()) return {};
    try {
      store_->wait(prefixed, timeout);
    } catch (const std::exception& e) {
      std::string names;
      for (const auto& key : keys) names += strCat(names.empty() ? "'" : ", '", key, "'");
      throw TimeoutError(strCat("Timed out after ", timeout.count(),
                                " ms waiting for store key(s) ", names, ": ", e.what()));
    }
    return store_->multiGet(prefixed);
  }

  bool check(const std::string& key) override { return store_->check({prefix_ + key}); }

  int64_t add(const std::string& key, int64_t delta) override {
    return store_->add(prefix_ + key, delta);
  }

  // c10d's compareSet with nothing expected: a missing key takes the value.
  std::vector<uint8_t> setFirst(const std::string& key, const std::vector<uint8_t>& value) override {
    return store_->compareSet(prefix_ + key, {}, value);
  }

 private:
  static std::string attempt() {
    const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
    return restarts != nullptr ? restarts : "0";
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
};

}  // namespace ringdist
