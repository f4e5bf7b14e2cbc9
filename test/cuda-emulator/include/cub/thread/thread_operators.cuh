// Emulated cub::Sum, cub::Max and cub::Min, the reduction operators of the block primitives.
#pragma once

namespace cub {

struct Sum {
  template <typename T>
  T operator()(const T& a, const T& b) const {
    return a + b;
  }
};
struct Max {
  template <typename T>
  T operator()(const T& a, const T& b) const {
    return a < b ? b : a;
  }
};
struct Min {
  template <typename T>
  T operator()(const T& a, const T& b) const {
    return b < a ? b : a;
  }
};

}  // namespace cub
