// Autocast for the tpu device: `torch.autocast("tpu", dtype=torch.bfloat16 | torch.float16)`.
//
// PyTorch ships autocast kernels for CUDA, CPU, XPU, MPS, ... but none for AutocastPrivateUse1,
// so without this file every op would pass through uncast. The policy follows CUDA's: the op
// lists ATen/autocast_mode.h exports for backends to share (AT_FORALL_*), plus the few ops CUDA
// registers by hand (cat/stack/index_copy promote, binary_cross_entropy is refused).
//   lower_precision_fp: cast floating inputs to the autocast dtype (matmuls, convolutions, sdpa)
//   fp32:               cast to float32 (numerically sensitive: exp/log/pow, norms, losses)
//   fp32_set_opt_dtype: run in float32 by passing dtype=float32 when the caller gave none
//                       (softmax/log_softmax/sum/prod/cumsum/cumprod/vector norms)
//   promote:            cast mixed inputs to their widest floating type (cat, stack, addcmul, ...)
// Any other op falls through to the next dispatch key unchanged.

#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace {

using namespace at;  // the shared op lists name Tensor, IntArrayRef, ScalarType unqualified

#define TPU_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define TPU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define TPU_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define TPU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

// binary_cross_entropy on probabilities is unsafe in half precision (log of values near 0/1);
// like CUDA autocast, refuse it and point to the logits form, which is on the fp32 list.
Tensor binary_cross_entropy_refused(const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
              "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
              "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
              "or torch.nn.BCEWithLogitsLoss. binary_cross_entropy_with_logits and BCEWithLogits are\n"
              "safe to autocast (they run in float32). To keep using binary_cross_entropy, disable autocast\n"
              "around it (torch.autocast('tpu', enabled=False)) and pass float32 inputs.");
}

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(TPU_LOWER_PRECISION_FP)
  AT_FORALL_FP32(TPU_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TPU_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(TPU_PROMOTE)
  TPU_PROMOTE(cat)
  TPU_PROMOTE(stack)
  TPU_PROMOTE(index_copy)
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"), TORCH_FN(binary_cross_entropy_refused));
}

}  // namespace
