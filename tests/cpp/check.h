#pragma once

// Checks for the C++ tests: a failed EXPECT throws std::runtime_error naming
// the file, line, condition and the values given; main() prints it and fails.

#include <c10/util/Exception.h>

#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>

#define EXPECT(cond, ...)                                                          \
  do {                                                                            \
    if (!(cond)) {                                                                \
      throw std::runtime_error(::check::describe(__FILE__, __LINE__, #cond,       \
                                                 ::check::join(__VA_ARGS__)));    \
    }                                                                             \
  } while (0)

namespace check {

inline std::string join() { return ""; }
template <class... Args>
std::string join(const Args&... args) {
  std::ostringstream os;
  ((os << args), ...);
  return os.str();
}

inline std::string describe(const char* file, int line, const char* cond, const std::string& what) {
  return join(file, ":", line, ": EXPECT(", cond, ") failed", what.empty() ? "" : ": ", what);
}

// The message of the c10::Error that `call` raises; fails if it raises none.
inline std::string errorOf(const std::function<void()>& call) {
  try {
    call();
  } catch (const c10::Error& e) {
    return e.msg();
  }
  throw std::runtime_error("expected a c10::Error, none was raised");
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace check
