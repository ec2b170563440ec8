// What codegen knows about one ATen overload, as a table the kernel machinery reads.
// Torch-free, so the generated emitters compile in seconds.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "hlo/hlo_builder.h"

namespace torchtpu {

// How each schema argument takes part in the kernel.
enum class ArgKind : uint8_t {
  Tensor,      // read from its storage inside the executable (CPU 0-d tensors: a runtime scalar)
  TensorList,  // each element as Tensor
  // Tensor?[] (indexing): each element as Tensor, None as a Value whose id is -1. First, as
  // PyTorch's expandTensors does, a bool/uint8 mask becomes its nonzero() columns (aten::nonzero on
  // tpu, which synchronizes) and an index tensor on the CPU (not 0-d) is copied to the device.
  OptionalTensorList,
  Scalar,      // runtime value: a 0-d parameter, so new values reuse the executable
  ScalarList,  // each element as Scalar
  Attr,        // compile-time: part of the cache key and a constant in the module
  Generator,   // a random generator: a runtime 2 x u64 (seed, offset) parameter
  Ignored,     // no effect on the computation (layout, pin_memory, non_blocking, ...)
};

// Inplace also stands for ATen's "mutable" variants (_native_batch_norm_legit): both write arguments.
enum class Variant : uint8_t { Functional, Inplace, Out };

// The dtype the lowering computes in; results are converted to the output dtype afterwards.
enum class Compute : uint8_t {
  Output,       // the output's dtype (reductions, conversions, fill)
  Common,       // torch.result_type of the promoted arguments (add, eq, where, ...)
  CommonFloat,  // as Common, integers promoted to the default float dtype (div, exp, sqrt, ...)
};

// A schema argument as the emitter sees it.
using EmitArg = std::variant<std::monostate, rt::Value, std::vector<rt::Value>, int64_t, double, bool,
                             std::vector<int64_t>, std::string, std::vector<bool>, std::vector<double>>;

class EmitArgs {
 public:
  std::vector<EmitArg> args;

  const rt::Value& value(int i) const { return get<rt::Value>(i, "a tensor or scalar"); }
  const std::vector<rt::Value>& values(int i) const { return get<std::vector<rt::Value>>(i, "a tensor list"); }
  int64_t integer(int i) const { return get<int64_t>(i, "an int"); }
  double real(int i) const {
    if (auto* v = std::get_if<int64_t>(&args.at(i))) return static_cast<double>(*v);
    if (auto* v = std::get_if<bool>(&args.at(i))) return *v ? 1.0 : 0.0;  // a compile-time bool Scalar
    return get<double>(i, "a float");
  }
  bool boolean(int i) const { return get<bool>(i, "a bool"); }
  // int[] arguments; None reads as empty (PyTorch's "all dims" for reductions).
  std::vector<int64_t> ints(int i) const {
    if (std::holds_alternative<std::monostate>(args.at(i))) return {};
    if (auto* v = std::get_if<int64_t>(&args.at(i))) return {*v};
    return get<std::vector<int64_t>>(i, "an int list");
  }
  const std::string& string(int i) const { return get<std::string>(i, "a string"); }
  // bool[N] arguments (output_mask).
  const std::vector<bool>& bools(int i) const { return get<std::vector<bool>>(i, "a bool list"); }
  // float[] arguments (histogram's range); None reads as empty.
  std::vector<double> reals(int i) const {
    if (is_none(i)) return {};
    return get<std::vector<double>>(i, "a float list");
  }
  bool is_none(int i) const { return std::holds_alternative<std::monostate>(args.at(i)); }
  // A foreach lowering's view of element `i`: each list argument in `lists` reads as its i-th
  // element (none where that list is shorter, e.g. an empty max_exp_avg_sqs). The lists themselves
  // are not copied: an optimizer's foreach step over N parameters would copy N^2 values.
  EmitArgs element(size_t i, const std::vector<int>& lists) const {
    EmitArgs one;
    one.args.reserve(args.size());
    for (size_t a = 0; a < args.size(); ++a) {
      if (std::find(lists.begin(), lists.end(), static_cast<int>(a)) == lists.end()) {
        one.args.push_back(args[a]);
        continue;
      }
      const auto* list = std::get_if<std::vector<rt::Value>>(&args[a]);
      if (list && i < list->size()) one.args.emplace_back((*list)[i]);
      else one.args.emplace_back(std::monostate{});
    }
    return one;
  }
  // Optional arguments (Tensor?, Scalar?, float?) for primitives that take std::optional.
  std::optional<rt::Value> optional_value(int i) const {
    if (is_none(i)) return std::nullopt;
    return value(i);
  }
  std::optional<double> optional_real(int i) const {
    if (is_none(i)) return std::nullopt;
    return real(i);
  }

