// hybridtb::Error — the one exception type of the library.
//
// Library code reports bad input (a malformed file, inconsistent metadata, an unsupported shape)
// by throwing Error with a message that names the offending field and the constraint it broke.
// Tools catch it at the top, print it and exit non-zero; tests assert on it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace hybridtb {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Raised when a backend is asked for something it does not implement (a dtype, a feature, an
// SSM mode). Kept distinct from Error so harnesses can report "not supported" instead of "failed".
class NotSupported : public Error {
 public:
  explicit NotSupported(const std::string& message) : Error(message) {}
};

// Raised when a backend's device is not on this machine (no GPU, no driver). Neither the input's
// fault nor a failed run: the tools exit with their own status for it (3) and `backends` shows it.
class DeviceUnavailable : public Error {
 public:
  explicit DeviceUnavailable(const std::string& message) : Error(message) {}
};

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail

// HYBRIDTB_CHECK(cond, "field", " must be ", value) — throws Error(concatenated message) if !cond.
#define HYBRIDTB_CHECK(cond, ...)                                   \
  do {                                                              \
    if (!(cond)) throw ::hybridtb::Error(::hybridtb::detail::concat(__VA_ARGS__)); \
  } while (0)

}  // namespace hybridtb
