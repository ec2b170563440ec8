#include "hlo_builder.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <stdexcept>

namespace torchtpu::rt {
namespace {

std::string join(const std::vector<int64_t>& values) {
  std::string s;
  for (size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + std::to_string(values[i]);
  return s;
}

std::string i64_array(const std::vector<int64_t>& values) {
  return values.empty() ? "array<i64>" : "array<i64: " + join(values) + ">";
}

std::string list(const std::vector<int64_t>& values) { return "[" + join(values) + "]"; }

// How a float literal is spelled exactly: its bit pattern in hex.
std::string float_literal(double value, ElementType element) {
  char buf[32];
  if (element == ElementType::F64) {
    uint64_t bits;
    std::memcpy(&bits, &value, 8);
    std::snprintf(buf, sizeof buf, "0x%016llX", static_cast<unsigned long long>(bits));
  } else {
    const float f = static_cast<float>(value);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    std::snprintf(buf, sizeof buf, "0x%08X", bits);
  }
  return buf;
}

const char* compare_type(ElementType e) {
  if (is_float(e)) return "FLOAT";
  if (e == ElementType::Pred || is_unsigned(e)) return "UNSIGNED";
  return "SIGNED";
}

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument("torchtpu builder: " + message); }

}  // namespace

std::string Builder::name(const Value& v) const { return "%v" + std::to_string(v.id); }

Value Builder::emit(const std::string& op_and_operands, const TensorType& result_type) {
  Value v{next_id_++, result_type};
  body_ += "    " + name(v) + " = " + op_and_operands + "\n";
  return v;
}

Value Builder::parameter(const TensorType& type) {
  parameters_.push_back(Value{next_id_++, type});
  return parameters_.back();
}

Value Builder::constant(double value, ElementType element) {
  if (element == ElementType::F16 || element == ElementType::BF16) {
    return convert(constant(value, ElementType::F32), element);
  }
  if (!is_float(element)) return constant_int(static_cast<int64_t>(value), element);
  TensorType t{element, {}};
  return emit("stablehlo.constant dense<" + float_literal(value, element) + "> : " + t.mlir(), t);
}

Value Builder::constant_int(int64_t value, ElementType element) {
  if (is_float(element)) return constant(static_cast<double>(value), element);
  TensorType t{element, {}};
  std::string literal = element == ElementType::Pred ? (value ? "true" : "false") : std::to_string(value);
  return emit("stablehlo.constant dense<" + literal + "> : " + t.mlir(), t);
}

Value Builder::full(double value, const TensorType& type) { return broadcast_to(constant(value, type.element), type.dims); }

Value Builder::convert(const Value& v, ElementType element) {
  if (v.element() == element) return v;
  TensorType t{element, v.dims()};
  return emit("stablehlo.convert " + name(v) + " : (" + v.type.mlir() + ") -> " + t.mlir(), t);
}

Value Builder::reinterpret(const Value& v, ElementType element) {
  if (v.element() == element) return v;
  // Booleans are one byte holding 0 or 1 in PyTorch: a numeric conversion keeps those bits.
  if (v.element() == ElementType::Pred || element == ElementType::Pred) {
    if (element_size(v.element()) != 1 || element_size(element) != 1) fail("reinterpret changes the element width");
    return convert(v, element);
  }
  if (element_size(v.element()) != element_size(element)) fail("reinterpret changes the element width");
  TensorType t{element, v.dims()};
  return emit("stablehlo.bitcast_convert " + name(v) + " : (" + v.type.mlir() + ") -> " + t.mlir(), t);
}

Value Builder::broadcast_in_dim(const Value& v, const std::vector<int64_t>& dims,
                                const std::vector<int64_t>& mapping) {
  TensorType t{v.element(), dims};
  return emit("stablehlo.broadcast_in_dim " + name(v) + ", dims = [" + join(mapping) + "] : (" + v.type.mlir() +
                  ") -> " + t.mlir(),
              t);
}

Value Builder::broadcast_to(const Value& v, const std::vector<int64_t>& dims) {
  if (v.dims() == dims) return v;
  const int offset = static_cast<int>(dims.size()) - v.rank();
  if (offset < 0) fail("cannot broadcast " + v.type.mlir() + " to rank " + std::to_string(dims.size()));
  std::vector<int64_t> mapping(v.rank());
  for (int i = 0; i < v.rank(); ++i) {
    mapping[i] = i + offset;
    if (v.dims()[i] != 1 && v.dims()[i] != dims[i + offset]) fail("cannot broadcast " + v.type.mlir() + " to [" + join(dims) + "]");
  }
  return broadcast_in_dim(v, dims, mapping);
}

Value Builder::reshape(const Value& v, const std::vector<int64_t>& dims) {
  if (v.dims() == dims) return v;
  TensorType t{v.element(), dims};
  return emit("stablehlo.reshape " + name(v) + " : (" + v.type.mlir() + ") -> " + t.mlir(), t);
}

Value Builder::transpose(const Value& v, const std::vector<int64_t>& permutation) {
  std::vector<int64_t> identity(permutation.size());
  std::iota(identity.begin(), identity.end(), 0);
  if (permutation == identity) return v;
  std::vector<int64_t> dims;
  for (int64_t p : permutation) dims.push_back(v.dims().at(p));
  TensorType t{v.element(), dims};
  return emit("stablehlo.transpose " + name(v) + ", dims = [" + join(permutation) + "] : (" + v.type.mlir() +
                  ") -> " + t.mlir(),
              t);
}

Value Builder::slice(const Value& v, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
                     const std::vector<int64_t>& strides) {
  std::vector<int64_t> dims;
  for (size_t i = 0; i < start.size(); ++i) dims.push_back((limit[i] - start[i] + strides[i] - 1) / strides[i]);
  TensorType t{v.element(), dims};
  return emit("\"stablehlo.slice\"(" + name(v) + ") {start_indices = " + i64_array(start) + ", limit_indices = " +
                  i64_array(limit) + ", strides = " + i64_array(strides) + "} : (" + v.type.mlir() + ") -> " +
                  t.mlir(),
              t);
}

Value Builder::concatenate(const std::vector<Value>& values, int64_t dim) {
  if (values.empty()) fail("concatenate of nothing");
  if (values.size() == 1) return values[0];
  TensorType t = values[0].type;
  t.dims[dim] = 0;
  std::string operands, types;
  for (size_t i = 0; i < values.size(); ++i) {
    t.dims[dim] += values[i].dims()[dim];
    operands += (i ? ", " : "") + name(values[i]);
    types += (i ? ", " : "") + values[i].type.mlir();
  }
  return emit("\"stablehlo.concatenate\"(" + operands + ") {dimension = " + std::to_string(dim) + " : i64} : (" +
                  types + ") -> " + t.mlir(),
              t);
}

Value Builder::iota(const TensorType& type, int64_t dim) {
  return emit("\"stablehlo.iota\"() {iota_dimension = " + std::to_string(dim) + " : i64} : () -> " + type.mlir(),
              type);
}

std::vector<int64_t> Builder::broadcast_shape(const std::vector<const Value*>& operands, const char* op) const {
  int rank = 0;
  for (const Value* v : operands) rank = std::max(rank, v->rank());
  std::vector<int64_t> dims(rank, 1);
  for (const Value* v : operands) {
    for (int i = 0; i < v->rank(); ++i) {
      const int64_t d = v->dims()[i];
      int64_t& out = dims[i + rank - v->rank()];
      if (d != 1 && out != 1 && d != out) fail(std::string(op) + ": shapes do not broadcast");
      if (d != 1) out = d;
    }
  }
  return dims;
}

Value Builder::binary(const char* op, const Value& a_in, const Value& b_in) {
  if (a_in.element() != b_in.element()) {
    fail(std::string(op) + " of " + a_in.type.mlir() + " and " + b_in.type.mlir() + ": element types differ");
  }
  const auto dims = broadcast_shape({&a_in, &b_in}, op);
  Value a = broadcast_to(a_in, dims), b = broadcast_to(b_in, dims);
  TensorType t{a.element(), dims};
  return emit("stablehlo." + std::string(op) + " " + name(a) + ", " + name(b) + " : " + t.mlir(), t);
}

Value Builder::unary(const char* op, const Value& v) {
  return emit("stablehlo." + std::string(op) + " " + name(v) + " : " + v.type.mlir(), v.type);
}

Value Builder::compare(const char* direction, const Value& a_in, const Value& b_in) {
  if (a_in.element() != b_in.element()) fail("compare: element types differ");
  const auto dims = broadcast_shape({&a_in, &b_in}, "compare");
  Value a = broadcast_to(a_in, dims), b = broadcast_to(b_in, dims);
  TensorType t{ElementType::Pred, dims};
  return emit("stablehlo.compare " + std::string(direction) + ", " + name(a) + ", " + name(b) + ", " +
                  compare_type(a.element()) + " : (" + a.type.mlir() + ", " + b.type.mlir() + ") -> " + t.mlir(),
              t);
}

Value Builder::select(const Value& pred_in, const Value& a_in, const Value& b_in) {
  if (a_in.element() != b_in.element()) fail("select: element types differ");
  const auto dims = broadcast_shape({&pred_in, &a_in, &b_in}, "select");
  Value p = broadcast_to(pred_in, dims), a = broadcast_to(a_in, dims), b = broadcast_to(b_in, dims);
  TensorType t{a.element(), dims};
  return emit("stablehlo.select " + name(p) + ", " + name(a) + ", " + name(b) + " : " + p.type.mlir() + ", " +
                  t.mlir(),
              t);
}

Value Builder::dot_general(const Value& a, const Value& b, const std::vector<int64_t>& lhs_batch,
                           const std::vector<int64_t>& rhs_batch, const std::vector<int64_t>& lhs_contract,
                           const std::vector<int64_t>& rhs_contract) {
  std::vector<int64_t> dims;
  for (int64_t d : lhs_batch) dims.push_back(a.dims()[d]);
  for (int i = 0; i < a.rank(); ++i) {
    if (std::count(lhs_batch.begin(), lhs_batch.end(), i) || std::count(lhs_contract.begin(), lhs_contract.end(), i)) continue;
    dims.push_back(a.dims()[i]);
  }
  for (int i = 0; i < b.rank(); ++i) {
    if (std::count(rhs_batch.begin(), rhs_batch.end(), i) || std::count(rhs_contract.begin(), rhs_contract.end(), i)) continue;
    dims.push_back(b.dims()[i]);
  }
  TensorType t{a.element(), dims};
  return emit("stablehlo.dot_general " + name(a) + ", " + name(b) + ", batching_dims = " + list(lhs_batch) + " x " +
                  list(rhs_batch) + ", contracting_dims = " + list(lhs_contract) + " x " + list(rhs_contract) +
                  " : (" + a.type.mlir() + ", " + b.type.mlir() + ") -> " + t.mlir(),
              t);
}

Value Builder::reduce(const Value& v, const std::vector<int64_t>& dims, const char* combiner, double init) {
  Value init_value = constant(init, v.element());
  std::vector<int64_t> out_dims;
  for (int i = 0; i < v.rank(); ++i) {
    if (!std::count(dims.begin(), dims.end(), i)) out_dims.push_back(v.dims()[i]);
  }
  TensorType t{v.element(), out_dims};
  return emit("stablehlo.reduce(" + name(v) + " init: " + name(init_value) + ") applies stablehlo." + combiner +
                  " across dimensions = [" + join(dims) + "] : (" + v.type.mlir() + ", " + init_value.type.mlir() +
                  ") -> " + t.mlir(),
              t);
}

Value Builder::gather_flat(const Value& flat_in, const Value& indices) {
  TensorType t{flat_in.element(), indices.dims()};
  return emit("\"stablehlo.gather\"(" + name(flat_in) + ", " + name(indices) +
                  ") {dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], "
                  "index_vector_dim = " +
                  std::to_string(indices.rank()) + ">, slice_sizes = array<i64: 1>, indices_are_sorted = false} : (" +
                  flat_in.type.mlir() + ", " + indices.type.mlir() + ") -> " + t.mlir(),
              t);
}

Value Builder::scatter_flat(const Value& flat_in, const Value& indices, const Value& updates) {
  TensorType s{flat_in.element(), {}};
  const std::string lhs = "%r" + std::to_string(next_id_) + "a", rhs = "%r" + std::to_string(next_id_) + "b";
  return emit("\"stablehlo.scatter\"(" + name(flat_in) + ", " + name(indices) + ", " + name(updates) +
                  ") ({\n    ^bb0(" + lhs + ": " + s.mlir() + ", " + rhs + ": " + s.mlir() +
                  "):\n      stablehlo.return " + rhs + " : " + s.mlir() +
                  "\n    }) {scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], "
                  "scatter_dims_to_operand_dims = [0], index_vector_dim = " +
                  std::to_string(indices.rank()) + ">, indices_are_sorted = false, unique_indices = false} : (" +
                  flat_in.type.mlir() + ", " + indices.type.mlir() + ", " + updates.type.mlir() + ") -> " +
                  flat_in.type.mlir(),
              flat_in.type);
}

// ---------------------------------------------------------------------------------------------
// Primitives named by specs

std::vector<int64_t> Builder::normalize_dims(const std::vector<int64_t>& dims, int rank) const {
  std::vector<int64_t> out;
  if (dims.empty()) {
    out.resize(rank);
    std::iota(out.begin(), out.end(), 0);
    return out;
  }
  for (int64_t d : dims) {
    const int64_t wrapped = d < 0 ? d + std::max(rank, 1) : d;
    if (rank == 0 && (wrapped == 0)) continue;  // reducing a 0-d tensor over dim 0/-1 is a no-op
    if (wrapped < 0 || wrapped >= rank) fail("dimension out of range");
    if (!std::count(out.begin(), out.end(), wrapped)) out.push_back(wrapped);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Value Builder::matmul(const Value& a, const Value& b) { return dot_general(a, b, {}, {}, {1}, {0}); }

Value Builder::sum(const Value& v, const std::vector<int64_t>& dims_in, bool keepdim) {
  const auto dims = normalize_dims(dims_in, v.rank());
  Value r = reduce(v, dims, v.element() == ElementType::Pred ? "or" : "add", 0);
  if (!keepdim) return r;
  std::vector<int64_t> kept = v.dims();
  for (int64_t d : dims) kept[d] = 1;
  return reshape(r, kept);
}

Value Builder::mean(const Value& v, const std::vector<int64_t>& dims_in, bool keepdim) {
  const auto dims = normalize_dims(dims_in, v.rank());
  int64_t count = 1;
  for (int64_t d : dims) count *= v.dims()[d];
  // 0/0 gives NaN for an empty reduction, as PyTorch does.
  return div(sum(v, dims, keepdim), constant(static_cast<double>(count), v.element()));
}

Value Builder::cat(const std::vector<Value>& values, int64_t dim) {
  std::vector<Value> kept;
  for (const Value& v : values) {
    if (v.rank() == 1 && v.dims()[0] == 0) continue;  // legacy: a 1-D empty tensor is skipped
    kept.push_back(v);
  }
  if (kept.empty()) return values.at(0);
  const int rank = kept[0].rank();
  return concatenate(kept, dim < 0 ? dim + rank : dim);
}

// ---------------------------------------------------------------------------------------------
// Views

Value Builder::flat(const Value& v) { return reshape(v, {v.type.numel()}); }

Value Builder::view_indices(const ViewGeometry& view) {
  TensorType index_type{ElementType::S64, view.sizes};
  Value indices = full(static_cast<double>(view.offset), index_type);
  for (size_t d = 0; d < view.sizes.size(); ++d) {
    if (view.sizes[d] == 1 || view.strides[d] == 0) continue;
    Value step = mul(iota(index_type, static_cast<int64_t>(d)), constant_int(view.strides[d], ElementType::S64));
    indices = add(indices, step);
  }
  return indices;
}

namespace {

int64_t numel_of(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

bool is_contiguous(const ViewGeometry& view) {
  int64_t expected = 1;
  for (int d = static_cast<int>(view.sizes.size()) - 1; d >= 0; --d) {
    if (view.sizes[d] == 1) continue;
    if (view.strides[d] != expected) return false;
    expected *= view.sizes[d];
  }
  return true;
}

// If the view is a permutation of a dense row-major layout (transpose/permute of a contiguous
// tensor), returns the order of dims from outermost to innermost in memory.
bool dense_permutation(const ViewGeometry& view, std::vector<int64_t>* order) {
  const int rank = static_cast<int>(view.sizes.size());
  order->resize(rank);
  std::iota(order->begin(), order->end(), 0);
  std::stable_sort(order->begin(), order->end(), [&](int64_t a, int64_t b) {
    return view.strides[a] > view.strides[b];
  });
  int64_t expected = 1;
  for (int i = rank - 1; i >= 0; --i) {
    const int64_t d = (*order)[i];
    if (view.sizes[d] != 1 && view.strides[d] != expected) return false;
    expected *= view.sizes[d];
  }
  return true;
}

}  // namespace

Value Builder::read_view(const Value& storage, const ViewGeometry& view) {
  const int64_t n = numel_of(view.sizes);
  const int64_t storage_numel = storage.type.numel();
  if (n == 0) return full(0, TensorType{storage.element(), view.sizes});
  if (is_contiguous(view)) {
    if (view.offset == 0 && n == storage_numel) return reshape(storage, view.sizes);
    Value f = flat(storage);
    return reshape(slice(f, {view.offset}, {view.offset + n}, {1}), view.sizes);
  }
  std::vector<int64_t> order;
  if (view.offset == 0 && n == storage_numel && dense_permutation(view, &order)) {
    std::vector<int64_t> memory_dims;
    for (int64_t d : order) memory_dims.push_back(view.sizes[d]);
    Value in_memory_order = reshape(storage, memory_dims);
    std::vector<int64_t> inverse(order.size());
    for (size_t i = 0; i < order.size(); ++i) inverse[order[i]] = static_cast<int64_t>(i);
    return transpose(in_memory_order, inverse);
  }
  return gather_flat(flat(storage), view_indices(view));
}

Value Builder::write_view(const Value* storage, const TensorType& storage_type, const Value& value,
                          const ViewGeometry& view) {
  const int64_t n = numel_of(view.sizes);
  const int64_t storage_numel = storage_type.numel();
  if (n == storage_numel && view.offset == 0) {
    if (is_contiguous(view)) return reshape(value, storage_type.dims);
    std::vector<int64_t> order;
    if (dense_permutation(view, &order)) return reshape(transpose(value, order), storage_type.dims);
  }
  Value old = storage ? *storage : full(0, storage_type);
  if (n == 0) return old;
  Value updated = scatter_flat(flat(old), view_indices(view), value);
  return reshape(updated, storage_type.dims);
}

std::string Builder::finish(const std::vector<Value>& results) const {
  std::string text = "module @torchtpu {\n  func.func public @main(";
  for (size_t i = 0; i < parameters_.size(); ++i) {
    text += (i ? ", " : "") + name(parameters_[i]) + ": " + parameters_[i].type.mlir();
  }
  text += ") -> (";
  std::string names, types;
  for (size_t i = 0; i < results.size(); ++i) {
    names += (i ? ", " : "") + name(results[i]);
    types += (i ? ", " : "") + results[i].type.mlir();
  }
  text += types + ") {\n" + body_ + "    return " + names + " : " + types + "\n  }\n}\n";
  return text;
}

// ---------------------------------------------------------------------------------------------
// binary primitives (specs/binary.yaml): PyTorch's CPU formulas, so results match bit for bit
// where the CPU kernel is exact.

namespace {

bool is_signed_int(ElementType e) { return !is_float(e) && !is_unsigned(e) && e != ElementType::Pred; }

ElementType same_width_int(ElementType e) {
  switch (element_size(e)) {
    case 2: return ElementType::S16;
    case 4: return ElementType::S32;
    default: return ElementType::S64;
  }
}

}  // namespace

Value Builder::nominal(const Value& v) {
  if (!is_float(v.element()) || !is_float(nominal_element_) ||
      element_size(nominal_element_) >= element_size(v.element())) {
    return v;
  }
  return convert(convert(v, nominal_element_), v.element());
}

Value Builder::power(const Value& a, const Value& b) {
  if (!is_signed_int(a.element())) return binary("power", a, b);
  // CPU: x ** -n is 1 for x == 1, +-1 for x == -1 (by n's parity) and 0 otherwise.
  const ElementType e = a.element();
  Value zero = constant_int(0, e), one = constant_int(1, e), minus_one = constant_int(-1, e);
  Value positive = binary("power", a, maximum(b, zero));
  Value odd = ne(bitwise_and(b, one), zero);
  Value negative = select(eq(a, one), one, select(eq(a, minus_one), select(odd, minus_one, one), zero));
  return select(lt(b, zero), broadcast_like(negative, positive), positive);
}

Value Builder::remainder(const Value& a, const Value& b) {
  Value zero = scalar_like(0, a);
  Value mod = fmod(a, b);
  Value adjust = bitwise_and(ne(mod, zero), ne(lt(b, zero), lt(mod, zero)));
  return select(adjust, add(mod, b), mod);
}

Value Builder::div_rounded(const Value& a, const Value& b, const std::string& mode) {
  if (mode.empty()) return div(a, b);
  if (mode != "trunc" && mode != "floor") fail("div: unknown rounding_mode '" + mode + "'");
  Value zero = scalar_like(0, a), one = scalar_like(1, a);
  if (!is_float(a.element())) {
    Value quotient = div(a, b);  // truncates
    if (mode == "trunc" || is_unsigned(a.element())) return quotient;
    Value adjust = bitwise_and(ne(fmod(a, b), zero), ne(lt(a, zero), lt(b, zero)));
    return select(adjust, sub(quotient, one), quotient);
  }
  if (mode == "trunc") {
    // CPU rounds a half-precision quotient before truncating, unless the divisor is one element.
    Value q = b.type.numel() == 1 ? div(a, b) : nominal(div(a, b));
    return select(lt(q, zero), unary("ceil", q), unary("floor", q));
  }
  // CPU's div_floor_floating: exact for every representable quotient.
  Value mod = fmod(a, b);
  Value d = div(sub(a, mod), b);
  d = select(bitwise_and(ne(mod, zero), ne(lt(b, zero), lt(mod, zero))), sub(d, one), d);
  Value floored = unary("floor", d);
  floored = select(gt(sub(d, floored), scalar_like(0.5, a)), add(floored, one), floored);
  Value signed_zero = copysign(zero, div(a, b));
  Value result = select(ne(d, zero), floored, broadcast_like(signed_zero, floored));
  return select(eq(b, zero), div(a, b), result);  // x / 0: IEEE
}

Value Builder::nan_maximum(const Value& a, const Value& b) {
  Value m = maximum(a, b);
  if (!is_float(a.element())) return m;
  Value sum = add(a, b);  // NaN where either is
  return select(ne(sum, sum), sum, m);
}

Value Builder::nan_minimum(const Value& a, const Value& b) {
  Value m = minimum(a, b);
  if (!is_float(a.element())) return m;
  Value sum = add(a, b);
  return select(ne(sum, sum), sum, m);
}

Value Builder::fmax(const Value& a, const Value& b) {
  return select(ne(a, a), b, select(ne(b, b), a, maximum(a, b)));
}

Value Builder::fmin(const Value& a, const Value& b) {
  return select(ne(a, a), b, select(ne(b, b), a, minimum(a, b)));
}

Value Builder::hypot(const Value& a, const Value& b) {
  // sqrt(x^2 + y^2) on operands scaled by a power of two (exact), so the squares neither
  // overflow nor underflow.
  Value x = unary("abs", a), y = unary("abs", b);
  Value big = maximum(x, y);
  const bool wide = a.element() == ElementType::F64;
  auto c = [&](double v) { return scalar_like(v, a); };
  Value scale = select(gt(big, c(wide ? 0x1p500 : 0x1p60)), c(wide ? 0x1p-600 : 0x1p-70),
                       select(lt(big, c(wide ? 0x1p-500 : 0x1p-60)), c(wide ? 0x1p600 : 0x1p90), c(1)));
  Value xs = mul(x, scale), ys = mul(y, scale);
  Value h = div(sqrt(add(mul(xs, xs), mul(ys, ys))), scale);
  Value inf = c(INFINITY);
  Value any_inf = bitwise_or(eq(x, inf), eq(y, inf));  // hypot(inf, NaN) is inf
  return select(any_inf, broadcast_like(inf, h), h);
}

Value Builder::copysign(const Value& a, const Value& b) {
  const auto dims = broadcast_shape({&a, &b}, "copysign");
  Value magnitude = broadcast_to(unary("abs", a), dims);
  Value bits = reinterpret(broadcast_to(b, dims), same_width_int(b.element()));
  Value negative = lt(bits, constant_int(0, bits.element()));  // the sign bit, also of -0.0 and NaNs
  return select(negative, neg(magnitude), magnitude);
}

Value Builder::xlogy(const Value& x, const Value& y) {
  Value product = mul(x, nominal(log(y)));  // CPU rounds a half-precision log before the product
  Value zero = scalar_like(0, x);
  Value result = select(eq(x, zero), broadcast_like(zero, product), product);
  return select(ne(y, y), broadcast_like(y, result), result);  // y NaN: NaN, even for x == 0
}

Value Builder::lerp(const Value& start, const Value& end, const Value& weight) {
  // CPU: start + w * (end - start) for |w| < 0.5, else end - (end - start) * (1 - w).
  Value diff = sub(end, start);
  Value small = bitwise_and(lt(weight, scalar_like(0.5, weight)), gt(weight, scalar_like(-0.5, weight)));
  Value low = add(start, mul(weight, diff));
  Value high = sub(end, mul(diff, sub(scalar_like(1, weight), weight)));
  return select(small, low, high);
}

}  // namespace torchtpu::rt
