"""Meta kernels for the ATen ops a PrivateUse1 backend is routed to that PyTorch gives none.

The spec kernel's first step runs an op's Meta kernel for its output shapes and dtypes (strides too).
aten::convolution_overrideable and aten::convolution_backward_overrideable, which PyTorch calls for
convolutions on a PrivateUse1 device, have no Meta kernel; they get the ones of aten::convolution and
aten::convolution_backward, which compute the same results.
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
