#pragma once

// A named POSIX shared-memory object mapped into this process: what the
// shared-memory transport's per-host segment (csrc/transport/shm/segment.h)
// and the same-GPU signal page (csrc/gpu/platform/stream_signals.h) are made
// of. Here, below both, so the collectives need no transport header for it.

#include <cstddef>
#include <string>

namespace ringdist {

class SharedMapping {
 public:
  // A new object of `bytes` (zero-filled, mode 0600) under a fresh,
  // unguessable name, mapped. This process owns the name: it unlinks it in
  // unlinkName(), or at the latest when the mapping ends.
  static SharedMapping create(size_t bytes);
  // One that a peer created, mapped whole if at least minBytes long.
  static SharedMapping open(const std::string& name, size_t minBytes);

  SharedMapping() = default;
  SharedMapping(SharedMapping&& other) noexcept;
  SharedMapping& operator=(SharedMapping&& other) noexcept;
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;
  ~SharedMapping();

  void* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }
  void unlinkName();  // idempotent; the mapping stays valid

 private:
  std::string name_;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  bool linked_ = false;  // created here, name not yet unlinked
};

// Any process: removes the name of a shared-memory object (the object lives on while mapped);
// nothing when it is already gone.
void removeSharedName(const std::string& name);

// The whole of the shared memory behind `fd` (named `name` in errors),
// mapped if at least minBytes long; closes fd. Throws Error.
void* mapShared(int fd, size_t minBytes, size_t* bytes, const std::string& name);

}  // namespace ringdist
