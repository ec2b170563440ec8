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
