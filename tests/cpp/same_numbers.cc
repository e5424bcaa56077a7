// same_numbers A B [RTOL]: the numbers in text files A and B agree, as many of
// them and each within RTOL (default 1e-9) relative to the larger magnitude
// (absolute below 1). Prints the largest difference.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <vector>

static std::vector<double> readNumbers(const char* path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "same_numbers: cannot read %s\n", path);
    std::exit(2);
  }
  std::vector<double> out;
  double x;
  while (in >> x) out.push_back(x);
  return out;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: same_numbers A B [RTOL]\n");
    return 2;
  }
  const double rtol = argc > 3 ? std::atof(argv[3]) : 1e-9;
  const auto a = readNumbers(argv[1]);
  const auto b = readNumbers(argv[2]);
  if (a.size() != b.size() || a.empty()) {
    std::printf("%zu numbers in %s, %zu in %s\n", a.size(), argv[1], b.size(), argv[2]);
    return 1;
  }
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = std::max({1.0, std::fabs(a[i]), std::fabs(b[i])});
    const double diff = std::fabs(a[i] - b[i]) / scale;
    if (!(diff <= worst)) {  // NaN counts as the worst
      worst = diff;
      at = i;
    }
  }
  std::printf("%zu numbers, largest relative difference %.3g (number %zu: %.17g vs %.17g)\n",
              a.size(), worst, at, a[at], b[at]);
  return worst <= rtol ? 0 : 1;
}
