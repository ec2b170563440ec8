// torch.equal on tpu: a Python bool, which no spec can return (a spec's results are tensors). It
// composes spec'd ops (eq, all) and reads the answer back, so it synchronizes, as on CUDA.
#include <ATen/core/Tensor.h>
#include <ATen/ops/all.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/item.h>
#include <torch/library.h>

namespace torchtpu {
namespace {

bool equal(const at::Tensor& self, const at::Tensor& other) {
  TORCH_CHECK(self.device() == other.device(), "Cannot compare two tensors on different devices. Got: ",
              self.device(), " and ", other.device());
  if (self.sizes() != other.sizes()) return false;  // different dtypes compare by value, as on CPU
  if (self.numel() == 0) return true;
  return at::eq(self, other).all().item<bool>();
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("equal", equal); }

}  // namespace
}  // namespace torchtpu