 private:
  template <typename T>
  const T& get(int i, const char* what) const {
    if (auto* v = std::get_if<T>(&args.at(i))) return *v;
    throw std::invalid_argument("torchtpu: argument " + std::to_string(i) + " is not " + what);
  }
};

using Emitter = std::vector<rt::Value> (*)(rt::Builder&, const EmitArgs&);

// An elementwise lowering's arguments with every list in `lists` joined into one flat vector, and
// `shapes`, the shapes of the lists' N elements (element i has one shape in every list or is 0-d, each list one
// dtype), where joining pays; none otherwise. It pays for 0-d values (an optimizer's step counts and
// bias corrections: capturable AdamW's per-parameter bias corrections were ~4,700 scalar ops of the
// 110M Llama's captured step) and for float64 tensors (emulated in float32 pieces on a TPU: a lowering
// per tensor of the list made libtpu compile a float64 _foreach_exp or _foreach_log for over a
// minute) and for small lists (at most kJoinedElements elements in all: copying them costs nothing
// beside a lowering per tensor to compile: op_db's float32 _foreach_pow test, whose modules held the
// accurate power, ~290 ops, once for each of 20 tensors, ran past a minute on a v5e), not for float32
// parameter lists, whose concatenation would cost memory traffic.
constexpr int64_t kJoinedElements = int64_t{1} << 16;
inline std::optional<EmitArgs> joined_lists(rt::Builder& b, const EmitArgs& all, const std::vector<int>& lists,
                                            size_t n, std::vector<std::vector<int64_t>>& shapes) {
  const auto* first = std::get_if<std::vector<rt::Value>>(&all.args.at(lists.at(0)));
  if (!first || first->size() != n) return std::nullopt;
  shapes.clear();
  for (const rt::Value& v : *first) shapes.push_back(v.dims());
  const bool scalars = std::all_of(shapes.begin(), shapes.end(), [](const auto& shape) { return shape.empty(); });
  int64_t elements = 0;
  for (const rt::Value& v : *first) elements += v.type.numel();
  const bool small = elements <= kJoinedElements;
  // Checked before anything is emitted. A 0-d element beside a larger one in another list (a tensor's
  // exponent) is broadcast to that element's shape, as the lowering per element would.
  for (int a : lists) {
    const auto* list = std::get_if<std::vector<rt::Value>>(&all.args.at(a));
    if (!list || list->size() != n) return std::nullopt;
    for (size_t i = 0; i < n; ++i) {
      const rt::Value& v = (*list)[i];
      if ((v.dims() != shapes[i] && v.rank() != 0) || v.element() != list->front().element()) return std::nullopt;
      if (!scalars && !small && v.element() != rt::ElementType::F64) return std::nullopt;
    }
  }
  EmitArgs joined = all;
  for (int a : lists) {
    const auto& list = std::get<std::vector<rt::Value>>(all.args.at(a));
    std::vector<rt::Value> flat;
    for (size_t i = 0; i < n; ++i) {
      const rt::TensorType shaped{list[i].element(), shapes[i]};
      flat.push_back(b.reshape(b.broadcast_to(list[i], shapes[i]), {shaped.numel()}));
    }
    joined.args[a] = b.concatenate(flat, 0);
  }
  return joined;
}

// A foreach op's results: `per_element` (the lowering over element i) for each of the N elements
// of list argument lists[0], arranged result-major: all N of result 0, then all N of result 1, ...
// An `elementwise` lowering over lists joined_lists joins runs once over the joined vector, and each
// result is cut back into the N elements: one lowering in the module instead of N.
template <typename PerElement>
std::vector<rt::Value> foreach_results(rt::Builder& b, const EmitArgs& all, const std::vector<int>& lists,
                                       bool elementwise, PerElement per_element) {
  const size_t n = all.values(lists.at(0)).size();
  std::vector<std::vector<int64_t>> shapes;
  if (elementwise && n > 1) {
    if (std::optional<EmitArgs> joined = joined_lists(b, all, lists, n, shapes)) {
      int64_t total = 0;
      for (const std::vector<int64_t>& shape : shapes) total += rt::TensorType{{}, shape}.numel();
      std::vector<rt::Value> flat;
      for (const rt::Value& result : per_element(*joined)) {
        const rt::Value vector = b.broadcast_to(result, {total});  // a result that reads no list is one value
        int64_t start = 0;
        for (const std::vector<int64_t>& shape : shapes) {
          const int64_t count = rt::TensorType{{}, shape}.numel();
          flat.push_back(b.reshape(b.slice(vector, {start}, {start + count}, {1}), shape));
          start += count;
        }
      }
      return flat;
    }
  }
  std::vector<std::vector<rt::Value>> by_result;
  for (size_t i = 0; i < n; ++i) {
    std::vector<rt::Value> results = per_element(all.element(i, lists));
    by_result.resize(results.size());
    for (size_t r = 0; r < results.size(); ++r) by_result[r].push_back(std::move(results[r]));
  }
  std::vector<rt::Value> flat;
  for (auto& r : by_result) flat.insert(flat.end(), r.begin(), r.end());
  return flat;
}

// Where an op's argument holds positions into another tensor: under TORCHTPU_CHECK_INDICES=1 the eager
// kernel computes on the device whether any is out of range, reads that one flag back and raises CPU's
// error (a module cannot raise: out of range, gathers clamp and scatters drop). From a spec's index_check.
struct IndexCheck {
  static constexpr int64_t kFlattened = INT64_MIN;  // dim_value: positions into the flattened tensor
  int index = -1;          // the Tensor argument, or a Tensor?[] whose entry k indexes dimension k; -1: no check
  int into = -1;           // the Tensor argument they index
  int dim_arg = -1;        // the int argument naming the dimension, or -1: dim_value
  int64_t dim_value = kFlattened;
  bool negative = false;   // -size..-1 count from the end
  int ignore = -1;         // an int argument whose value is exempt (nll_loss's ignore_index), or -1
  bool index_error = true; // CPU raises IndexError, else RuntimeError
  const char* message = "";  // CPU's text; {value} {dim} {size} {position} are filled in
};

struct OpSpec {
  const char* overload;  // e.g. "add.Tensor"
  const char* source;    // "specs/elementwise.yaml:12": where errors point
  Variant variant;
  std::vector<ArgKind> args;       // one per schema argument
  std::vector<int> promoted;       // arguments converted to the compute dtype
  Compute compute;
  // Arguments the op writes (Tensor, Tensor? or Tensor[]): those its returns alias, in return order,
  // then the other mutated ones in schema order. The lowering's results are the op's fresh
  // (non-aliasing) returns followed by one new value per written argument.
  std::vector<int> written;
  // Per schema return: the argument it aliases (pushed back as is), or -1 for a fresh result.
  std::vector<int> returns;
  bool foreach;             // every result is a list: one value per element of the first list argument
  bool implicit_generator;  // draws from the default generator: the lowering's extra last argument
  std::vector<std::string> dtypes; // supported compute dtypes, torch names ("float32", ...)
  Emitter emit;
  // The output shapes depend on the data (nonzero, masked_select): no Meta pass; the lowering returns
  // its outputs padded along dim 0 (their dtype: the value's, the compute dtype where that is the
  // compute element) and then a 0-d integer count; the kernel synchronizes to read the count and
  // returns the outputs cut to `count` rows (a view of the padded storage).
  bool data_dependent = false;
  // The argument (Tensor or Scalar) that must hold no zero where the op computes in an integer dtype:
  // CPU raises "ZeroDivisionError" there (integer div/remainder/fmod), so the kernel checks it,
  // synchronizing, before it runs. -1: none.
  int divisor = -1;
  IndexCheck index_check;
  // data_dependent: the returns cut to the count (empty: every one); the others keep their padded
  // shape (_unique2's inverse indices have the input's shape).
  std::vector<int> cut_returns;
};

// The generated table (generated/ops/emitters.cpp).
const std::vector<OpSpec>& op_specs();

}  // namespace torchtpu
