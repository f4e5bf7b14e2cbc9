#include "error.h"

#include <cstring>

namespace rc {

[[noreturn]] void throwError(const char* errorCode, const std::string& message, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  std::ostringstream out;
  out << message << " (" << (base ? base + 1 : file) << ":" << line << ")";
  throw Error(errorCode, out.str());
}

}  // namespace rc
