// The C++ API with ranks as threads of one process, meeting through a
// c10d::HashStore: groups of 1, 2 and 3 ranks run every collective of the
// c10d API, the compressed allreduce, statistics and DataParallel, each
// result checked against its closed form; then the launch environment, bad
// settings and bad input. Exit code 0 when every case passed.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include <torch_ringdist/data_parallel.h>
#include <torch_ringdist/ringdist.h>

#include "check.h"

using check::contains;
using check::errorOf;
using Group = c10::intrusive_ptr<c10d::ProcessGroup>;

namespace {

constexpr auto kTimeout = std::chrono::seconds(60);

std::string messageOf(const std::exception& e) {
  if (auto* c10 = dynamic_cast<const c10::Error*>(&e)) return c10->what_without_backtrace();
  return e.what();
}

// Runs body(rank, group) on `size` threads, one rank each, over one store.
// A failing rank aborts its group, so its peers fail at once instead of
// waiting for the timeout; the first failure is rethrown, naming its rank.
void runWorld(int size, const std::function<void(int, const Group&)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      Group group;
      try {
        group = torch_ringdist::createProcessGroup(store, rank, size, kTimeout);
        body(rank, group);
        torch_ringdist::shutdown(group);
      } catch (const std::exception& e) {
        errors[rank] = messageOf(e);
        if (group) group->abort();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < size; ++rank) {
    if (!errors[rank].empty()) {
      throw std::runtime_error(check::join("world of ", size, ", rank ", rank, ": ", errors[rank]));
    }
  }
}

void wait(const c10::intrusive_ptr<c10d::Work>& work) {
  work->wait();
}

bool same(const at::Tensor& a, const at::Tensor& b) { return a.sizes() == b.sizes() && at::equal(a, b); }

// ---------------------------------------------------------------- collectives

void allreduceCases(int rank, int size, const Group& group) {
  // Small (one round) and large (ring or single copy) buffers.
  for (int64_t n : {int64_t{7}, int64_t{1} << 20}) {
    at::Tensor x = at::arange(n, at::kFloat).remainder(7) + rank;
    std::vector<at::Tensor> tensors{x};
    wait(group->allreduce(tensors));
    at::Tensor want = (at::arange(n, at::kFloat).remainder(7) * size) + size * (size - 1) / 2;
    EXPECT(same(x, want), "float32 SUM of ", n, " elements");
  }
  at::Tensor d = at::full({1000}, static_cast<double>(rank + 1), at::kDouble);
  std::vector<at::Tensor> doubles{d};
  c10d::AllreduceOptions avg;
  avg.reduceOp = c10d::ReduceOp::AVG;
  wait(group->allreduce(doubles, avg));
  EXPECT(same(d, at::full({1000}, (size + 1) / 2.0, at::kDouble)), "float64 AVG");
  at::Tensor l = at::full({33}, static_cast<int64_t>(rank), at::kLong);
  std::vector<at::Tensor> longs{l};
  c10d::AllreduceOptions max;
  max.reduceOp = c10d::ReduceOp::MAX;
  wait(group->allreduce(longs, max));
  EXPECT(same(l, at::full({33}, static_cast<int64_t>(size - 1), at::kLong)), "int64 MAX");
}

void rootedAndGatherCases(int rank, int size, const Group& group) {
  const int root = size - 1;
  at::Tensor b = at::full({4, 5}, static_cast<float>(rank), at::kFloat);
  std::vector<at::Tensor> bs{b};
  c10d::BroadcastOptions bopts;
  bopts.rootRank = root;
  wait(group->broadcast(bs, bopts));
  EXPECT(same(b, at::full({4, 5}, static_cast<float>(root), at::kFloat)), "broadcast from ", root);

  at::Tensor in = at::full({3}, static_cast<float>(rank), at::kFloat);
  std::vector<std::vector<at::Tensor>> lists{std::vector<at::Tensor>(size)};
  for (auto& t : lists[0]) t = at::empty({3}, at::kFloat);
  std::vector<at::Tensor> inputs{in};
  wait(group->allgather(lists, inputs));
  for (int r = 0; r < size; ++r) {
    EXPECT(same(lists[0][r], at::full({3}, static_cast<float>(r), at::kFloat)), "allgather list ", r);
  }

  // Rank r contributes r + 1 to every block: block b sums to size (size + 1) / 2 + b * size.
  std::vector<at::Tensor> scattered{at::empty({2}, at::kFloat)};
  std::vector<std::vector<at::Tensor>> blocks{std::vector<at::Tensor>(size)};
  for (int b = 0; b < size; ++b) blocks[0][b] = at::full({2}, static_cast<float>(b + rank + 1), at::kFloat);
  wait(group->reduce_scatter(scattered, blocks));
  const float want = size * (size + 1) / 2.0f + rank * size;
  EXPECT(same(scattered[0], at::full({2}, want, at::kFloat)), "reduce_scatter block ", rank);

  wait(group->barrier());

  if (size > 1) {  // a ring of point-to-point messages
    std::vector<at::Tensor> sent{at::full({6}, static_cast<float>(rank), at::kFloat)};
    std::vector<at::Tensor> got{at::empty({6}, at::kFloat)};
    auto send = group->send(sent, (rank + 1) % size, 3);
    wait(group->recv(got, (rank + size - 1) % size, 3));
    wait(send);
    EXPECT(same(got[0], at::full({6}, static_cast<float>((rank + size - 1) % size), at::kFloat)),
          "recv from the left neighbour");
  }
}

// Compressed allreduce: small integers survive fp16 (power-of-two block
// scales) and bf16 exactly; int8 stays within its two roundings of the exact
// sum. `results` collects each rank's int8 result: identical on every rank.
void compressedCases(int rank, int size, const Group& group, std::vector<at::Tensor>& results) {
  const int64_t n = 3000;
  at::Tensor base = at::arange(n, at::kFloat).remainder(5);
  for (const char* codec : {"fp16", "bf16"}) {
    at::Tensor x = base + rank;
    wait(torch_ringdist::allreduceCompressed(group, x, codec));
    EXPECT(same(x, base * size + size * (size - 1) / 2), codec, " SUM of small integers");
  }
  at::Tensor y = at::sin(at::arange(n, at::kDouble) * 0.01 + rank).to(at::kFloat);
  at::Tensor exact = at::zeros({n}, at::kDouble);
  for (int r = 0; r < size; ++r) exact += at::sin(at::arange(n, at::kDouble) * 0.01 + r).to(at::kFloat).to(at::kDouble);
  wait(torch_ringdist::allreduceCompressed(group, y, "int8", /*average=*/true));
  const double bound = (size + 1) / 127.0;  // |x| <= 1: each rank's and the sum's half steps
  const double err = (y.to(at::kDouble) - exact / size).abs().max().item<double>();
  EXPECT(err <= bound, "int8 AVG error ", err, " above ", bound);
  results[rank] = y;
  EXPECT(torch_ringdist::stats(group).at("compressed_allreduce/int8").calls == 1,
        "the int8 call is counted");
}

void statsCases(int rank, int size, const Group& group) {
  torch_ringdist::resetStats(group);
  std::vector<at::Tensor> tensors{at::ones({256}, at::kFloat)};
  wait(group->allreduce(tensors));
  auto stats = torch_ringdist::stats(group);
  EXPECT(stats.count("allreduce") == 1 && stats["allreduce"].calls == 1, "one allreduce counted");
  EXPECT(stats["allreduce"].payloadBytes == 1024, "payload ", stats["allreduce"].payloadBytes);
  EXPECT(size == 1 || stats["allreduce"].bytesSent > 0, "bytes sent");
}

// ---------------------------------------------------------------- DataParallel

void dataParallelCases(int rank, int size, const Group& group, std::vector<at::Tensor>& codecResults) {
  // Different values on each rank: the constructor gives every rank rank 0's.
  at::Tensor w = at::full({3, 4}, static_cast<double>(rank + 1), at::kDouble).requires_grad_();
  at::Tensor b = at::full({5}, static_cast<double>(10 * (rank + 1)), at::kDouble).requires_grad_();
  at::Tensor frozen = at::full({2}, static_cast<double>(rank), at::kDouble);  // no grad
  torch_ringdist::DataParallelOptions tiny;
  tiny.bucketBytes = 40;  // several buckets
  torch_ringdist::DataParallel dp(group, {w, b, frozen}, tiny);
  EXPECT(same(w, at::ones({3, 4}, at::kDouble)) && same(b, at::full({5}, 10.0, at::kDouble)),
        "parameters are rank 0's after construction");
  EXPECT(same(frozen, at::zeros({2}, at::kDouble)), "frozen parameters are broadcast too");

  // Gradients r + 1 average to (size + 1) / 2; b has a gradient only on ranks
  // > 0 (zeros elsewhere), so its mean is sum_{r>0} (r + 1) / size.
  w.mutable_grad() = at::full({3, 4}, static_cast<double>(rank + 1), at::kDouble);
  if (rank > 0) b.mutable_grad() = at::full({5}, static_cast<double>(rank + 1), at::kDouble);
  dp.synchronizeGradients();
  EXPECT(same(w.grad(), at::full({3, 4}, (size + 1) / 2.0, at::kDouble)), "mean gradient");
  const double bMean = (size * (size + 1) / 2.0 - 1.0) / size;
  EXPECT(b.grad().defined() && same(b.grad(), at::full({5}, bMean, at::kDouble)),
        "a missing gradient counts as zeros");
  EXPECT(!frozen.grad().defined(), "frozen parameters get no gradient");

  // Accumulation: two backward passes, one synchronization.
  at::Tensor v = at::zeros({4}, at::kFloat).requires_grad_();
  torch_ringdist::DataParallel accumulate(group, {v});
  for (int micro = 0; micro < 2; ++micro) {
    ((v + 1) * static_cast<float>(rank + micro)).sum().backward();
  }
  accumulate.synchronizeGradients();
  const float accumulated = (2.0f * (size * (size - 1) / 2.0f) + size) / size;  // mean of 2r + 1
  EXPECT(same(v.grad(), at::full({4}, accumulated, at::kFloat)), "accumulated gradients");

  torch_ringdist::DataParallelOptions int8;
  int8.codec = "int8";
  at::Tensor c = at::zeros({1000}, at::kFloat).requires_grad_();
  torch_ringdist::DataParallel compressed(group, {c}, int8);
  c.mutable_grad() = at::cos(at::arange(1000, at::kFloat) * 0.1f + rank);
  compressed.synchronizeGradients();
  at::Tensor exact = at::zeros({1000}, at::kFloat);
  for (int r = 0; r < size; ++r) exact += at::cos(at::arange(1000, at::kFloat) * 0.1f + r);
  const double err = (c.grad() - exact / size).abs().max().item<double>();
  EXPECT(err <= (size + 1) / 127.0, "int8 DataParallel error ", err);
  codecResults[rank] = c.grad().clone();

  const std::string wrongType = errorOf([&] {
    torch_ringdist::DataParallel bad(group, {at::zeros({2}, at::kDouble).requires_grad_()}, int8);
  });
  EXPECT(contains(wrongType, "codec 'int8' takes float32") && contains(wrongType, "Double"), wrongType);
}

// ---------------------------------------------------------------- errors

void badInputCases(int rank, int size, const Group& group) {
  std::vector<at::Tensor> complex{at::zeros({4}, at::kComplexFloat)};
  const std::string unsupported = errorOf([&] { group->allreduce(complex); });
  EXPECT(contains(unsupported, "ringdist allreduce: rank " + std::to_string(rank)) &&
            contains(unsupported, "unsupported dtype"),
        unsupported);
  std::vector<at::Tensor> one{at::zeros({4}, at::kFloat)};
  const std::string badCodec =
      errorOf([&] { torch_ringdist::allreduceCompressed(group, one[0], "int2"); });
  EXPECT(contains(badCodec, "int2"), badCodec);
  if (size > 1) {
    // Ranks disagree on the count: every rank gets an error naming the op, none hangs.
    std::vector<at::Tensor> mismatched{at::zeros({10 + rank}, at::kFloat)};
    const auto start = std::chrono::steady_clock::now();
    const std::string mismatch = errorOf([&] { group->allreduce(mismatched)->wait(); });
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT(contains(mismatch, "allreduce"), mismatch);
    EXPECT(took < std::chrono::seconds(20), "the mismatch took ",
          std::chrono::duration_cast<std::chrono::seconds>(took).count(), " s to fail");
  }
}

// ---------------------------------------------------------------- launch environment

const char* kLaunchVariables[] = {
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "RANK",
    "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK",
    "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"};

// Sets exactly `vars` among the launch variables for the call.
torch_ringdist::Launch launchWith(const std::vector<std::pair<const char*, const char*>>& vars) {
  struct Unset {
    ~Unset() {
      for (const char* name : kLaunchVariables) unsetenv(name);
    }
  } unset;
  for (const char* name : kLaunchVariables) unsetenv(name);
  for (const auto& [name, value] : vars) setenv(name, value, 1);
  return torch_ringdist::launchFromEnvironment();
}

void launchCases() {
  auto none = launchWith({});
  EXPECT(none.launcher == "none" && none.rank == 0 && none.size == 1, none.launcher);

  auto torchrun = launchWith({{"TORCHELASTIC_RUN_ID", "x"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                              {"TORCHELASTIC_RESTART_COUNT", "2"}, {"RANK", "3"},
                              {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "h"},
                              {"MASTER_PORT", "1234"}});
  EXPECT(torchrun.launcher == "torchrun" && torchrun.rank == 3 && torchrun.size == 4 &&
            torchrun.localRank == 1 && torchrun.agentStore && torchrun.masterAddr == "h" &&
            torchrun.masterPort == 1234 && torchrun.storePrefix == "/worker/attempt_2",
        torchrun.launcher, " ", torchrun.storePrefix);

  auto mpi = launchWith({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT(mpi.launcher == "mpirun" && mpi.rank == 1 && mpi.size == 2 && !mpi.agentStore &&
            mpi.masterAddr == "127.0.0.1" && mpi.masterPort == 29500,
        mpi.launcher, " ", mpi.masterAddr, ":", mpi.masterPort);
  const std::string spread = errorOf([] {
    launchWith({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  });
  EXPECT(contains(spread, "MASTER_ADDR is not set"), spread);

  auto hydra = launchWith({{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}, {"MASTER_ADDR", "a"},
                           {"MASTER_PORT", "99"}});
  EXPECT(hydra.launcher == "mpirun" && hydra.rank == 2 && hydra.localRank == -1, hydra.launcher);

  auto byHand = launchWith({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"},
                            {"MASTER_PORT", "29511"}});
  EXPECT(byHand.launcher == "env" && byHand.rank == 1 && byHand.masterPort == 29511, byHand.launcher);
  const std::string outOfRange = errorOf([] {
    launchWith({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}});
  });
  EXPECT(contains(outOfRange, "RANK='2' is not an integer in [0, 1]"), outOfRange);
  const std::string badPort = errorOf([] {
    launchWith({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "http"}});
  });
  EXPECT(contains(badPort, "MASTER_PORT='http'"), badPort);

  // One process with nothing set: a working group of one.
  auto group = torch_ringdist::init();
  std::vector<at::Tensor> t{at::full({3}, 5.0f, at::kFloat)};
  group->allreduce(t)->wait();
  EXPECT(same(t[0], at::full({3}, 5.0f, at::kFloat)) && group->getSize() == 1, "group of one");
  torch_ringdist::shutdown(group);
}

void settingsCases() {
  auto store = c10::make_intrusive<c10d::HashStore>();
  setenv("RINGDIST_SEGMENT_BYTES", "lots", 1);
  const std::string badSetting = errorOf([&] { torch_ringdist::createBackend(store, 0, 1); });
  unsetenv("RINGDIST_SEGMENT_BYTES");
  EXPECT(contains(badSetting, "ringdist init: rank 0") && contains(badSetting, "RINGDIST_SEGMENT_BYTES"),
        badSetting);
  const std::string badRank = errorOf([&] { torch_ringdist::createBackend(store, 2, 2); });
  EXPECT(contains(badRank, "rank 2 is not in a group of 2 ranks"), badRank);
  const std::string badTimeout =
      errorOf([&] { torch_ringdist::createBackend(store, 0, 1, std::chrono::milliseconds(0)); });
  EXPECT(contains(badTimeout, "timeout must be > 0"), badTimeout);
}

struct Case {
  std::string name;
  std::function<void()> run;
};

}  // namespace

int main() {
  at::set_num_threads(1);
  std::vector<Case> cases;
  for (int size : {1, 2, 3}) {
    const std::string world = " (" + std::to_string(size) + " ranks)";
    cases.push_back({"collectives" + world, [size] {
      std::vector<at::Tensor> int8(size), dp(size);
      runWorld(size, [&](int rank, const Group& group) {
        EXPECT(group->getRank() == rank && group->getSize() == size, "group rank and size");
        allreduceCases(rank, size, group);
        rootedAndGatherCases(rank, size, group);
        compressedCases(rank, size, group, int8);
        statsCases(rank, size, group);
        dataParallelCases(rank, size, group, dp);
      });
      for (int r = 1; r < size; ++r) {
        EXPECT(same(int8[r], int8[0]) && same(dp[r], dp[0]), "compressed results of rank ", r,
              " differ from rank 0's");
      }
    }});
    cases.push_back({"bad input" + world, [size] { runWorld(size, [size](int rank, const Group& group) { badInputCases(rank, size, group); }); }});
  }
  cases.push_back({"launch environment", launchCases});
  cases.push_back({"settings", settingsCases});

  int failed = 0;
  for (const auto& c : cases) {
    try {
      c.run();
      std::printf("ok      %s\n", c.name.c_str());
    } catch (const std::exception& e) {
      ++failed;
      std::printf("FAILED  %s: %s\n", c.name.c_str(), messageOf(e).c_str());
    }
    std::fflush(stdout);
  }
  std::printf("%zu cases, %d failed\n", cases.size(), failed);
  return failed == 0 ? 0 : 1;
}
