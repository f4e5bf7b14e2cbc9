// The per-shape cache of the `conv-bn` fused graphs (ConvBnFusion, DgradDbnFusion,
// WgradSbrFusion): each shape's graph is built once, on first use or when convBnSupport asks
// first, and a shape cuDNN refuses (an rc::Error of code::kCudnn while the graph or its execution
// plan is built) is remembered with its reason, so that it is never built again.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "../core/error.h"

namespace rc::cuda {

template <typename Graph>
class PlanCache {
 public:
  // The graph of `key`, made by `make()` (a std::unique_ptr<Graph>) on first use; throws
  // code::kCudnn with cuDNN's reason for a refused shape.
  template <typename Make>
  Graph* get(const std::string& key, Make make) {
    std::lock_guard<std::mutex> lock(mutex_);
    return build(key, make, true);
  }

  // "" when the graph of `key` is (or is now) built, else cuDNN's reason for refusing it.
  template <typename Make>
  std::string refusal(const std::string& key, Make make) {
    std::lock_guard<std::mutex> lock(mutex_);
    build(key, make, false);
    auto it = refusals_.find(key);
    return it == refusals_.end() ? std::string() : it->second;
  }

 private:
  template <typename Make>
  Graph* build(const std::string& key, Make& make, bool throwRefusal) {
    if (auto it = refusals_.find(key); it != refusals_.end()) {
      if (throwRefusal) RC_THROW(code::kCudnn, it->second);
      return nullptr;
    }
    auto& slot = graphs_[key];
    if (slot) return slot.get();
    try {
      slot = make();
    } catch (const Error& e) {
      graphs_.erase(key);
      if (e.code() != code::kCudnn) throw;
      refusals_[key] = e.what();
      if (throwRefusal) throw;
      return nullptr;
    }
    return slot.get();
  }

  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Graph>> graphs_;
  std::map<std::string, std::string> refusals_;
};

}  // namespace rc::cuda
