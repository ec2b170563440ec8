// Which kernel torch.nn.functional.scaled_dot_product_attention takes on tpu: PyTorch asks the
// device's _fused_sdp_choice_stub. Flash attention there is _scaled_dot_product_flash_attention_for_cpu
// (spec'd in specs/nn.yaml), whose lowering never makes the [L, S] probabilities a result and whose
// backward recomputes them from the logsumexp: math's probabilities are float32 [B, H, L, S] tensors
// kept for the backward (PyTorch's math path upcasts half inputs off CUDA). What that kernel does not
// take goes the math way, as on CPU: dropout, a mask that needs a gradient or of another dtype, head
// sizes that differ, not 4-D; torch.nn.attention.sdpa_kernel is honoured.
#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/transformers/attention.h>

namespace torchtpu {
namespace {

bool flash_takes(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                 const std::optional<at::Tensor>& attn_mask, double dropout_p, bool enable_gqa) {
  if (!at::globalContext().userEnabledFlashSDP() || dropout_p != 0) return false;
  if (query.dim() != 4 || key.dim() != 4 || value.dim() != 4) return false;
  const auto dtype = query.scalar_type();
  if (!at::isFloatingType(dtype) || key.scalar_type() != dtype || value.scalar_type() != dtype) return false;
  // No broadcast batch; grouped key/value heads only with enable_gqa (math raises PyTorch's error otherwise).
  if (key.size(0) != query.size(0) || value.size(0) != query.size(0) || value.size(1) != key.size(1)) return false;
  if (key.size(1) != query.size(1) && (!enable_gqa || query.size(1) % key.size(1) != 0)) return false;
  if (key.size(3) != query.size(3) || value.size(3) != query.size(3) || key.size(2) != value.size(2)) return false;
  if (attn_mask && attn_mask->defined()) {
    if (attn_mask->requires_grad()) return false;  // the flash backward has no mask gradient
    if (attn_mask->scalar_type() != dtype && attn_mask->scalar_type() != at::kBool) return false;
  }
  return true;
}

int64_t choose_sdpa_kernel(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                           const std::optional<at::Tensor>& attn_mask, double dropout_p, bool /*is_causal*/,
                           std::optional<double> /*scale*/, bool enable_gqa) {
  const at::SDPBackend choice = flash_takes(query, key, value, attn_mask, dropout_p, enable_gqa)
                                    ? at::SDPBackend::flash_attention
                                    : at::SDPBackend::math;
  return static_cast<int64_t>(choice);
}

}  // namespace
}  // namespace torchtpu

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torchtpu::choose_sdpa_kernel)
}  // namespace at::native
