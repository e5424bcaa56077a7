#include "csrc/backend/flight_recorder.h"

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <chrono>
#include <fstream>

#include "csrc/common/error.h"
#include "csrc/common/logging.h"

namespace ringdist {

namespace {

// torch's dump format version (FlightRecorder.hpp's version_val) that the
// analyser of torch 2.11-2.14 reads.
constexpr const char* kDumpVersion = "2.10";
// The analyser of torch <= 2.13 accepts only known backend names before the
// op name; ringdist is a CPU backend with gloo's semantics.
constexpr const char* kNamePrefix = "gloo:";

template <typename TimePoint>
int64_t nsSinceEpoch(TimePoint time) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(time.time_since_epoch()).count();
}

c10::impl::GenericDict newDict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

c10::impl::GenericList newList() { return c10::impl::GenericList(c10::AnyType::get()); }

c10::IValue sizesList(const c10::SmallVector<int64_t, 4>& dims) {
  auto list = newList();
  for (size_t i = 0; i < dims.size(); i += 1 + static_cast<size_t>(dims[i])) {
    list.push_back(c10::IValue(std::vector<int64_t>(dims.begin() + i + 1,
                                                    dims.begin() + i + 1 + dims[i])));
  }
  return list;
}

c10::IValue dtypeList(const c10::SmallVector<c10::ScalarType, 1>& dtypes) {
  auto list = newList();
  for (auto t : dtypes) list.push_back(c10::IValue(std::string(c10::toString(t))));
  return list;
}

const char* stateName(int state) {
  static const char* const kNames[] = {"scheduled", "started", "completed"};
  return kNames[state];
}

}  // namespace

FlightRecorder::FlightRecorder(size_t capacity, std::string dumpPrefix)
    : capacity_(capacity),
      dumpPrefix_(std::move(dumpPrefix)),
      wallMinusSteadyNs_(nsSinceEpoch(std::chrono::system_clock::now()) -
                         nsSinceEpoch(std::chrono::steady_clock::now())),
      slots_(capacity) {}

namespace {

void describe(const std::vector<at::Tensor>& tensors, FlightRecorder::Shapes* shapes) {
  shapes->dims.clear();
  shapes->dtypes.clear();
  for (const auto& t : tensors) {
    shapes->dims.push_back(t.dim());
    shapes->dims.append(t.sizes().begin(), t.sizes().end());
    shapes->dtypes.push_back(t.scalar_type());
  }
}

}  // namespace

uint64_t FlightRecorder::add(const char* name, uint64_t seq, int peer,
                             const std::vector<at::Tensor>& inputs,
                             const std::vector<at::Tensor>& outputs, int64_t timeoutMs) {
  if (capacity_ == 0) return 0;
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t id = nextId_++;
  Entry& e = slots_[id % capacity_];
  e.id = id;
  e.seq = seq;
  e.peer = peer;
  e.name = name;
  describe(inputs, &e.in);
  describe(outputs, &e.out);
  e.state = State::kScheduled;
  e.createdNs = e.startedNs = e.completedNs = 0;
  e.timeoutMs = timeoutMs;
  return id;
}

FlightRecorder::Entry* FlightRecorder::find(uint64_t id) {
  // Overwritten slots hold newer ids: an old record's marks are dropped.
  Entry& e = slots_[id % capacity_];
  return e.id == id && id < nextId_ ? &e : nullptr;
}

void FlightRecorder::queued(uint64_t id, Time at) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(id)) e->createdNs = wallNs(at);
}

void FlightRecorder::started(uint64_t id, Time at) { mark(id, State::kStarted, &Entry::startedNs, at); }

void FlightRecorder::completed(uint64_t id, Time at) {
  mark(id, State::kCompleted, &Entry::completedNs, at);
}

void FlightRecorder::mark(uint64_t id, State state, int64_t Entry::*stamp, Time at) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(id)) {
    e->state = state;
    e->*stamp = wallNs(at);
    if (e->createdNs == 0) e->createdNs = e->*stamp;  // run as soon as issued
  }
}

