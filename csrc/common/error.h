#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ringdist {

// Every failure inside the engine is an Error. The backend turns it into a
// c10::DistBackendError so Python sees torch.distributed.DistBackendError.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// The deadline of an operation passed. Message always contains "Timed out".
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& what) : Error(what) {}
};

namespace detail {
inline void appendAll(std::ostringstream&) {}
template <typename T, typename... Rest>
void appendAll(std::ostringstream& os, const T& first, const Rest&... rest) {
  os << first;
  appendAll(os, rest...);
}
}  // namespace detail

template <typename... Args>
std::string strCat(const Args&... args) {
  std::ostringstream os;
  detail::appendAll(os, args...);
  return os.str();
}

}  // namespace ringdist

// The one error-check macro. Callers pass a message that names the operation,
// this rank and the peer: "ringdist allreduce: rank 2 expected ... from rank 1".
#define RINGDIST_CHECK(cond, ...)                         \
  do {                                                    \
    if (!(cond)) {                                        \
      throw ::ringdist::Error(::ringdist::strCat(__VA_ARGS__)); \
    }                                                     \
  } while (0)

#define RINGDIST_FAIL(...) throw ::ringdist::Error(::ringdist::strCat(__VA_ARGS__))
