// Instruction-set variants of the element-wise kernels. The package is built for baseline x86-64;
// each hot loop is also compiled for AVX2 and AVX-512 inside functions carrying a target attribute
// and chosen at run time. The loop bodies are always-inline templates with internal use only, so
// no out-of-line copy built for a wider ISA can be picked up by baseline code.
#pragma once

namespace rc::cpu {

enum class IsaLevel { Baseline = 0, Avx2 = 1, Avx512 = 2 };

inline IsaLevel isaLevel() {
  static const IsaLevel level = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
      return IsaLevel::Avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return IsaLevel::Avx2;
    return IsaLevel::Baseline;
  }();
  return level;
}

}  // namespace rc::cpu

#define RC_ALWAYS_INLINE inline __attribute__((always_inline))
#define RC_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define RC_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

// Defines `name<T>(params...)` that runs `impl<T>(args...)` compiled for the best available ISA.
#define RC_ISA_DISPATCH(name, impl, params, args)                     \
  template <typename T>                                               \
  RC_TARGET_AVX512 void name##Avx512 params {                         \
    impl<T> args;                                                     \
  }                                                                   \
  template <typename T>                                               \
  RC_TARGET_AVX2 void name##Avx2 params {                             \
    impl<T> args;                                                     \
  }                                                                   \
  template <typename T>                                               \
  void name##Baseline params {                                        \
    impl<T> args;                                                     \
  }                                                                   \
  template <typename T>                                               \
  void name params {                                                  \
    switch (::rc::cpu::isaLevel()) {                                  \
      case ::rc::cpu::IsaLevel::Avx512: name##Avx512<T> args; return; \
      case ::rc::cpu::IsaLevel::Avx2: name##Avx2<T> args; return;     \
      default: name##Baseline<T> args; return;                        \
    }                                                                 \
  }
