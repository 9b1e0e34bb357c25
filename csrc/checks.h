// Argument checks for op entry points. Each message names the argument and says what was
// expected and what was given, so a caller can fix the call without reading this code.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <string>

namespace zerocopy {

inline void check_dim(const at::Tensor& t, int64_t dim, const char* name) {
  TORCH_CHECK_VALUE(t.dim() == dim, name, " must be a ", dim, "-D tensor, got shape ", t.sizes());
}

inline void check_index_dtype(const at::Tensor& t, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, name,
                   " must be int32 or int64, got ", t.scalar_type());
}

inline void check_dtype(const at::Tensor& t, at::ScalarType want, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == want, name, " must be ", want, ", got ", t.scalar_type());
}

inline void check_device_type(const at::Tensor& t, c10::DeviceType want, const char* name) {
  TORCH_CHECK_VALUE(t.device().type() == want, name, " must be on ", c10::DeviceTypeName(want, true),
                    ", got a tensor on ", t.device());
}

inline void check_same_device(const at::Tensor& a, const char* a_name, const at::Tensor& b,
                              const char* b_name) {
  TORCH_CHECK_VALUE(a.device() == b.device(), a_name, " and ", b_name,
                    " must be on the same device, got ", a.device(), " and ", b.device());
}

}  // namespace zerocopy
