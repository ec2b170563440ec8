// The one kernel every spec'd op runs through (generated registrations call spec_kernel).
#pragma once

#include <torch/library.h>

#include "op_spec.h"

namespace torchtpu {

torch::CppFunction spec_kernel(const OpSpec& spec);

}  // namespace torchtpu
