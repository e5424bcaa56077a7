// Data-parallel training from C++ (LibTorch) on ringdist: a small MLP learns a
// synthetic regression task. Every rank takes its share of each global batch
// and torch_ringdist::DataParallel averages the gradients, so the trained
// parameters equal a one-process run's (float64: to rounding).
//
//   ./ringdist_train                                            one process
//   torchrun --no-python --nproc-per-node 2 ./ringdist_train
//   mpirun -n 2 ./ringdist_train            (one host; across hosts add -x MASTER_ADDR -x MASTER_PORT)
//   RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 ./ringdist_train &
//   RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 ./ringdist_train
//
// Options: --steps N (300), --batch B (96, the global batch), --lr X (0.05),
// --accumulate K (1: backward on K micro-batches per step, one gradient
// synchronization), --codec fp16|bf16|int8 (compressed gradients; needs
// --dtype float32), --dtype float64|float32 (float64), --out FILE (rank 0
// writes the trained parameters there, one number per line).
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <torch_ringdist/data_parallel.h>
#include <torch_ringdist/ringdist.h>

namespace {

struct Args {
  int steps = 300;
  int batch = 96;
  double lr = 0.05;
  int accumulate = 1;
  std::string codec;
  std::string dtype = "float64";
  std::string out;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    TORCH_CHECK(i + 1 < argc, "ringdist_train: ", flag, " needs a value");
    const char* value = argv[++i];
    if (flag == "--steps") a.steps = std::stoi(value);
    else if (flag == "--batch") a.batch = std::stoi(value);
    else if (flag == "--lr") a.lr = std::stod(value);
    else if (flag == "--accumulate") a.accumulate = std::stoi(value);
    else if (flag == "--codec") a.codec = value;
    else if (flag == "--dtype") a.dtype = value;
    else if (flag == "--out") a.out = value;
    else TORCH_CHECK(false, "ringdist_train: unknown option ", flag);
  }
  TORCH_CHECK(a.dtype == "float64" || a.dtype == "float32", "ringdist_train: --dtype float64 or float32");
  return a;
}

int train(const Args& args) {
  const auto launch = torch_ringdist::launchFromEnvironment();
  auto group = torch_ringdist::init();
  const int rank = group->getRank();
  const int size = group->getSize();
  const int perRank = args.batch / size;
  TORCH_CHECK(args.batch % (size * args.accumulate) == 0, "ringdist_train: --batch ", args.batch,
              " must divide into ", size, " ranks x ", args.accumulate, " micro-batches");
  const auto dtype = args.dtype == "float64" ? torch::kFloat64 : torch::kFloat32;

  // Each rank initializes differently on purpose: DataParallel starts every
  // rank from rank 0's values.
  torch::manual_seed(100 + rank);
  torch::nn::Sequential model(torch::nn::Linear(8, 32), torch::nn::Tanh(), torch::nn::Linear(32, 1));
  model->to(dtype);
  torch_ringdist::DataParallelOptions options;
  options.codec = args.codec;
  torch_ringdist::DataParallel dp(group, model->parameters(), options);

  // The same data on every rank: y = sin(x . w) + noise.
  torch::manual_seed(1234);
  const int64_t rows = 4096;
  torch::Tensor x = torch::randn({rows, 8}, dtype);
  torch::Tensor y = torch::sin(x.matmul(torch::randn({8, 1}, dtype))) + 0.05 * torch::randn({rows, 1}, dtype);

  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(args.lr).momentum(0.9));
  const int micro = perRank / args.accumulate;
  for (int step = 0; step < args.steps; ++step) {
    // This rank's slice of the global batch, in micro-batches.
    const int64_t first = (static_cast<int64_t>(step) * args.batch + rank * perRank) % rows;
    optimizer.zero_grad();
    for (int k = 0; k < args.accumulate; ++k) {
      torch::Tensor index = (torch::arange(micro) + first + k * micro).remainder(rows);
      torch::Tensor loss = torch::mse_loss(model->forward(x.index_select(0, index)),
                                           y.index_select(0, index)) / args.accumulate;
      loss.backward();
    }
    dp.synchronizeGradients();
    optimizer.step();
    if (rank == 0 && (step % 100 == 0 || step == args.steps - 1)) {
      torch::NoGradGuard noGrad;
      std::printf("step %4d  loss %.6f\n", step, torch::mse_loss(model->forward(x), y).item<double>());
    }
  }

  if (rank == 0) {
    std::printf("trained on %d rank(s) (%s)%s%s\n", size, launch.launcher.c_str(),
                args.codec.empty() ? "" : ", gradients as ", args.codec.c_str());
    if (!args.out.empty()) {
      std::ofstream out(args.out);
      for (const auto& p : model->parameters()) {
        torch::Tensor flat = p.detach().to(torch::kFloat64).flatten();
        for (int64_t i = 0; i < flat.numel(); ++i) {
          char text[40];
          std::snprintf(text, sizeof(text), "%.17g\n", flat[i].item<double>());
          out << text;
        }
      }
    }
  }
  torch_ringdist::shutdown(group);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return train(parse(argc, argv));
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "ringdist_train: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ringdist_train: %s\n", e.what());
  }
  return 1;
}
