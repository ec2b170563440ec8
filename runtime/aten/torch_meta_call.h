// A direct call of one op's C++ Meta kernel on a stack of meta-device arguments (replaced by its
// results). Generated per spec'd overload in generated/ops/meta.cpp; null where ATen has none.
#pragma once

#include <ATen/core/stack.h>

#include <vector>

namespace torchtpu {

using MetaCallFn = void (*)(torch::jit::Stack& stack);

// Indexed like op_specs().
const std::vector<MetaCallFn>& meta_calls();

}  // namespace torchtpu
