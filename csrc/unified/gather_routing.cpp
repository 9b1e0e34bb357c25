// Row gathers on unified tensors go to zerocopy::gather_rows.
//
// `u[idx]` (aten::index.Tensor with one integer index on dim 0), `torch.index_select(u, 0, idx)`
// and `torch.nn.functional.embedding(idx, u)` are plain row gathers when `u` is a unified
// tensor whose rows are contiguous: these kernels for the unified key call gather_rows through
// the dispatcher on the unified table (which reaches the unified fallback, so the GPU kernel
// reads host memory in address order), and reshape its result. Every other call (masks,
// several indices, other dims, unified indices, rows that are not contiguous) does what the
// unified fallback does: alias each unified argument on the device where the op runs and call
// the aten op there. Results land on that device in both cases.
//
// These kernels sit below autograd: the aten ops' own derivative formulas still apply.

#include "unified/unified_tensor.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>
#include <vector>

namespace zerocopy {

namespace {

// The device where an op with these tensor arguments runs: the first CUDA argument's, else
// the first unified argument's compute device (the unified fallback's rule).
c10::Device run_device(const std::vector<at::Tensor>& tensors) {
  std::optional<c10::Device> unified;
  for (const at::Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (t.is_cuda()) return t.device();
    if (!unified && is_unified(t)) unified = compute_device(t);
  }
  TORCH_INTERNAL_ASSERT(unified.has_value(), "gather routing reached without a unified argument");
  return *unified;
}

at::Tensor alias_on(const at::Tensor& t, c10::Device where) {
  return t.defined() && is_unified(t) ? device_alias(t, where) : t;
}

// An index argument on the device where the op runs: torch's CUDA index_select and embedding
// want their index there, and a unified table meeting a CPU index runs on the GPU.
at::Tensor index_on(const at::Tensor& t, c10::Device where) {
  at::Tensor aliased = alias_on(t, where);
  return aliased.device() == where ? aliased : aliased.to(where);
}

// The 2-D [rows, row elements] view of a unified table whose rows are contiguous, or nothing.
std::optional<at::Tensor> rows_view(const at::Tensor& table) {
  if (!is_unified(table) || table.dim() == 0) return std::nullopt;
  if (table.dim() == 1) return table.view({table.size(0), 1});
  if (table.dim() == 2) {
    if (table.size(1) > 1 && table.stride(1) != 1) return std::nullopt;
    return table;
  }
  if (!table.is_contiguous()) return std::nullopt;
  return table.view({table.size(0), -1});
}

bool is_row_index(const at::Tensor& index) {
  return index.defined() && !is_unified(index) && (index.is_cpu() || index.is_cuda()) &&
         (index.scalar_type() == at::kLong || index.scalar_type() == at::kInt);
}

at::Tensor call_gather_rows(const at::Tensor& table, const at::Tensor& index) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("zerocopy::gather_rows", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, bool, bool, int64_t, int64_t)>();
  return op.call(table, index, /*index_sorted=*/false, /*check_bounds=*/true, /*blocks_per_sm=*/0, /*unroll=*/0);
}

// table[index] for a unified table with contiguous rows: shape index.shape + table.shape[1:].
at::Tensor routed_gather(const at::Tensor& table, const at::Tensor& rows, const at::Tensor& index) {
  at::Tensor flat = call_gather_rows(rows, index.reshape({-1}));
  std::vector<int64_t> shape(index.sizes().begin(), index.sizes().end());
  shape.insert(shape.end(), table.sizes().begin() + 1, table.sizes().end());
  return flat.view(shape);
}

at::Tensor unified_index(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices) {
  if (indices.size() == 1) {
    const std::optional<at::Tensor> first = indices.get(0);
    auto rows = rows_view(self);
    if (first.has_value() && is_row_index(*first) && rows) {
      // Python indexing wraps indices in [-rows, 0); gather_rows does not. Others stay as
      // they are, so the IndexError names the caller's value.
      const at::Tensor& idx = *first;
      const int64_t count = self.size(0);
      at::Tensor wrapped = at::where(at::logical_and(idx < 0, idx >= -count), idx + count, idx);
      return routed_gather(self, *rows, wrapped);
    }
  }
  std::vector<at::Tensor> held{self};
  for (size_t i = 0; i < indices.size(); ++i) {
    std::optional<at::Tensor> t = indices.get(i);
    held.push_back(t.has_value() ? *t : at::Tensor());
  }
  const c10::Device where = run_device(held);
  c10::List<std::optional<at::Tensor>> aliased;
  for (size_t i = 1; i < held.size(); ++i) {
    aliased.push_back(held[i].defined() ? std::optional<at::Tensor>(alias_on(held[i], where)) : std::nullopt);
  }
  return at::index(alias_on(self, where), aliased);
}

at::Tensor unified_index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  if (self.dim() > 0 && at::maybe_wrap_dim(dim, self.dim()) == 0 && index.dim() <= 1 && is_row_index(index)) {
    if (auto rows = rows_view(self)) {
      at::Tensor out = call_gather_rows(*rows, index.reshape({-1}));
      std::vector<int64_t> shape(self.sizes().begin(), self.sizes().end());
      shape[0] = index.numel();
      return out.view(shape);
    }
  }
  const c10::Device where = run_device({index, self});
  return at::index_select(alias_on(self, where), dim, index_on(index, where));
}

at::Tensor unified_embedding(const at::Tensor& weight, const at::Tensor& indices, c10::SymInt padding_idx,
                             bool scale_grad_by_freq, bool sparse) {
  // padding_idx, scale_grad_by_freq and sparse only change the backward pass.
  if (weight.dim() == 2 && is_row_index(indices)) {
    if (auto rows = rows_view(weight)) return routed_gather(weight, *rows, indices);
  }
  const c10::Device where = run_device({indices, weight});
  return at::embedding_symint(alias_on(weight, where), index_on(indices, where), std::move(padding_idx),
                              scale_grad_by_freq, sparse);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("index.Tensor", TORCH_FN(unified_index));
  m.impl("index_select", TORCH_FN(unified_index_select));
  m.impl("embedding", TORCH_FN(unified_embedding));
}

}  // namespace zerocopy
