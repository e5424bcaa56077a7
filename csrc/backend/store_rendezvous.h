#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "csrc/common/error.h"
#include "csrc/common/rendezvous.h"

namespace ringdist {

// The engine's Rendezvous on top of the c10d store torch hands the backend
// (already prefixed per process group, so groups never share keys).
class StoreRendezvous final : public Rendezvous {
 public:
  explicit StoreRendezvous(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    store_->set(key, value);
  }

  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    try {
      store_->wait({key}, timeout);
    } catch (const std::exception& e) {
      throw TimeoutError(strCat("Timed out after ", timeout.count(),
                                " ms waiting for store key '", key, "': ", e.what()));
    }
    return store_->get(key);
  }

  bool check(const std::string& key) override { return store_->check({key}); }

  int64_t add(const std::string& key, int64_t delta) override { return store_->add(key, delta); }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace ringdist
