// Tensors: a typed, shaped, contiguous view into reference-counted device storage. Views share
// storage, which is how parameters live inside one flat arena.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "allocator.h"
#include "device.h"
#include "dtype.h"

namespace rc {

using Shape = std::vector<int64_t>;

std::string shapeStr(const Shape& shape);
// The element count, and the byte count for `dtype`; both throw when the count overflows (an
// invalid shape) or the bytes exceed the address space (out of memory).
int64_t shapeNumel(const Shape& shape);
size_t shapeBytes(const Shape& shape, DType dtype);

class Storage {
 public:
  Storage(Allocator* allocator, Device device, size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  Allocator* allocator_;
  Device device_;
  size_t bytes_;
  void* data_;
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Storage> storage, size_t byteOffset, Shape shape, DType dtype);

  bool defined() const { return storage_ != nullptr; }
  void* data() const { return static_cast<char*>(storage_->data()) + byteOffset_; }
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data());
  }
  const Shape& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_[i]; }
  size_t rank() const { return shape_.size(); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_->device(); }
  int64_t numel() const { return shapeNumel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtypeSize(dtype_); }
  size_t byteOffset() const { return byteOffset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // A view of `shape` starting `elementOffset` elements into this tensor, sharing its storage.
  Tensor view(int64_t elementOffset, const Shape& shape) const;
  // The same memory seen with another shape of equal element count.
  Tensor reshape(const Shape& shape) const;

  // "bf16[8,56,56,64] on cpu"
  std::string describe() const;

 private:
  std::shared_ptr<Storage> storage_;
  size_t byteOffset_ = 0;
  Shape shape_;
  DType dtype_ = DType::F32;
};

// Argument checks shared by the backends; `what` names the argument in the message.
void checkDefined(const Tensor& t, const char* op, const char* what);
void checkDType(const Tensor& t, DType expected, const char* op, const char* what);
void checkShape(const Tensor& t, const Shape& expected, const char* op, const char* what);
void checkSameDevice(const Tensor& a, const Tensor& b, const char* op);

}  // namespace rc
