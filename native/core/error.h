// Typed errors: every failure in native code becomes an rc::Error with a stable code, which the
// N-API layer turns into a JavaScript Error carrying `.code`. Nothing here exits or aborts.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace rc {

namespace code {
constexpr const char* kInvalidArgument = "ERR_RC_INVALID_ARGUMENT";
constexpr const char* kDisposed = "ERR_RC_DISPOSED";
constexpr const char* kOutOfMemory = "ERR_RC_OUT_OF_MEMORY";
constexpr const char* kDevice = "ERR_RC_DEVICE";
constexpr const char* kBackendUnavailable = "ERR_RC_BACKEND_UNAVAILABLE";
constexpr const char* kOneDnn = "ERR_RC_ONEDNN";
constexpr const char* kCuda = "ERR_RC_CUDA";
constexpr const char* kCudnn = "ERR_RC_CUDNN";
constexpr const char* kCublas = "ERR_RC_CUBLAS";
constexpr const char* kNccl = "ERR_RC_NCCL";
constexpr const char* kCorruptFile = "ERR_RC_CORRUPT_FILE";
constexpr const char* kInternal = "ERR_RC_INTERNAL";
// The rendezvous store or a peer process: unreachable, refused, gone, or too late.
constexpr const char* kDistributed = "ERR_RC_DISTRIBUTED";
}  // namespace code

class Error : public std::runtime_error {
 public:
  Error(std::string errorCode, const std::string& message) : std::runtime_error(message), code_(std::move(errorCode)) {}
  const std::string& code() const { return code_; }

 private:
  std::string code_;
};

[[noreturn]] void throwError(const char* errorCode, const std::string& message, const char* file, int line);

}  // namespace rc

// RC_THROW(code, a << b << c): throws rc::Error with the streamed message and the source location.
#define RC_THROW(errorCode, streamExpr)                                      \
  do {                                                                       \
    std::ostringstream rcMessageStream_;                                     \
    rcMessageStream_ << streamExpr;                                          \
    ::rc::throwError(errorCode, rcMessageStream_.str(), __FILE__, __LINE__); \
  } while (0)

// RC_CHECK_ARG(cond, a << b): an argument check that names what was expected and what was received.
#define RC_CHECK_ARG(cond, streamExpr)                               \
  do {                                                               \
    if (!(cond)) RC_THROW(::rc::code::kInvalidArgument, streamExpr); \
  } while (0)
