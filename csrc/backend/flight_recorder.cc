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

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

c10::impl::GenericDict newDict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

c10::impl::GenericList newList() { return c10::impl::GenericList(c10::AnyType::get()); }

c10::IValue sizesList(const std::vector<std::vector<int64_t>>& sizes) {
  auto list = newList();
  for (const auto& s : sizes) list.push_back(c10::IValue(s));
  return list;
}

c10::IValue stringList(const std::vector<std::string>& strings) {
  auto list = newList();
  for (const auto& s : strings) list.push_back(c10::IValue(s));
  return list;
}

}  // namespace

FlightRecorder::FlightRecorder(size_t capacity, std::string dumpPrefix)
    : capacity_(capacity), dumpPrefix_(std::move(dumpPrefix)) {}

uint64_t FlightRecorder::add(const std::string& name, uint64_t seq, bool p2p,
                             const std::vector<at::Tensor>& inputs,
                             const std::vector<at::Tensor>& outputs, int64_t timeoutMs) {
  if (capacity_ == 0) return 0;
  Entry e;
  e.seq = seq;
  e.p2p = p2p;
  e.name = name;
  for (const auto& t : inputs) {
    e.inSizes.push_back(t.sizes().vec());
    e.inDtypes.emplace_back(c10::toString(t.scalar_type()));
  }
  for (const auto& t : outputs) {
    e.outSizes.push_back(t.sizes().vec());
    e.outDtypes.emplace_back(c10::toString(t.scalar_type()));
  }
  e.createdNs = nowNs();
  e.timeoutMs = timeoutMs;
  std::lock_guard<std::mutex> lock(mutex_);
  e.id = nextId_++;
  entries_.push_back(std::move(e));
  if (entries_.size() > capacity_) entries_.pop_front();
  return entries_.back().id;
}

FlightRecorder::Entry* FlightRecorder::find(uint64_t id) {
  // Ids are consecutive: the entry sits at a fixed offset from the oldest kept.
  if (entries_.empty() || id < entries_.front().id) return nullptr;
  const uint64_t offset = id - entries_.front().id;
  return offset < entries_.size() ? &entries_[offset] : nullptr;
}

void FlightRecorder::started(uint64_t id) { mark(id, "started", &Entry::startedNs); }

void FlightRecorder::completed(uint64_t id) { mark(id, "completed", &Entry::completedNs); }

void FlightRecorder::mark(uint64_t id, const char* state, int64_t Entry::*stamp) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(id)) {
    e->state = state;
    e->*stamp = nowNs();
  }
}

std::string FlightRecorder::pickled(const Group& group) const {
  auto entries = newList();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& e : entries_) {
      auto d = newDict();
      d.insert("record_id", static_cast<int64_t>(e.id));
      d.insert("pg_id", int64_t{0});
      d.insert("process_group", c10::ivalue::Tuple::create(group.uid, group.desc));
      d.insert("collective_seq_id", static_cast<int64_t>(e.p2p ? 0 : e.seq));
      d.insert("p2p_seq_id", static_cast<int64_t>(e.p2p ? e.seq : 0));
      d.insert("op_id", static_cast<int64_t>(e.seq));
      d.insert("profiling_name", std::string(kNamePrefix) + e.name);
      d.insert("time_created_ns", e.createdNs);
      d.insert("input_sizes", sizesList(e.inSizes));
      d.insert("input_dtypes", stringList(e.inDtypes));
      d.insert("output_sizes", sizesList(e.outSizes));
      d.insert("output_dtypes", stringList(e.outDtypes));
      d.insert("state", e.state);
      d.insert("time_discovered_started_ns",
               e.startedNs ? c10::IValue(e.startedNs) : c10::IValue());
      d.insert("time_discovered_completed_ns",
               e.completedNs ? c10::IValue(e.completedNs) : c10::IValue());
      d.insert("duration_ms", e.completedNs && e.startedNs
                                  ? c10::IValue(static_cast<double>(e.completedNs - e.startedNs) / 1e6)
                                  : c10::IValue());
      d.insert("retired", e.state == "completed");
      d.insert("timeout_ms", e.timeoutMs);
      d.insert("is_p2p", e.p2p);
      d.insert("frames", newList());
      entries.push_back(d);
    }
  }
  std::vector<int64_t> ranks;
  for (int r = 0; r < group.size; ++r) ranks.push_back(r);
  auto config = newDict();
  config.insert("name", group.uid);
  config.insert("desc", group.desc);
  config.insert("ranks", "[" + c10::Join(", ", ranks) + "]");
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
