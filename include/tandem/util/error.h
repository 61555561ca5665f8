#pragma once
// tandem's two kinds of failure. Conditions a caller can meet and recover from (a peer that never arrives,
// a wrong flag, a corrupt file) throw one of the exceptions below. Broken invariants use TANDEM_CHECK, which
// throws InternalError with file:line, the condition, the caller's message and the rank. Only main() turns
// any of these into a line for the user.
#include <sstream>
#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad input from a user or caller: flags, files, arguments, mismatched configuration across ranks.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A collective or the rendezvous failed: peer gone, connection refused, backend error.
class CommError : public Error {
 public:
  using Error::Error;
};

// A collective or the rendezvous did not complete in time.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

// An operation the chosen backend cannot do ("backend mpi does not support ..."); never a silent fallback.
class UnsupportedError : public Error {
 public:
  using Error::Error;
};

// The ranks' replicas of a model hold different values, so the ranks no longer train one model.
class ReplicaDivergenceError : public Error {
 public:
  using Error::Error;
};

// A broken invariant inside tandem (a bug), raised by TANDEM_CHECK.
class InternalError : public Error {
 public:
  using Error::Error;
};

// The first line of an error message: LibTorch's and c10d's go on with a C++ backtrace, which the one line a
// user reads leaves out.
std::string first_line(const std::string& message);

namespace detail {
std::string rank_tag();

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

[[noreturn]] void throw_check_failure(const char* file, int line, const char* condition, const std::string& message);
}  // namespace detail

}  // namespace tandem

#define TANDEM_CHECK(cond, ...)                                                                           \
  do {                                                                                                    \
    if (!(cond)) {                                                                                        \
      ::tandem::detail::throw_check_failure(__FILE__, __LINE__, #cond, ::tandem::detail::concat(__VA_ARGS__)); \
    }                                                                                                     \
  } while (false)
