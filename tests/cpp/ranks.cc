// One rank per process, started by a launcher (launch.cc, torchrun
// --no-python, mpirun): torch_ringdist::init() reads the launch environment,
// then collectives, the compressed allreduce and DataParallel are checked
// against closed forms. --launcher NAME: fail unless that launcher was seen.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdio>
#include <cstring>

#include <torch_ringdist/data_parallel.h>
#include <torch_ringdist/ringdist.h>

#include "check.h"

namespace {

bool same(const at::Tensor& a, const at::Tensor& b) { return a.sizes() == b.sizes() && at::equal(a, b); }

void run(const std::string& expectedLauncher) {
  const auto launch = torch_ringdist::launchFromEnvironment();
  EXPECT(expectedLauncher.empty() || launch.launcher == expectedLauncher, "launcher ",
        launch.launcher, ", expected ", expectedLauncher);
  auto group = torch_ringdist::init(std::chrono::seconds(60));
  const int rank = group->getRank();
  const int size = group->getSize();
  EXPECT(rank == launch.rank && size == launch.size, "group ", rank, "/", size);

  for (int64_t n : {int64_t{5}, int64_t{1} << 20}) {
    std::vector<at::Tensor> t{at::full({n}, static_cast<float>(rank + 1), at::kFloat)};
    group->allreduce(t)->wait();
    EXPECT(same(t[0], at::full({n}, size * (size + 1) / 2.0f, at::kFloat)), "allreduce of ", n);
  }
  std::vector<std::vector<at::Tensor>> gathered{std::vector<at::Tensor>(size)};
  for (auto& t : gathered[0]) t = at::empty({2}, at::kLong);
  std::vector<at::Tensor> mine{at::full({2}, static_cast<int64_t>(rank), at::kLong)};
  group->allgather(gathered, mine)->wait();
  for (int r = 0; r < size; ++r) {
    EXPECT(same(gathered[0][r], at::full({2}, static_cast<int64_t>(r), at::kLong)), "allgather ", r);
  }
  std::vector<at::Tensor> b{at::full({7}, static_cast<double>(rank), at::kDouble)};
  c10d::BroadcastOptions root;
  root.rootRank = size - 1;
  group->broadcast(b, root)->wait();
  EXPECT(same(b[0], at::full({7}, static_cast<double>(size - 1), at::kDouble)), "broadcast");

  at::Tensor c = at::arange(1000, at::kFloat).remainder(9) + rank;
  torch_ringdist::allreduceCompressed(group, c, "bf16")->wait();
  EXPECT(same(c, at::arange(1000, at::kFloat).remainder(9) * size + size * (size - 1) / 2),
        "bf16 compressed allreduce of small integers");

  at::Tensor p = at::full({10}, static_cast<double>(rank), at::kDouble).requires_grad_();
  torch_ringdist::DataParallel dp(group, {p});
  EXPECT(same(p, at::zeros({10}, at::kDouble)), "DataParallel broadcast");
  p.mutable_grad() = at::full({10}, static_cast<double>(rank), at::kDouble);
  dp.synchronizeGradients();
  EXPECT(same(p.grad(), at::full({10}, (size - 1) / 2.0, at::kDouble)), "mean gradient");

  group->barrier()->wait();
  EXPECT(torch_ringdist::stats(group).at("allreduce").calls >= 2, "allreduce statistics");
  torch_ringdist::shutdown(group);
  std::printf("rank %d of %d (%s, local rank %d): ok\n", rank, size, launch.launcher.c_str(),
              launch.localRank);
}

}  // namespace

int main(int argc, char** argv) {
  std::string launcher;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--launcher") == 0 && i + 1 < argc) launcher = argv[++i];
  }
  at::set_num_threads(1);
  try {
    run(launcher);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "FAILED: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAILED: %s\n", e.what());
    return 1;
  }
  return 0;
}
