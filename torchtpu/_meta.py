"""Meta kernels for the ATen ops a PrivateUse1 backend is routed to that PyTorch gives none.

The spec kernel's first step runs an op's Meta kernel for its output shapes and dtypes (strides too).
aten::convolution_overrideable and aten::convolution_backward_overrideable, which PyTorch calls for
convolutions on a PrivateUse1 device, have no Meta kernel; they get the ones of aten::convolution and
aten::convolution_backward, which compute the same results. aten::_fused_sgd_ (SGD with fused=True)
has none either: an in-place update returns nothing, so its Meta kernel only checks the lists agree.
aten::_logcumsumexp (what logcumsumexp calls) has none: its result is self's shape and dtype.
The margin losses' backward ops (aten::multi_margin_loss_backward, multilabel_margin_loss_backward)
have none: their gradient has the input's shape and dtype. aten::geqrf has none: like CPU's, its
reflectors come back column-major (batched) and tau holds min(m, n) scalars per matrix.
aten::histogram has none: its counts and edges are [bins] and [bins + 1] in the input's dtype.
aten::_ctc_loss_backward and aten::fractional_max_pool3d_backward have none: their gradient has the
input's shape and dtype.
"""

from __future__ import annotations

import torch

_lib = torch.library.Library("aten", "IMPL")


