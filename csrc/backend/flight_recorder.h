#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace ringdist {

// A group's last operations (bounded), for post-mortems: what each rank had
// issued, started and finished when something went wrong. Written in the
// format of torch's flight recorder, so torch's analyser
// (python -m torch.distributed.flight_recorder.fr_trace DIR) matches the
// ranks' records and names the first operation where they disagree.
class FlightRecorder {
 public:
  struct Group {
    std::string uid;   // torch's group name ("0" for the default group)
    std::string desc;  // "default_pg", ...
    int rank = 0;
    int size = 1;
  };

  explicit FlightRecorder(size_t capacity, std::string dumpPrefix);

  // A collective (seq: the group's collective count; name: a string literal)
  // or, with peer >= 0 or kAnySource, a send or receive (seq: its
  // point-to-point count; the name then says which, e.g. "send"). Returns
  // its record id. Called on every operation: nothing is allocated once the
  // slots are warm, and no clock is read: the times come from the worker's
  // readings (a clock read costs ~40 ns here, an op ~5 us), and a record is
  // created when it starts unless queued() said it waited first.
  using Time = std::chrono::steady_clock::time_point;
  static constexpr int kCollective = -1;
  static constexpr int kAnySource = -2;
  uint64_t add(const char* name, uint64_t seq, int peer, const std::vector<at::Tensor>& inputs,
               const std::vector<at::Tensor>& outputs, int64_t timeoutMs);
  void queued(uint64_t id, Time at);
  void started(uint64_t id, Time at);
  void completed(uint64_t id, Time at);

  // The records as torch's dump (a pickle of {"version", "pg_config",
  // "pg_status", "entries"}).
  std::string pickled(const Group& group) const;
  // On the first failure of the group: writes <prefix><global rank> once,
  // when a prefix was given (RINGDIST_TRACE_DUMP).
  void dumpOnce(const Group& group, int globalRank);

  // The sizes and dtypes of a list of tensors, inline in the slot for one
  // tensor of up to three dimensions (no cold heap memory touched per op).
  struct Shapes {
    c10::SmallVector<int64_t, 4> dims;  // per tensor: its dimension count, then its sizes
    c10::SmallVector<c10::ScalarType, 1> dtypes;
  };

 private:
  enum class State { kScheduled, kStarted, kCompleted };
  struct Entry {
    uint64_t id = 0;
    uint64_t seq = 0;
    int peer = kCollective;
    const char* name = "";
    Shapes in, out;
    State state = State::kScheduled;
    int64_t createdNs = 0, startedNs = 0, completedNs = 0;
    int64_t timeoutMs = 0;
  };
  Entry* find(uint64_t id);
  void mark(uint64_t id, State state, int64_t Entry::*stamp, Time at);
  // Wall-clock ns (torch's trace times) of a steady-clock reading.
  int64_t wallNs(Time at) const {
    return wallMinusSteadyNs_ +
           std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count();
  }
  std::string profilingName(const Entry& e, int rank) const;

  const size_t capacity_;
  const std::string dumpPrefix_;
  const int64_t wallMinusSteadyNs_;
  mutable std::mutex mutex_;
  std::vector<Entry> slots_;  // a ring: record id i lives in slot i % capacity
  uint64_t nextId_ = 0;       // records [max(0, nextId_ - capacity), nextId_) are kept
  bool dumped_ = false;
};

}  // namespace ringdist
