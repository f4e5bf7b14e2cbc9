#include "tensor.h"

#include <sstream>

#include "error.h"

namespace rc {

std::string shapeStr(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? "," : "") << shape[i];
  out << "]";
  return out.str();
}

int64_t shapeNumel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    RC_CHECK_ARG(d >= 0, "tensor dimensions must be non-negative, got shape " << shapeStr(shape));
    RC_CHECK_ARG(!__builtin_mul_overflow(n, d, &n),
                 "shape " << shapeStr(shape) << " has more elements than a 64-bit count holds");
  }
  return n;
}

size_t shapeBytes(const Shape& shape, DType dtype) {
  const auto numel = static_cast<size_t>(shapeNumel(shape));
  size_t bytes = 0;
  if (__builtin_mul_overflow(numel, dtypeSize(dtype), &bytes)) {
    RC_THROW(code::kOutOfMemory,
             "a " << dtypeName(dtype) << shapeStr(shape) << " tensor needs more bytes than a 64-bit size holds");
  }
  return bytes;
}

Storage::Storage(Allocator* allocator, Device device, size_t bytes)
    : allocator_(allocator), device_(device), bytes_(bytes), data_(allocator->allocate(bytes)) {}

Storage::~Storage() { allocator_->release(data_); }

Tensor::Tensor(std::shared_ptr<Storage> storage, size_t byteOffset, Shape shape, DType dtype)
    : storage_(std::move(storage)), byteOffset_(byteOffset), shape_(std::move(shape)), dtype_(dtype) {
  const size_t bytes = shapeBytes(shape_, dtype_);
  RC_CHECK_ARG(byteOffset_ <= storage_->bytes() && bytes <= storage_->bytes() - byteOffset_,
               "a " << dtypeName(dtype_) << shapeStr(shape_) << " view at byte " << byteOffset_
                    << " does not fit in its storage of " << storage_->bytes() << " bytes");
}

Tensor Tensor::view(int64_t elementOffset, const Shape& shape) const {
  RC_CHECK_ARG(elementOffset >= 0 && elementOffset <= numel() && shapeNumel(shape) <= numel() - elementOffset,
               "view of " << shapeStr(shape) << " at element " << elementOffset << " is outside a tensor of " << numel()
                          << " elements");
  return Tensor(storage_, byteOffset_ + static_cast<size_t>(elementOffset) * dtypeSize(dtype_), shape, dtype_);
}

Tensor Tensor::reshape(const Shape& shape) const {
  RC_CHECK_ARG(shapeNumel(shape) == numel(), "cannot reshape " << describe() << " to " << shapeStr(shape));
  return Tensor(storage_, byteOffset_, shape, dtype_);
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return std::string(dtypeName(dtype_)) + shapeStr(shape_) + " on " + device().str();
}

void checkDefined(const Tensor& t, const char* op, const char* what) {
  RC_CHECK_ARG(t.defined(), op << ": " << what << " is required");
}

void checkDType(const Tensor& t, DType expected, const char* op, const char* what) {
  checkDefined(t, op, what);
  RC_CHECK_ARG(t.dtype() == expected,
               op << ": " << what << " must be " << dtypeName(expected) << ", got " << t.describe());
}

void checkShape(const Tensor& t, const Shape& expected, const char* op, const char* what) {
  checkDefined(t, op, what);
  RC_CHECK_ARG(t.shape() == expected,
               op << ": " << what << " must have shape " << shapeStr(expected) << ", got " << t.describe());
}

void checkSameDevice(const Tensor& a, const Tensor& b, const char* op) {
  RC_CHECK_ARG(a.device() == b.device(),
               op << ": tensors are on different devices: " << a.describe() << " and " << b.describe());
}

}  // namespace rc