def _convolution_meta(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    return torch.ops.aten.convolution.default(input, weight, bias, stride, padding, dilation, transposed,
                                              output_padding, groups)


def _convolution_backward_meta(grad_output, input, weight, stride, padding, dilation, transposed, output_padding,
                               groups, output_mask):
    bias_sizes = [weight.size(1) * groups] if transposed else [weight.size(0)]
    return torch.ops.aten.convolution_backward.default(grad_output, input, weight, bias_sizes, stride, padding,
                                                       dilation, transposed, output_padding, groups, output_mask)


_lib.impl("convolution_overrideable", _convolution_meta, "Meta")
_lib.impl("convolution_backward_overrideable", _convolution_backward_meta, "Meta")


def _fused_sgd_meta(self, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov, maximize,
                    is_first_step, grad_scale=None, found_inf=None):
    torch._check(len(grads) == len(self), lambda: "_fused_sgd_: self and grads must have the same length")
    torch._check(len(momentum_buffer_list) in (0, len(self)),
                 lambda: "_fused_sgd_: momentum_buffer_list must be empty or as long as self")


_lib.impl("_fused_sgd_", _fused_sgd_meta, "Meta")


def _logcumsumexp_meta(self, dim):
    torch._check(-max(self.dim(), 1) <= dim < max(self.dim(), 1),
                 lambda: f"Dimension out of range (expected to be in range of [{-max(self.dim(), 1)}, "
                         f"{max(self.dim(), 1) - 1}], but got {dim})")
    return self.new_empty(self.shape)


def _logcumsumexp_out_meta(self, dim, *, out):
    out.resize_(_logcumsumexp_meta(self, dim).shape)
    return out


_lib.impl("_logcumsumexp", _logcumsumexp_meta, "Meta")  # logcumsumexp's kernel: same shape and dtype
_lib.impl("_logcumsumexp.out", _logcumsumexp_out_meta, "Meta")


def _multi_margin_loss_backward_meta(grad_output, self, target, p, margin, weight=None, reduction=1):
    return self.new_empty(self.shape)


def _multilabel_margin_loss_backward_meta(grad_output, self, target, reduction, is_target):
    return self.new_empty(self.shape)


_lib.impl("multi_margin_loss_backward", _multi_margin_loss_backward_meta, "Meta")
_lib.impl("multilabel_margin_loss_backward", _multilabel_margin_loss_backward_meta, "Meta")


def _geqrf_meta(self):
    torch._check(self.dim() >= 2, lambda: "torch.geqrf: input must have at least 2 dimensions.")
    *batch, rows, cols = self.shape
    reflectors = self.new_empty((*batch, cols, rows)).mT  # column-major, as LAPACK writes it
    return reflectors, self.new_empty((*batch, min(rows, cols)))


def _geqrf_out_meta(self, *, a, tau):
    reflectors, scalars = _geqrf_meta(self)
    a.resize_(reflectors.shape)
    tau.resize_(scalars.shape)
    return a, tau


_lib.impl("geqrf", _geqrf_meta, "Meta")
_lib.impl("geqrf.a", _geqrf_out_meta, "Meta")


def _histogram_checks(self, bin_count, edges=None, range=None, weight=None):
    """CPU's checks (histogramdd_check_inputs), with its messages."""
    if edges is not None:
        torch._check(edges.dtype == self.dtype, lambda: (
            "torch.histogramdd: input tensor and bins tensors should have the same dtype, but got input with dtype "
            f"{_c_name(self.dtype)} and bins for dimension 0 with dtype {_c_name(edges.dtype)}"))
        torch._check(edges.dim() == 1, lambda: "torch.histogramdd: bins tensor should have one dimension, but got "
                     f"{edges.dim()} dimensions in the bins tensor for dimension 0")
    torch._check(bin_count > 0, lambda: f"torch.histogram(): bins must be > 0, but got {bin_count} for dimension 0")
    if weight is not None:
        # histogram flattens both: the input to [numel, 1], the weight to [numel].
        torch._check(weight.numel() == self.numel(), lambda: (
            "torch.histogramdd: if weight tensor is provided it should have the same shape as the input tensor "
            f"excluding its innermost dimension, but got input with shape {[self.numel(), 1]} and "
            f"weight with shape {[weight.numel()]}"))
        torch._check(weight.dtype == self.dtype, lambda: (
            "torch.histogramdd: if weight tensor is provided, input tensor and weight tensor should have the same "
            f"dtype, but got input({_c_name(self.dtype)}), and weight({_c_name(weight.dtype)})"))
    if range is not None:
        torch._check(len(range) == 2, lambda: "torch.histogramdd: for a 1-dimensional histogram range should have "
                     f"2 elements, but got {len(range)}")
        torch._check(range[0] <= range[1], lambda: "torch.histogramdd: min should not exceed max, but got min "
                     f"{range[0]:g} max {range[1]:g} for dimension 0")


def _c_name(dtype):
    return {torch.float32: "float", torch.float64: "double"}.get(dtype, str(dtype).removeprefix("torch."))


def _histogram_bin_ct_meta(self, bins=100, *, range=None, weight=None, density=False):
    _histogram_checks(self, bins, range=range, weight=weight)
    return self.new_empty((bins,)), self.new_empty((bins + 1,))


def _histogram_bins_tensor_meta(self, bins, *, weight=None, density=False):
    _histogram_checks(self, bins.numel() - 1, edges=bins, weight=weight)
    return self.new_empty((bins.numel() - 1,)), self.new_empty((bins.numel(),))


def _histogram_bin_ct_out_meta(self, bins=100, *, range=None, weight=None, density=False, hist, bin_edges):
    counts, edges = _histogram_bin_ct_meta(self, bins, range=range, weight=weight, density=density)
    return hist.resize_(counts.shape), bin_edges.resize_(edges.shape)


def _histogram_bins_tensor_out_meta(self, bins, *, weight=None, density=False, hist, bin_edges):
    counts, edges = _histogram_bins_tensor_meta(self, bins, weight=weight, density=density)
    return hist.resize_(counts.shape), bin_edges.resize_(edges.shape)


_lib.impl("histogram.bin_ct", _histogram_bin_ct_meta, "Meta")
_lib.impl("histogram.bins_tensor", _histogram_bins_tensor_meta, "Meta")
_lib.impl("histogram.bin_ct_out", _histogram_bin_ct_out_meta, "Meta")
_lib.impl("histogram.bins_tensor_out", _histogram_bins_tensor_out_meta, "Meta")


def _ctc_loss_backward_meta(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha,
                            blank, zero_infinity=False):
    return log_probs.new_empty(log_probs.shape)


def _fractional_max_pool3d_backward_meta(grad_output, self, kernel_size, output_size, indices):
    for axis, name in zip((-3, -2, -1), ("time", "height", "width")):  # CPU's checks
        torch._check(grad_output.shape[axis] == output_size[axis], lambda: (
            f"fractional_max_pool3d_backward_out(): gradOutput {name} unexpected"))
    return self.new_empty(self.shape)


_lib.impl("_ctc_loss_backward", _ctc_loss_backward_meta, "Meta")
_lib.impl("fractional_max_pool3d_backward", _fractional_max_pool3d_backward_meta, "Meta")
