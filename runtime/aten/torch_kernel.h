// The one kernel every spec'd op runs through (generated registrations call spec_kernel).
#pragma once

#include <torch/library.h>

#include "aten/torch_meta_call.h"
#include "aten/op_spec.h"

namespace torchtpu {

// `meta` runs the op's C++ Meta kernel directly; null: the dispatcher's Meta path.
torch::CppFunction spec_kernel(const OpSpec& spec, MetaCallFn meta);

}  // namespace torchtpu