// torch names a send "send 0->1" and a receive "recv 1<-0" (own rank first).
std::string FlightRecorder::profilingName(const Entry& e, int rank) const {
  std::string name = std::string(kNamePrefix) + e.name;
  if (e.peer == kCollective) return name;
  const std::string peer = e.peer == kAnySource ? "?" : std::to_string(e.peer);
  return name + " " + std::to_string(rank) + (std::string(e.name) == "send" ? "->" : "<-") + peer;
}

std::string FlightRecorder::pickled(const Group& group) const {
  auto entries = newList();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t first = nextId_ > capacity_ ? nextId_ - capacity_ : 0;
    for (uint64_t id = first; id < nextId_; ++id) {
      const Entry& e = slots_[id % capacity_];
      const bool p2p = e.peer != kCollective;
      auto d = newDict();
      d.insert("record_id", static_cast<int64_t>(e.id));
      d.insert("pg_id", int64_t{0});
      d.insert("process_group", c10::ivalue::Tuple::create(group.uid, group.desc));
      d.insert("collective_seq_id", static_cast<int64_t>(p2p ? 0 : e.seq));
      d.insert("p2p_seq_id", static_cast<int64_t>(p2p ? e.seq : 0));
      d.insert("op_id", static_cast<int64_t>(e.seq));
      d.insert("profiling_name", profilingName(e, group.rank));
      d.insert("time_created_ns", e.createdNs);
      d.insert("input_sizes", sizesList(e.in.dims));
      d.insert("input_dtypes", dtypeList(e.in.dtypes));
      d.insert("output_sizes", sizesList(e.out.dims));
      d.insert("output_dtypes", dtypeList(e.out.dtypes));
      d.insert("state", std::string(stateName(static_cast<int>(e.state))));
      d.insert("time_discovered_started_ns",
               e.startedNs ? c10::IValue(e.startedNs) : c10::IValue());
      d.insert("time_discovered_completed_ns",
               e.completedNs ? c10::IValue(e.completedNs) : c10::IValue());
      d.insert("duration_ms", e.completedNs && e.startedNs
                                  ? c10::IValue(static_cast<double>(e.completedNs - e.startedNs) / 1e6)
                                  : c10::IValue());
      d.insert("retired", e.state == State::kCompleted);
      d.insert("timeout_ms", e.timeoutMs);
      d.insert("is_p2p", p2p);
      d.insert("frames", newList());
      entries.push_back(d);
    }
  }
  std::vector<int64_t> ranks;
  for (int r = 0; r < group.size; ++r) ranks.push_back(r);
  auto config = newDict();
  config.insert("name", group.uid);
  config.insert("desc", group.desc);
  config.insert("ranks", c10::str("[", c10::Join(", ", ranks), "]"));
  auto configs = newDict();
  configs.insert(group.uid, config);
  auto dump = newDict();
  dump.insert("version", std::string(kDumpVersion));
  dump.insert("pg_config", configs);
  dump.insert("pg_status", newDict());
  dump.insert("entries", entries);
  // A plain pickle (no type tags on lists and dicts): Python's pickle.load reads it.
  std::string bytes;
  torch::jit::Pickler pickler([&](const char* data, size_t size) { bytes.append(data, size); },
                              nullptr, nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dump));
  pickler.stop();
  return bytes;
}

void FlightRecorder::dumpOnce(const Group& group, int globalRank) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (dumpPrefix_.empty() || capacity_ == 0 || dumped_) return;
    dumped_ = true;
  }
  const std::string path = dumpPrefix_ + std::to_string(globalRank);
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary);
  const std::string bytes = pickled(group);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  // Renamed when complete: the analyser never reads half a file.
  if (!out || std::rename(tmp.c_str(), path.c_str()) != 0) {
    logWarning(strCat("ringdist: rank ", group.rank, ": could not write the trace to ", path));
    return;
  }
  logWarning(strCat("ringdist: rank ", group.rank, ": wrote the group's last operations to ", path,
                    " (analyse all ranks' files with: python -m "
                    "torch.distributed.flight_recorder.fr_trace DIR -p PREFIX)"));
}

}  // namespace ringdist
