// What the emulated libraries' C++ unit tests share: a tally of checks, each failure printed with
// what was expected, and the summary line "<suite>: N passed, M failed" that the TypeScript tests
// which run them look for.
#pragma once

#include <cstdio>
#include <string>

namespace rc_emu_test {

inline int gPassed = 0, gFailed = 0;

// Counts a check; a failure prints "FAILED: <what>".
inline void check(bool ok, const std::string& what) {
  if (ok) {
    ++gPassed;
  } else {
    ++gFailed;
    std::printf("FAILED: %s\n", what.c_str());
  }
}

// Counts a check; a failure prints "FAILED: <what> (<detail()>)", detail being called only then.
template <typename Detail>
void check(bool ok, const std::string& what, Detail detail) {
  if (ok) {
    ++gPassed;
  } else {
    ++gFailed;
    std::printf("FAILED: %s (%s)\n", what.c_str(), std::string(detail()).c_str());
  }
}

// Prints the summary line of `suite`; returns the exit status: 0 when every check passed.
inline int finish(const char* suite) {
  std::printf("%s: %d passed, %d failed\n", suite, gPassed, gFailed);
  return gFailed == 0 ? 0 : 1;
}

}  // namespace rc_emu_test
