#include "hlo/hlo_builder.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <utility>

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

// The result of reducing `v` over (normalized) `dims`, given back its reduced dims as 1s.
Value keep_dims(Builder& b, const Value& reduced, const Value& v, const std::vector<int64_t>& dims, bool keepdim) {
  if (!keepdim) return reduced;
  std::vector<int64_t> kept = v.dims();
  for (int64_t d : dims) kept[d] = 1;
  return b.reshape(reduced, kept);
}

// v's dims without `dims`.
std::vector<int64_t> reduced_dims(const Value& v, const std::vector<int64_t>& dims) {
  std::vector<int64_t> out;
  for (int i = 0; i < v.rank(); ++i) {
    if (!std::count(dims.begin(), dims.end(), i)) out.push_back(v.dims()[i]);
  }
  return out;
}

}  // namespace

std::string Builder::name(const Value& v) const {
  return "%v" + std::to_string(v.id) + (v.result >= 0 ? "#" + std::to_string(v.result) : "");
}

std::vector<Value> Builder::emit_multi(const std::string& op_and_operands, const std::vector<TensorType>& result_types) {
  const int id = next_id_++;
  body_ += "    %v" + std::to_string(id) + ":" + std::to_string(result_types.size()) + " = " + op_and_operands + "\n";
  std::vector<Value> results;
  for (size_t i = 0; i < result_types.size(); ++i) results.push_back(Value{id, result_types[i], static_cast<int>(i)});
  return results;
}

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
  return reduce_from(v, dims, combiner, constant(init, v.element()));
}

Value Builder::reduce_from(const Value& v, const std::vector<int64_t>& dims, const char* combiner, const Value& init) {
  TensorType t{v.element(), reduced_dims(v, dims)};
  return emit("stablehlo.reduce(" + name(v) + " init: " + name(init) + ") applies stablehlo." + combiner +
                  " across dimensions = [" + join(dims) + "] : (" + v.type.mlir() + ", " + init.type.mlir() +
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
  return keep_dims(*this, reduce(v, dims, v.element() == ElementType::Pred ? "or" : "add", 0), v, dims, keepdim);
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

// ---------------------------------------------------------------------------------------------
// Random numbers

Value Builder::uniform01(const Value& state, const std::vector<int64_t>& dims, ElementType element) {
  const bool wide = element == ElementType::F64;
  const ElementType bits_type = wide ? ElementType::U64 : ElementType::U32;
  const ElementType float_type = wide ? ElementType::F64 : ElementType::F32;
  const TensorType bits_tensor{bits_type, dims};
  // Counter values this draw consumes (64 random bits each); every draw starts from `state`.
  random_counters_ = std::max(random_counters_, wide ? bits_tensor.numel() : (bits_tensor.numel() + 1) / 2);
  auto drawn = emit_multi("\"stablehlo.rng_bit_generator\"(" + name(state) +
                              ") {rng_algorithm = #stablehlo<rng_algorithm THREE_FRY>} : (" + state.type.mlir() +
                              ") -> (" + state.type.mlir() + ", " + bits_tensor.mlir() + ")",
                          {state.type, bits_tensor});
  // Keep the top mantissa bits under the exponent of 1.0: a float in [1, 2), then subtract 1.
  const int shift = wide ? 12 : 9;
  const int64_t one_bits = wide ? 0x3FF0000000000000LL : 0x3F800000LL;
  Value mantissa = binary("shift_right_logical", drawn[1], constant_int(shift, bits_type));
  Value in_one_two = binary("or", mantissa, constant_int(one_bits, bits_type));
  return sub(reinterpret(in_one_two, float_type), constant(1.0, float_type));
}

Value Builder::uniform(const Value& state, const Value& like, double low, double high) {
  Value u = uniform01(state, like.dims(), like.element());
  Value scaled = add(mul(u, constant(high - low, u.element())), constant(low, u.element()));
  return convert(scaled, like.element());
}

Value Builder::normal(const Value& state, const Value& like, double mean, double std) {
  // Box-Muller over two independent uniform draws (one rng call of twice the elements).
  std::vector<int64_t> twice = like.dims();
  twice.insert(twice.begin(), 2);
  Value u = uniform01(state, twice, like.element());
  std::vector<int64_t> start(twice.size(), 0), limit = twice, strides(twice.size(), 1);
  limit[0] = 1;
  Value u1 = reshape(slice(u, start, limit, strides), like.dims());
  start[0] = 1;
  limit[0] = 2;
  Value u2 = reshape(slice(u, start, limit, strides), like.dims());
  const ElementType e = u.element();
  // 1 - u1 lies in (0, 1], so the logarithm is finite.
  Value radius = sqrt(mul(constant(-2.0, e), log(sub(constant(1.0, e), u1))));
  Value z = mul(radius, unary("cosine", mul(u2, constant(6.283185307179586, e))));
  return convert(add(mul(z, constant(std, e)), constant(mean, e)), like.element());
}

Value Builder::bernoulli(const Value& state, const Value& like, double p) {
  Value u = uniform01(state, like.dims(), ElementType::F32);
  return convert(lt(u, constant(p, ElementType::F32)), like.element());
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
// nn (activations, softmax, losses) primitives

Value Builder::max_along(const Value& v, int64_t dim) {
  const auto dims = normalize_dims({dim}, v.rank());
  return keep_dims(*this, reduce(v, dims, "maximum", -std::numeric_limits<double>::infinity()), v, dims, true);
}

Value Builder::softmax(const Value& v, int64_t dim) {
  Value e = exp(sub(v, max_along(v, dim)));
  return div(e, sum(e, {dim}, true));
}

Value Builder::log_softmax(const Value& v, int64_t dim) {
  Value shifted = sub(v, max_along(v, dim));
  return sub(shifted, log(sum(exp(shifted), {dim}, true)));
}

namespace {
constexpr double kSqrt1_2 = 0.70710678118654752440;  // 1/sqrt(2)
constexpr double k2_SqrtPi = 1.12837916709551257390;  // 2/sqrt(pi)
constexpr double kSqrt2 = 1.41421356237309504880;
constexpr double kGeluKappa = 0.044715;

void check_approximate(const std::string& approximate) {
  if (approximate != "none" && approximate != "tanh") fail("gelu: approximate must be 'none' or 'tanh', not '" + approximate + "'");
}
}  // namespace

Value Builder::gelu(const Value& x, const std::string& approximate) {
  check_approximate(approximate);
  auto c = [&](double value) { return scalar_like(value, x); };
  if (approximate == "tanh") {
    // 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + kappa * x^3)))
    Value cube = mul(mul(x, x), x);
    Value inner = mul(c(kSqrt2 * k2_SqrtPi * 0.5), add(x, mul(c(kGeluKappa), cube)));
    return mul(mul(c(0.5), x), add(c(1), tanh(inner)));
  }
  // x * 0.5 * (1 + erf(x / sqrt(2)))
  return mul(mul(x, c(0.5)), add(c(1), erf(mul(x, c(kSqrt1_2)))));
}

Value Builder::gelu_backward(const Value& grad, const Value& x, const std::string& approximate) {
  check_approximate(approximate);
  auto c = [&](double value) { return scalar_like(value, x); };
  if (approximate == "tanh") {
    const double beta = kSqrt2 * k2_SqrtPi * 0.5;
    Value x_sq = mul(x, x);
    Value inner = mul(c(beta), add(x, mul(c(kGeluKappa), mul(x_sq, x))));
    Value t = tanh(inner);
    Value left = mul(c(0.5), x);
    Value left_derivative = mul(c(0.5), add(c(1), t));
    Value right_derivative = mul(mul(sub(c(1), mul(t, t)), c(beta)), add(c(1), mul(c(3 * kGeluKappa), x_sq)));
    return mul(grad, add(left_derivative, mul(left, right_derivative)));
  }
  Value cdf = mul(c(0.5), add(c(1), erf(mul(x, c(kSqrt1_2)))));
  Value pdf = mul(c(k2_SqrtPi * kSqrt1_2 * 0.5), exp(mul(mul(x, x), c(-0.5))));
  return mul(grad, add(cdf, mul(x, pdf)));
}

Value Builder::nn_loss_reduce(const Value& v, int64_t reduction) {
  switch (reduction) {
    case 0: return v;
    case 1: return mean(v, {}, false);
    case 2: return sum(v, {}, false);
  }
  fail("loss reduction must be 0 (none), 1 (mean) or 2 (sum), not " + std::to_string(reduction));
}

Value Builder::mse_loss_norm(const Value& like, int64_t reduction) {
  return scalar_like(reduction == 1 ? 2.0 / static_cast<double>(like.type.numel()) : 2.0, like);
}

// Reduction family

namespace {

int bits_of(ElementType e) { return element_size(e) * 8; }

// The smallest (lowest = true) or largest value of an element type, exactly.
Value extreme_constant(Builder& b, ElementType e, bool lowest) {
  if (is_float(e)) return b.constant(lowest ? -HUGE_VAL : HUGE_VAL, e);
  if (e == ElementType::Pred) return b.constant_int(lowest ? 0 : 1, e);
  if (is_unsigned(e)) return b.constant_int(lowest ? 0 : static_cast<int64_t>((uint64_t{1} << bits_of(e)) - 1), e);
  const int64_t max = bits_of(e) == 64 ? INT64_MAX : (int64_t{1} << (bits_of(e) - 1)) - 1;
  return b.constant_int(lowest ? -max - 1 : max, e);
}

// x != x: true at NaNs.
Value is_nan(Builder& b, const Value& x) { return b.ne(x, x); }

// PyTorch's max/min propagate NaN; XLA's maximum/minimum need not: NaN where any reduced element is.
Value propagate_nan(Builder& b, const Value& reduced, const Value& v, const std::vector<int64_t>& dims) {
  if (!is_float(v.element())) return reduced;
  Value has_nan = b.reduce(is_nan(b, v), dims, "or", 0);
  return b.select(has_nan, b.scalar_like(NAN, reduced), reduced);
}

}  // namespace

Value Builder::prod(const Value& v, const std::vector<int64_t>& dims_in, bool keepdim) {
  const auto dims = normalize_dims(dims_in, v.rank());
  Value r = reduce(v, dims, v.element() == ElementType::Pred ? "and" : "multiply", 1);
  return keep_dims(*this, r, v, dims, keepdim);
}

namespace {

// max/min over (normalized) dims, without the empty check; keeps the reduced dims as 1s.
Value max_or_min(Builder& b, const Value& v, const std::vector<int64_t>& dims, bool is_max) {
  Value r = v.element() == ElementType::Pred
                ? b.reduce(v, dims, is_max ? "or" : "and", is_max ? 0 : 1)
                : b.reduce_from(v, dims, is_max ? "maximum" : "minimum", extreme_constant(b, v.element(), is_max));
  return keep_dims(b, propagate_nan(b, r, v, dims), v, dims, true);
}

// max/min have no identity: reducing nothing is an error, as on PyTorch's CPU.
void check_not_empty(const Value& v, const std::vector<int64_t>& dims, const char* op) {
  for (int64_t d : dims) {
    if (v.dims()[d] == 0) {
      fail(std::string(op) + "(): Expected reduction dim to be specified for input.numel() == 0. "
                             "Specify the reduction dim with the 'dim' argument.");
    }
  }
}

}  // namespace

Value Builder::amax(const Value& v, const std::vector<int64_t>& dims_in, bool keepdim) {
  const auto dims = normalize_dims(dims_in, v.rank());
  check_not_empty(v, dims, "max");
  Value r = max_or_min(*this, v, dims, true);
  return keepdim ? r : reshape(r, reduced_dims(v, dims));
}

Value Builder::amin(const Value& v, const std::vector<int64_t>& dims_in, bool keepdim) {
  const auto dims = normalize_dims(dims_in, v.rank());
  check_not_empty(v, dims, "min");
  Value r = max_or_min(*this, v, dims, false);
  return keepdim ? r : reshape(r, reduced_dims(v, dims));
}

Value Builder::any(const Value& v, const std::vector<int64_t>& dims_in, bool keepdim, bool all_dims) {
  Value truth = v.element() == ElementType::Pred ? v : ne(v, scalar_like(0, v));
  if (!all_dims && dims_in.empty()) return truth;
  const auto dims = normalize_dims(all_dims ? std::vector<int64_t>{} : dims_in, v.rank());
  return keep_dims(*this, reduce(truth, dims, "or", 0), v, dims, keepdim);
}

Value Builder::all(const Value& v, const std::vector<int64_t>& dims_in, bool keepdim, bool all_dims) {
  Value truth = v.element() == ElementType::Pred ? v : ne(v, scalar_like(0, v));
  if (!all_dims && dims_in.empty()) return truth;
  const auto dims = normalize_dims(all_dims ? std::vector<int64_t>{} : dims_in, v.rank());
  return keep_dims(*this, reduce(truth, dims, "and", 1), v, dims, keepdim);
}

namespace {

// The first index along `dims_in` (one dim, or none = the flattened tensor) where v reaches its
// max (or min); NaN ranks above everything, as on PyTorch's CPU.
Value arg_extreme(Builder& b, const Value& v, const std::vector<int64_t>& dims_in, bool keepdim, bool is_max) {
  Value x = v;
  int64_t d = 0;
  if (dims_in.empty()) {
    x = b.reshape(v, {v.type.numel()});
  } else {
    d = dims_in.at(0) < 0 ? dims_in[0] + std::max(v.rank(), 1) : dims_in[0];
    if (v.rank() == 0) return b.constant_int(0, ElementType::S64);
  }
  Value m = is_max ? b.amax(x, {d}, true) : b.amin(x, {d}, true);
  Value hit = b.eq(x, m);
  if (is_float(x.element())) hit = b.binary("or", hit, b.binary("and", is_nan(b, x), is_nan(b, m)));
  const TensorType index_type{ElementType::S64, x.dims()};
  Value candidates = b.select(hit, b.iota(index_type, d), b.constant_int(x.dims()[d], ElementType::S64));
  Value r = b.reduce(candidates, {d}, "minimum", static_cast<double>(x.dims()[d]));
  if (!keepdim) return r;
  std::vector<int64_t> kept = v.dims();
  if (dims_in.empty()) {
    std::fill(kept.begin(), kept.end(), 1);
  } else {
    kept[d] = 1;
  }
  return b.reshape(r, kept);
}

}  // namespace

Value Builder::argmax(const Value& v, const std::vector<int64_t>& dims, bool keepdim) {
  return arg_extreme(*this, v, dims, keepdim, true);
}

Value Builder::argmin(const Value& v, const std::vector<int64_t>& dims, bool keepdim) {
  return arg_extreme(*this, v, dims, keepdim, false);
}

Value Builder::var(const Value& v, const std::vector<int64_t>& dims_in, double correction, bool keepdim) {
  const auto dims = normalize_dims(dims_in, v.rank());
  int64_t count = 1;
  for (int64_t d : dims) count *= v.dims()[d];
  Value deviation = sub(v, mean(v, dims, true));
  Value squares = sum(mul(deviation, deviation), dims, keepdim);
  // PyTorch divides by max(0, N - correction): 0 gives inf (or NaN for 0/0).
  return div(squares, constant(std::max(0.0, static_cast<double>(count) - correction), v.element()));
}

Value Builder::stddev(const Value& v, const std::vector<int64_t>& dims, double correction, bool keepdim) {
  return sqrt(var(v, dims, correction, keepdim));
}

Value Builder::logsumexp(const Value& v, const std::vector<int64_t>& dims_in, bool keepdim) {
  const auto dims = normalize_dims(dims_in, v.rank());
  // Shift by the max, except where it is infinite (all -inf stays -inf; +inf stays +inf).
  Value m = max_or_min(*this, v, dims, true);  // an empty reduction is fine here: -inf
  Value finite_m = select(eq(unary("abs", m), scalar_like(HUGE_VAL, m)), scalar_like(0, m), m);
  Value s = sum(exp(sub(v, finite_m)), dims, keepdim);
  Value shift = keepdim ? finite_m : reshape(finite_m, s.dims());
  return add(log(s), shift);
}

Value Builder::vector_norm(const Value& v, double ord, const std::vector<int64_t>& dims, bool keepdim) {
  Value a = unary("abs", v);
  if (ord == HUGE_VAL) return amax(a, dims, keepdim);
  if (ord == -HUGE_VAL) return amin(a, dims, keepdim);
  if (ord == 0) return sum(convert(ne(v, scalar_like(0, v)), v.element()), dims, keepdim);
  if (ord == 1) return sum(a, dims, keepdim);
  if (ord == 2) return sqrt(sum(mul(a, a), dims, keepdim));
  Value powered = binary("power", a, scalar_like(ord, a));
  return binary("power", sum(powered, dims, keepdim), scalar_like(1.0 / ord, a));
}

namespace {

// Inclusive scan along `dim` by doubling steps (Hillis-Steele): x += x shifted by 1, 2, 4, ...
// Integer scans are exact.
Value scan(Builder& b, const Value& v, int64_t dim_in, const char* op, double identity) {
  if (v.rank() == 0) return v;
  const int64_t dim = dim_in < 0 ? dim_in + v.rank() : dim_in;
  const int64_t n = v.dims().at(dim);
  Value x = v;
  for (int64_t k = 1; k < n; k *= 2) {
    std::vector<int64_t> pad_dims = v.dims(), start(v.rank(), 0), limit = v.dims(), strides(v.rank(), 1);
    pad_dims[dim] = k;
    limit[dim] = n - k;
    Value shifted = b.concatenate({b.full(identity, TensorType{v.element(), pad_dims}), b.slice(x, start, limit, strides)},
                                  dim);
    x = b.binary(op, x, shifted);
  }
  return x;
}

}  // namespace

Value Builder::cumsum(const Value& v, int64_t dim) {
  return scan(*this, v, dim, v.element() == ElementType::Pred ? "or" : "add", 0);
}

Value Builder::cumprod(const Value& v, int64_t dim) {
  return scan(*this, v, dim, v.element() == ElementType::Pred ? "and" : "multiply", 1);
}


// unary elementwise primitives

namespace {

// The largest finite value of a float element type.
double largest_finite(ElementType e) {
  switch (e) {
    case ElementType::F16: return 65504.0;
    case ElementType::BF16: return 3.3895313892515355e38;
    case ElementType::F32: return 3.4028234663852886e38;
    default: return 1.7976931348623157e308;
  }
}

}  // namespace

Value Builder::abs(const Value& v) {
  if (v.element() == ElementType::Pred || is_unsigned(v.element())) return v;
  return unary("abs", v);
}

Value Builder::sign(const Value& v) {
  if (v.element() == ElementType::Pred) return v;
  const Value zero = scalar_like(0, v);
  return sub(convert(gt(v, zero), v.element()), convert(lt(v, zero), v.element()));
}

// sinh(|x|): 0.5 * (u + u / (u + 1)) with u = expm1(|x|) below 1 (no cancellation near 0), else
// (0.5 e) e - (0.5 / e) / e with e = exp(|x| / 2), which stays finite up to the largest sinh.
Value Builder::sinh(const Value& v) {
  const Value a = abs(v), half = scalar_like(0.5, v), one = scalar_like(1, v);
  const Value u = expm1(a);
  const Value small = mul(half, add(u, div(u, add(u, one))));
  const Value e = exp(mul(half, a));
  const Value large = sub(mul(mul(half, e), e), div(div(half, e), e));
  const Value s = select(lt(a, one), small, large);
  return select(lt(v, scalar_like(0, v)), neg(s), s);
}

Value Builder::cosh(const Value& v) {
  const Value half = scalar_like(0.5, v);
  const Value e = exp(mul(half, abs(v)));
  return add(mul(mul(half, e), e), div(div(half, e), e));
}

Value Builder::erf(const Value& v) {
  return emit("\"chlo.erf\"(" + name(v) + ") : (" + v.type.mlir() + ") -> " + v.type.mlir(), v.type);
}

Value Builder::floor(const Value& v) { return is_float(v.element()) ? unary("floor", v) : v; }
Value Builder::ceil(const Value& v) { return is_float(v.element()) ? unary("ceil", v) : v; }
Value Builder::round(const Value& v) { return is_float(v.element()) ? unary("round_nearest_even", v) : v; }
Value Builder::round_decimals(const Value& v, int64_t decimals) {
  const Value scale = scalar_like(std::pow(10.0, static_cast<double>(decimals < 0 ? -decimals : decimals)), v);
  return decimals < 0 ? mul(round(div(v, scale)), scale) : div(round(mul(v, scale)), scale);
}

Value Builder::trunc(const Value& v) {
  if (!is_float(v.element())) return v;
  return select(lt(v, scalar_like(0, v)), ceil(v), floor(v));
}

Value Builder::isinf(const Value& v) {
  if (!is_float(v.element())) return full(0, TensorType{ElementType::Pred, v.dims()});
  return eq(abs(v), scalar_like(HUGE_VAL, v));
}

Value Builder::isposinf(const Value& v) {
  if (!is_float(v.element())) return full(0, TensorType{ElementType::Pred, v.dims()});
  return eq(v, scalar_like(HUGE_VAL, v));
}

Value Builder::isneginf(const Value& v) {
  if (!is_float(v.element())) return full(0, TensorType{ElementType::Pred, v.dims()});
  return eq(v, scalar_like(-HUGE_VAL, v));
}

Value Builder::signbit(const Value& v) {
  const ElementType e = v.element();
  if (e == ElementType::Pred || is_unsigned(e)) return full(0, TensorType{ElementType::Pred, v.dims()});
  if (!is_float(e)) return lt(v, scalar_like(0, v));
  const ElementType bits = element_size(e) == 8 ? ElementType::S64 : element_size(e) == 4 ? ElementType::S32 : ElementType::S16;
  const Value i = reinterpret(v, bits);
  return lt(i, scalar_like(0, i));
}

Value Builder::nan_to_num(const Value& v, std::optional<double> nan, std::optional<double> posinf,
                          std::optional<double> neginf) {
  if (!is_float(v.element())) return v;
  const double big = largest_finite(v.element());
  Value r = select(isnan(v), scalar_like(nan.value_or(0.0), v), v);
  r = select(isposinf(v), scalar_like(posinf.value_or(big), v), r);
  return select(isneginf(v), scalar_like(neginf.value_or(-big), v), r);
}

// A NaN in any operand gives NaN, as PyTorch's clamp does (XLA's CPU maximum(1, NaN) gives 1).
Value Builder::clamp(const Value& v, const std::optional<Value>& min, const std::optional<Value>& max) {
  Value r = v;
  for (const auto& [bound, op] : {std::pair{&min, "maximum"}, std::pair{&max, "minimum"}}) {
    if (!*bound) continue;
    const Value next = binary(op, r, **bound);
    r = is_float(v.element()) ? select(isnan(r), r, select(isnan(**bound), **bound, next)) : next;
  }
  return r;
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

Value Builder::maximum(const Value& a, const Value& b) {
  Value m = binary("maximum", a, b);
  if (!is_float(a.element())) return m;
  Value sum = add(a, b);  // NaN where either is
  return select(ne(sum, sum), sum, m);
}

Value Builder::minimum(const Value& a, const Value& b) {
  Value m = binary("minimum", a, b);
  if (!is_float(a.element())) return m;
  Value sum = add(a, b);
  return select(ne(sum, sum), sum, m);
}

Value Builder::fmax(const Value& a, const Value& b) {
  return select(ne(a, a), b, select(ne(b, b), a, binary("maximum", a, b)));
}

Value Builder::fmin(const Value& a, const Value& b) {
  return select(ne(a, a), b, select(ne(b, b), a, binary("minimum", a, b)));
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

// ---------------------------------------------------------------------------------------------
// linalg primitives (specs/linalg.yaml)

Value Builder::bmm(const Value& a, const Value& b) { return dot_general(a, b, {0}, {0}, {2}, {1}); }

Value Builder::mv(const Value& a, const Value& v) { return dot_general(a, v, {}, {}, {1}, {0}); }

Value Builder::dot(const Value& a, const Value& b) { return dot_general(a, b, {}, {}, {0}, {0}); }

Value Builder::addbmm(const Value& self, const Value& batch1, const Value& batch2, const Value& beta,
                      const Value& alpha) {
  const int64_t batches = batch1.dims().at(0), n = batch1.dims().at(1), m = batch2.dims().at(2);
  Value r = broadcast_to(select(eq(beta, scalar_like(0, beta)), scalar_like(0, self), mul(self, beta)), {n, m});
  if (batches == 0) return r;
  const Value products = bmm(batch1, batch2);
  for (int64_t i = 0; i < batches; ++i) {
    const Value p = reshape(slice(products, {i, 0, 0}, {i + 1, n, m}, {1, 1, 1}), {n, m});
    r = nominal(add(r, mul(p, alpha)));
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// indexing (gather / scatter, embedding, nll_loss) primitives

namespace {

int64_t wrap_dim(int64_t dim, int rank, const char* op) {
  const int64_t wrapped = dim < 0 ? dim + std::max(rank, 1) : dim;
  if (wrapped < 0 || wrapped >= std::max(rank, 1)) fail(std::string(op) + ": dimension out of range");
  return wrapped;
}

// The full coordinates of every element of `index` into a rank-`index.rank()` operand: the element
// itself along `dim`, its own position along every other dim; shape index.dims + [rank], int64.
Value full_coordinates(Builder& b, const Value& index, int64_t dim) {
  std::vector<int64_t> one = index.dims();
  one.push_back(1);
  std::vector<Value> parts;
  for (int d = 0; d < index.rank(); ++d) {
    Value c = d == dim ? b.convert(index, ElementType::S64) : b.iota(TensorType{ElementType::S64, index.dims()}, d);
    parts.push_back(b.reshape(c, one));
  }
  return b.concatenate(parts, index.rank());
}

std::string dims_field(const char* name, const std::vector<int64_t>& dims) {
  return dims.empty() ? "" : std::string(name) + " = " + list(dims) + ", ";
}

std::vector<int64_t> iota_list(int64_t n) {
  std::vector<int64_t> out(n);
  std::iota(out.begin(), out.end(), 0);
  return out;
}

}  // namespace

Value Builder::index_select(const Value& v, int64_t dim_in, const Value& index) {
  if (v.rank() == 0) return v;  // a 0-d self: its one element (index 0)
  const int64_t dim = wrap_dim(dim_in, v.rank(), "index_select");
  std::vector<int64_t> out_dims = v.dims();
  out_dims[dim] = index.type.numel();
  TensorType t{v.element(), out_dims};
  if (t.numel() == 0) return full(0, t);
  Value starts = reshape(convert(index, ElementType::S64), {index.type.numel(), 1});
  std::vector<int64_t> offset_dims, slice_sizes = v.dims();
  slice_sizes[dim] = 1;
  for (int d = 0; d < v.rank(); ++d) {
    if (d != dim) offset_dims.push_back(d);
  }
  return emit("\"stablehlo.gather\"(" + name(v) + ", " + name(starts) + ") {dimension_numbers = #stablehlo.gather<" +
                  dims_field("offset_dims", offset_dims) + "collapsed_slice_dims = [" + std::to_string(dim) +
                  "], start_index_map = [" + std::to_string(dim) + "], index_vector_dim = 1>, slice_sizes = " +
                  i64_array(slice_sizes) + ", indices_are_sorted = false} : (" + v.type.mlir() + ", " +
                  starts.type.mlir() + ") -> " + t.mlir(),
              t);
}

Value Builder::take_along(const Value& v, int64_t dim_in, const Value& index) {
  TensorType t{v.element(), index.dims()};
  if (t.numel() == 0) return full(0, t);
  if (v.rank() == 0 || index.rank() == 0) {  // 0-d operands act as 1-element 1-D ones
    Value r = take_along(reshape(v, {v.type.numel()}), 0, reshape(index, {index.type.numel()}));
    return reshape(r, index.dims());
  }
  const int64_t dim = wrap_dim(dim_in, v.rank(), "gather");
  if (index.rank() != v.rank()) fail("gather: index and self differ in rank");
  Value coords = full_coordinates(*this, index, dim);
  const std::vector<int64_t> all = iota_list(v.rank());
  return emit("\"stablehlo.gather\"(" + name(v) + ", " + name(coords) +
                  ") {dimension_numbers = #stablehlo.gather<collapsed_slice_dims = " + list(all) +
                  ", start_index_map = " + list(all) + ", index_vector_dim = " + std::to_string(index.rank()) +
                  ">, slice_sizes = " + i64_array(std::vector<int64_t>(v.rank(), 1)) +
                  ", indices_are_sorted = false} : (" + v.type.mlir() + ", " + coords.type.mlir() + ") -> " +
                  t.mlir(),
              t);
}

Value Builder::scatter_along(const Value& v, int64_t dim_in, const Value& index, const Value& src_in,
                             const std::string& reduce) {
  if (index.type.numel() == 0) return v;
  if (v.rank() == 0 || index.rank() == 0) {
    Value src = src_in.rank() == 0 ? src_in : reshape(src_in, {src_in.type.numel()});
    Value r = scatter_along(reshape(v, {v.type.numel()}), 0, reshape(index, {index.type.numel()}), src, reduce);
    return reshape(r, v.dims());
  }
  const int64_t dim = wrap_dim(dim_in, v.rank(), "scatter");
  if (index.rank() != v.rank()) fail("scatter: index and self differ in rank");
  Value src = convert(src_in, v.element());
  if (src.rank() == 0) {
    src = broadcast_to(src, index.dims());
  } else if (src.dims() != index.dims()) {
    if (src.rank() != index.rank()) fail("scatter: index and src differ in rank");
    src = slice(src, std::vector<int64_t>(src.rank(), 0), index.dims(), std::vector<int64_t>(src.rank(), 1));
  }
  Value coords = full_coordinates(*this, index, dim);

  // The combiner region: (old, new) -> stored value.
  const TensorType s{v.element(), {}};
  const std::string st = s.mlir(), r = "%r" + std::to_string(next_id_);
  const std::string a = r + "a", n = r + "b";
  std::string body;
  std::string result = n;
  const bool pred = v.element() == ElementType::Pred;
  if (reduce == "add" || reduce == "sum" || reduce == "multiply" || reduce == "prod") {
    const bool add = reduce == "add" || reduce == "sum";
    const char* op = pred ? (add ? "or" : "and") : (add ? "add" : "multiply");
    body = "      " + r + "c = stablehlo." + op + " " + a + ", " + n + " : " + st + "\n";
    result = r + "c";
  } else if (reduce == "amax" || reduce == "amin") {
    const char* op = reduce == "amax" ? "maximum" : "minimum";
    body = "      " + r + "c = stablehlo." + op + " " + a + ", " + n + " : " + st + "\n";
    result = r + "c";
    if (is_float(v.element())) {  // NaN propagates from either side, as on CPU
      const std::string cmp = std::string(compare_type(v.element()));
      const std::string pt = TensorType{ElementType::Pred, {}}.mlir();
      body += "      " + r + "d = stablehlo.compare NE, " + a + ", " + a + ", " + cmp + " : (" + st + ", " + st +
              ") -> " + pt + "\n";
      body += "      " + r + "e = stablehlo.select " + r + "d, " + a + ", " + r + "c : " + pt + ", " + st + "\n";
      body += "      " + r + "f = stablehlo.compare NE, " + n + ", " + n + ", " + cmp + " : (" + st + ", " + st +
              ") -> " + pt + "\n";
      body += "      " + r + "g = stablehlo.select " + r + "f, " + n + ", " + r + "e : " + pt + ", " + st + "\n";
      result = r + "g";
    }
  } else if (!reduce.empty()) {
    fail("scatter: unknown reduce '" + reduce + "'");
  }
  const std::vector<int64_t> all = iota_list(v.rank());
  return emit("\"stablehlo.scatter\"(" + name(v) + ", " + name(coords) + ", " + name(src) + ") ({\n    ^bb0(" + a +
                  ": " + st + ", " + n + ": " + st + "):\n" + body + "      stablehlo.return " + result + " : " + st +
                  "\n    }) {scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = " + list(all) +
                  ", scatter_dims_to_operand_dims = " + list(all) + ", index_vector_dim = " +
                  std::to_string(index.rank()) + ">, indices_are_sorted = false, unique_indices = false} : (" +
                  v.type.mlir() + ", " + coords.type.mlir() + ", " + src.type.mlir() + ") -> " + v.type.mlir(),
              v.type);
}

Value Builder::scatter_reduce_along(const Value& v, int64_t dim, const Value& index, const Value& src,
                                    const std::string& reduce, bool include_self) {
  if (reduce != "sum" && reduce != "prod" && reduce != "mean" && reduce != "amax" && reduce != "amin") {
    fail("scatter_reduce: reduce must be sum, prod, mean, amax or amin, not '" + reduce + "'");
  }
  Value base = v;
  if (!include_self) {  // where an index points, start from the reduction's identity
    Value hit = scatter_along(full(0, TensorType{ElementType::Pred, v.dims()}), dim, index,
                              constant_int(1, ElementType::Pred), "");
    Value identity = reduce == "prod" ? scalar_like(1, v)
                     : reduce == "amax" ? extreme_constant(*this, v.element(), true)
                     : reduce == "amin" ? extreme_constant(*this, v.element(), false)
                                        : scalar_like(0, v);
    base = select(hit, broadcast_like(identity, v), v);
  }
  Value combined = scatter_along(base, dim, index, src, reduce == "mean" ? "sum" : reduce);
  if (reduce != "mean") return combined;
  // mean: the sum over (self and) the scattered elements, divided by their count (at least 1).
  Value count = scatter_along(full(include_self ? 1 : 0, v.type), dim, index, scalar_like(1, v), "sum");
  count = select(eq(count, scalar_like(0, v)), broadcast_like(scalar_like(1, v), count), count);
  return is_float(v.element()) ? div(combined, count) : div_rounded(combined, count, "floor");
}

Value Builder::embedding_backward(const Value& grad, const Value& indices, int64_t num_weights, int64_t padding_idx,
                                  bool scale_grad_by_freq) {
  const int64_t n = indices.type.numel();
  const int64_t width = grad.rank() == 0 ? 1 : grad.dims().back();
  TensorType t{grad.element(), {num_weights, width}};
  if (n == 0 || t.numel() == 0) return full(0, t);
  Value rows = reshape(grad, {n, width});
  Value idx = reshape(convert(indices, ElementType::S64), {n});
  if (scale_grad_by_freq) {  // each row times 1 / (how often its index occurs), as CPU does
    Value ones = full(1, TensorType{grad.element(), {n}});
    Value counts = scatter_along(full(0, TensorType{grad.element(), {num_weights}}), 0, idx, ones, "add");
    Value scale = div(scalar_like(1, grad), take_along(counts, 0, idx));
    rows = mul(rows, broadcast_in_dim(scale, {n, width}, {0}));
  }
  Value keep = ne(idx, constant_int(padding_idx, ElementType::S64));
  rows = select(broadcast_in_dim(keep, {n, width}, {0}), rows, broadcast_like(scalar_like(0, rows), rows));
  return scatter_along(full(0, t), 0, broadcast_in_dim(idx, {n, width}, {0}), rows, "add");
}

namespace {

struct NllParts {
  int64_t class_dim;
  Value target;  // int64, self's dims without the class dim
  Value keep;    // target != ignore_index
  Value weight;  // weight[target] (1 without weights), 0 where ignored
};

NllParts nll_parts(Builder& b, const Value& self, const Value& target, const std::optional<Value>& weight,
                   int64_t ignore_index) {
  NllParts p;
  p.class_dim = self.rank() >= 2 ? 1 : 0;
  p.target = b.convert(target, ElementType::S64);
  p.keep = b.ne(p.target, b.constant_int(ignore_index, ElementType::S64));
  Value w = weight ? b.reshape(b.take_along(*weight, 0, b.reshape(p.target, {p.target.type.numel()})), p.target.dims())
                   : b.full(1, TensorType{self.element(), p.target.dims()});
  p.weight = b.select(p.keep, w, b.broadcast_like(b.scalar_like(0, w), w));
  return p;
}

// `per_target` (target's shape) laid out along self's dims (the class dim broadcast).
Value along_classes(Builder& b, const Value& per_target, const Value& self, int64_t class_dim) {
  std::vector<int64_t> mapping;
  for (int d = 0; d < self.rank(); ++d) {
    if (d != class_dim) mapping.push_back(d);
  }
  return b.broadcast_in_dim(per_target, self.dims(), mapping);
}

}  // namespace

Value Builder::nll_loss(const Value& self, const Value& target, const std::optional<Value>& weight, int64_t reduction,
                        int64_t ignore_index) {
  NllParts p = nll_parts(*this, self, target, weight, ignore_index);
  std::vector<int64_t> index_dims = p.target.dims();
  index_dims.insert(index_dims.begin() + p.class_dim, 1);
  Value picked = reshape(take_along(self, p.class_dim, reshape(p.target, index_dims)), p.target.dims());
  // -self[target] * weight[target]; exactly 0 where ignored (whatever self holds there).
  Value loss = select(p.keep, mul(neg(picked), p.weight), broadcast_like(scalar_like(0, picked), picked));
  switch (reduction) {
    case 0: return loss;
    case 1: return div(sum(loss, {}, false), sum(p.weight, {}, false));  // all ignored: 0/0 = NaN, as on CPU
    case 2: return sum(loss, {}, false);
  }
  fail("nll_loss: reduction must be 0 (none), 1 (mean) or 2 (sum), not " + std::to_string(reduction));
}

Value Builder::nll_loss_total_weight(const Value& self, const Value& target, const std::optional<Value>& weight,
                                     int64_t reduction, int64_t ignore_index) {
  if (reduction == 0 && self.rank() >= 2) return scalar_like(0, self);  // CPU leaves it 0 for batched 'none'
  return sum(nll_parts(*this, self, target, weight, ignore_index).weight, {}, false);
}

Value Builder::nll_loss_backward(const Value& grad_output, const Value& self, const Value& target,
                                 const std::optional<Value>& weight, int64_t reduction, int64_t ignore_index,
                                 const Value& total_weight) {
  NllParts p = nll_parts(*this, self, target, weight, ignore_index);
  // CPU: weight[target] * -(grad_output / total_weight) (mean) or * -grad_output.
  Value g = reduction == 1 ? div(grad_output, total_weight) : grad_output;
  Value per_target = mul(p.weight, neg(g));
  per_target = select(p.keep, per_target, broadcast_like(scalar_like(0, per_target), per_target));
  Value classes = iota(TensorType{ElementType::S64, self.dims()}, p.class_dim);
  Value hit = eq(classes, along_classes(*this, p.target, self, p.class_dim));
  return select(hit, along_classes(*this, per_target, self, p.class_dim), full(0, self.type));
}

// Normalization primitives (layer norm, group norm)

namespace {

// The dims layer norm normalizes over: the trailing normalized_shape.size() dims of v.
std::vector<int64_t> norm_dims(const Value& v, const std::vector<int64_t>& normalized_shape) {
  const int64_t count = static_cast<int64_t>(normalized_shape.size());
  if (count < 1 || count > v.rank()) fail("layer norm: normalized_shape does not fit the input's rank");
  std::vector<int64_t> dims;
  for (int64_t d = v.rank() - count; d < v.rank(); ++d) dims.push_back(d);
  return dims;
}

// v's dims with the normalized ones as 1s: the shape of layer norm's mean and rstd.
std::vector<int64_t> norm_stat_shape(const Value& v, const std::vector<int64_t>& normalized_shape) {
  std::vector<int64_t> shape = v.dims();
  for (int64_t d : norm_dims(v, normalized_shape)) shape[d] = 1;
  return shape;
}

// 1/sqrt(var + eps) of `centered` (v minus its mean) over dims, kept as 1s.
Value rstd_of(Builder& b, const Value& centered, const std::vector<int64_t>& dims, double eps) {
  Value var = b.mean(b.mul(centered, centered), dims, true);
  return b.rsqrt(b.add(var, b.scalar_like(eps, var)));
}

// Sum over dims, or v itself where there are none (Builder::sum reads empty dims as "all").
Value sum_over(Builder& b, const Value& v, const std::vector<int64_t>& dims) {
  return dims.empty() ? v : b.sum(v, dims, false);
}

// Group norm's view of [N, C, *] as [N, group, C/group, HxW].
Value grouped(Builder& b, const Value& v, int64_t N, int64_t C, int64_t HxW, int64_t group) {
  if (group <= 0 || C % group != 0) fail("group norm: C must be divisible by group");
  return b.reshape(v, {N, group, C / group, HxW});
}

// grad_input of a normalization whose x_hat = (x - mean) * rstd over dims: rstd * (g - mean(g) -
// x_hat * mean(g * x_hat)), g = the gradient of x_hat.
Value norm_grad_input(Builder& b, const Value& g, const Value& x_hat, const Value& rstd,
                      const std::vector<int64_t>& dims) {
  Value mean_g = b.mean(g, dims, true);
  Value mean_gx = b.mean(b.mul(g, x_hat), dims, true);
  return b.mul(rstd, b.sub(b.sub(g, mean_g), b.mul(x_hat, mean_gx)));
}

}  // namespace

Value Builder::layer_norm(const Value& input, const std::vector<int64_t>& normalized_shape,
                          const std::optional<Value>& weight, const std::optional<Value>& bias, double eps) {
  const auto dims = norm_dims(input, normalized_shape);
  Value centered = sub(input, mean(input, dims, true));
  Value out = mul(centered, rstd_of(*this, centered, dims, eps));
  if (weight) out = mul(out, *weight);
  if (bias) out = add(out, *bias);
  return out;
}

Value Builder::layer_norm_mean(const Value& input, const std::vector<int64_t>& normalized_shape) {
  return mean(input, norm_dims(input, normalized_shape), true);
}

Value Builder::layer_norm_rstd(const Value& input, const std::vector<int64_t>& normalized_shape, double eps) {
  const auto dims = norm_dims(input, normalized_shape);
  return rstd_of(*this, sub(input, mean(input, dims, true)), dims, eps);
}

namespace {

// (x - mean) * rstd with the saved mean/rstd viewed in the stat shape.
Value layer_norm_x_hat(Builder& b, const Value& input, const std::vector<int64_t>& normalized_shape,
                       const Value& mean, const Value& rstd) {
  const auto stat = norm_stat_shape(input, normalized_shape);
  return b.mul(b.sub(input, b.reshape(mean, stat)), b.reshape(rstd, stat));
}

}  // namespace

Value Builder::layer_norm_grad_input(const Value& grad_out, const Value& input,
                                     const std::vector<int64_t>& normalized_shape, const Value& mean,
                                     const Value& rstd, const std::optional<Value>& weight) {
  Value x_hat = layer_norm_x_hat(*this, input, normalized_shape, mean, rstd);
  Value g = weight ? mul(grad_out, *weight) : grad_out;
  return norm_grad_input(*this, g, x_hat, reshape(rstd, norm_stat_shape(input, normalized_shape)),
                         norm_dims(input, normalized_shape));
}

Value Builder::layer_norm_grad_weight(const Value& grad_out, const Value& input,
                                      const std::vector<int64_t>& normalized_shape, const Value& mean,
                                      const Value& rstd) {
  Value x_hat = layer_norm_x_hat(*this, input, normalized_shape, mean, rstd);
  std::vector<int64_t> leading;
  for (int64_t d = 0; d < norm_dims(input, normalized_shape).front(); ++d) leading.push_back(d);
  return sum_over(*this, mul(grad_out, x_hat), leading);
}

Value Builder::layer_norm_grad_bias(const Value& grad_out, const std::vector<int64_t>& normalized_shape) {
  std::vector<int64_t> leading;
  for (int64_t d = 0; d < norm_dims(grad_out, normalized_shape).front(); ++d) leading.push_back(d);
  return sum_over(*this, grad_out, leading);
}

Value Builder::group_norm(const Value& input, const std::optional<Value>& weight, const std::optional<Value>& bias,
                          int64_t N, int64_t C, int64_t HxW, int64_t group, double eps) {
  Value x = grouped(*this, input, N, C, HxW, group);
  Value centered = sub(x, mean(x, {2, 3}, true));
  Value out = reshape(mul(centered, rstd_of(*this, centered, {2, 3}, eps)), {N, C, HxW});
  if (weight) out = mul(out, reshape(*weight, {1, C, 1}));
  if (bias) out = add(out, reshape(*bias, {1, C, 1}));
  return reshape(out, input.dims());
}

Value Builder::group_norm_mean(const Value& input, int64_t N, int64_t C, int64_t HxW, int64_t group) {
  return mean(grouped(*this, input, N, C, HxW, group), {2, 3}, false);
}

Value Builder::group_norm_rstd(const Value& input, int64_t N, int64_t C, int64_t HxW, int64_t group, double eps) {
  Value x = grouped(*this, input, N, C, HxW, group);
  return reshape(rstd_of(*this, sub(x, mean(x, {2, 3}, true)), {2, 3}, eps), {N, group});
}

namespace {

Value group_norm_x_hat(Builder& b, const Value& input, const Value& mean, const Value& rstd, int64_t N, int64_t C,
                       int64_t HxW, int64_t group) {
  Value x = grouped(b, input, N, C, HxW, group);
  return b.mul(b.sub(x, b.reshape(mean, {N, group, 1, 1})), b.reshape(rstd, {N, group, 1, 1}));
}

}  // namespace

Value Builder::group_norm_grad_input(const Value& grad_out, const Value& input, const Value& mean, const Value& rstd,
                                     const std::optional<Value>& weight, int64_t N, int64_t C, int64_t HxW,
                                     int64_t group) {
  Value x_hat = group_norm_x_hat(*this, input, mean, rstd, N, C, HxW, group);
  Value g = grouped(*this, grad_out, N, C, HxW, group);
  if (weight) g = mul(g, reshape(*weight, {1, group, C / group, 1}));
  Value dx = norm_grad_input(*this, g, x_hat, reshape(rstd, {N, group, 1, 1}), {2, 3});
  return reshape(dx, input.dims());
}

Value Builder::group_norm_grad_weight(const Value& grad_out, const Value& input, const Value& mean, const Value& rstd,
                                      int64_t N, int64_t C, int64_t HxW, int64_t group) {
  Value x_hat = group_norm_x_hat(*this, input, mean, rstd, N, C, HxW, group);
  Value g = grouped(*this, grad_out, N, C, HxW, group);
  return reshape(sum(mul(g, x_hat), {0, 3}, false), {C});
}

Value Builder::group_norm_grad_bias(const Value& grad_out, int64_t N, int64_t C, int64_t HxW) {
  return sum(reshape(grad_out, {N, C, HxW}), {0, 2}, false);
}

// --- convolution primitives (specs/conv.yaml) ---

namespace {

// Where each label of one word of convolution()'s `dims` ("bf01") sits: label -> dim.
std::vector<int> conv_positions(const std::string& word, const char* letters, int rank, const std::string& dims) {
  if (static_cast<int>(word.size()) != rank) {
    fail("convolution dims " + dims + ": '" + word + "' labels " + std::to_string(word.size()) + " dims of a rank-" +
         std::to_string(rank) + " value");
  }
  const int spatial = rank - 2;
  std::vector<int> at(2 + spatial, -1);  // letters[0], letters[1], then spatial 0..n-1
  for (int d = 0; d < rank; ++d) {
    const char c = word[d];
    int slot = -1;
    if (c == letters[0]) slot = 0;
    else if (c == letters[1]) slot = 1;
    else if (c >= '0' && c < '0' + spatial) slot = 2 + (c - '0');
    if (slot < 0 || at[slot] >= 0) fail("convolution dims " + dims + ": bad or repeated label in '" + word + "'");
    at[slot] = d;
  }
  return at;
}

std::string conv_word(const std::string& word) {
  std::string s = "[";
  for (size_t i = 0; i < word.size(); ++i) s += (i ? ", " : "") + std::string(1, word[i]);
  return s + "]";
}

// A dim of `size` with (size - 1) holes of (dilation - 1) between elements, as XLA counts it.
int64_t dilated(int64_t size, int64_t dilation) { return size == 0 ? 0 : (size - 1) * dilation + 1; }

// An int[] attribute for n spatial dims (PyTorch allows one value for all).
std::vector<int64_t> per_dim(const std::vector<int64_t>& values, int n, const char* what) {
  if (static_cast<int>(values.size()) == n) return values;
  if (values.size() == 1) return std::vector<int64_t>(n, values[0]);
  fail(std::string("convolution: ") + what + " has " + std::to_string(values.size()) + " values for " +
       std::to_string(n) + " spatial dims");
}

std::string spatial_labels(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += static_cast<char>('0' + i);
  return s;
}

// y = conv(x, w): x [N, C_in, *S], w [C_out, C_in/groups, *K], padding (low, high) per spatial dim.
Value regular_conv(Builder& b, const Value& x, const Value& w, const std::vector<int64_t>& stride,
                   const std::vector<int64_t>& low, const std::vector<int64_t>& high,
                   const std::vector<int64_t>& dilation, int64_t groups) {
  const int n = x.rank() - 2;
  const std::string sp = spatial_labels(n);
  std::vector<int64_t> padding;
  for (int i = 0; i < n; ++i) {
    padding.push_back(low[i]);
    padding.push_back(high[i]);
  }
  return b.convolution(x, w, "bf" + sp + " oi" + sp + " bf" + sp, stride, padding, std::vector<int64_t>(n, 1),
                       dilation, groups, 1);
}

// The gradient of regular_conv(x, w) with respect to x (of spatial sizes `x_sizes`) given gy:
// gy dilated by the stride, convolved with w flipped and its channel dims swapped within each group.
Value regular_grad_input(Builder& b, const Value& gy, const Value& w, const std::vector<int64_t>& x_sizes,
                         const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                         const std::vector<int64_t>& dilation, int64_t groups) {
  const int n = gy.rank() - 2;
  const int64_t c_out = w.dims()[0], c_in_g = w.dims()[1];
  std::vector<int64_t> grouped{groups, c_out / groups, c_in_g}, spatial_dims, perm{0, 2, 1}, swapped{groups * c_in_g, c_out / groups};
  for (int i = 0; i < n; ++i) {
    grouped.push_back(w.dims()[2 + i]);
    swapped.push_back(w.dims()[2 + i]);
    perm.push_back(3 + i);
    spatial_dims.push_back(2 + i);
  }
  const Value w_t = b.reverse(b.reshape(b.transpose(b.reshape(w, grouped), perm), swapped), spatial_dims);
  const std::string sp = spatial_labels(n);
  std::vector<int64_t> pads;
  for (int i = 0; i < n; ++i) {
    const int64_t window = dilation[i] * (w.dims()[2 + i] - 1);
    const int64_t low = window - padding[i];
    pads.push_back(low);
    pads.push_back(x_sizes[i] + window - low - dilated(gy.dims()[2 + i], stride[i]));
  }
  return b.convolution(gy, w_t, "bf" + sp + " oi" + sp + " bf" + sp, std::vector<int64_t>(n, 1), pads, stride,
                       dilation, groups, 1);
}

// The gradient of regular_conv(x, w) with respect to w (of spatial sizes `k_sizes`) given gy: x's batch
// dim contracted with gy's, each group of x's channels (batch_group_count) against its group of gy's.
Value regular_grad_weight(Builder& b, const Value& x, const Value& gy, const std::vector<int64_t>& k_sizes,
                          const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                          const std::vector<int64_t>& dilation, int64_t groups) {
  const int n = x.rank() - 2;
  const std::string sp = spatial_labels(n);
  std::vector<int64_t> pads;
  for (int i = 0; i < n; ++i) {
    pads.push_back(padding[i]);
    pads.push_back(dilation[i] * (k_sizes[i] - 1) + dilated(gy.dims()[2 + i], stride[i]) - x.dims()[2 + i] -
                   padding[i]);
  }
  return b.convolution(x, gy, "fb" + sp + " io" + sp + " fb" + sp, dilation, pads, std::vector<int64_t>(n, 1),
                       stride, 1, groups);
}

std::vector<int64_t> spatial_sizes(const Value& v) { return std::vector<int64_t>(v.dims().begin() + 2, v.dims().end()); }

}  // namespace

Value Builder::convolution(const Value& lhs, const Value& rhs, const std::string& dims,
                           const std::vector<int64_t>& window_strides, const std::vector<int64_t>& padding,
                           const std::vector<int64_t>& lhs_dilation, const std::vector<int64_t>& rhs_dilation,
                           int64_t feature_group_count, int64_t batch_group_count) {
  std::vector<std::string> words;
  for (size_t start = 0; start <= dims.size();) {
    const size_t end = std::min(dims.find(' ', start), dims.size());
    words.push_back(dims.substr(start, end - start));
    start = end + 1;
  }
  if (words.size() != 3) fail("convolution dims " + dims + ": need three words (lhs rhs result)");
  const int rank = lhs.rank(), n = rank - 2;
  if (rank < 3 || rhs.rank() != rank) fail("convolution of ranks " + std::to_string(lhs.rank()) + " and " + std::to_string(rhs.rank()));
  if (static_cast<int>(window_strides.size()) != n || static_cast<int>(padding.size()) != 2 * n ||
      static_cast<int>(lhs_dilation.size()) != n || static_cast<int>(rhs_dilation.size()) != n) {
    fail("convolution: window attributes do not match " + std::to_string(n) + " spatial dims");
  }
  const auto l = conv_positions(words[0], "bf", rank, dims);
  const auto r = conv_positions(words[1], "io", rank, dims);
  const auto o = conv_positions(words[2], "bf", rank, dims);
  std::vector<int64_t> out(rank);
  out[o[0]] = lhs.dims()[l[0]] / batch_group_count;
  out[o[1]] = rhs.dims()[r[1]];
  std::string pads;
  for (int i = 0; i < n; ++i) {
    const int64_t padded = dilated(lhs.dims()[l[2 + i]], lhs_dilation[i]) + padding[2 * i] + padding[2 * i + 1];
    const int64_t window = dilated(rhs.dims()[r[2 + i]], rhs_dilation[i]);
    out[o[2 + i]] = padded < window ? 0 : (padded - window) / window_strides[i] + 1;
    pads += (i ? ", [" : "[") + std::to_string(padding[2 * i]) + ", " + std::to_string(padding[2 * i + 1]) + "]";
  }
  TensorType t{lhs.element(), out};
  return emit("\"stablehlo.convolution\"(" + name(lhs) + ", " + name(rhs) + ") {window_strides = " +
                  i64_array(window_strides) + ", padding = dense<[" + pads + "]> : tensor<" + std::to_string(n) +
                  "x2xi64>, lhs_dilation = " + i64_array(lhs_dilation) + ", rhs_dilation = " +
                  i64_array(rhs_dilation) + ", dimension_numbers = #stablehlo.conv<" + conv_word(words[0]) + "x" +
                  conv_word(words[1]) + "->" + conv_word(words[2]) + ">, feature_group_count = " +
                  std::to_string(feature_group_count) + " : i64, batch_group_count = " +
                  std::to_string(batch_group_count) + " : i64} : (" + lhs.type.mlir() + ", " + rhs.type.mlir() +
                  ") -> " + t.mlir(),
              t);
}

Value Builder::reverse(const Value& v, const std::vector<int64_t>& dims) {
  if (dims.empty()) return v;
  return emit("\"stablehlo.reverse\"(" + name(v) + ") {dimensions = " + i64_array(normalize_dims(dims, v.rank())) +
                  "} : (" + v.type.mlir() + ") -> " + v.type.mlir(),
              v.type);
}

Value Builder::sum_except(const Value& v, int64_t dim) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < v.rank(); ++d) {
    if (d != dim) dims.push_back(d);
  }
  return dims.empty() ? v : reduce(v, dims, "add", 0);
}

Value Builder::conv(const Value& input, const Value& weight, const std::optional<Value>& bias,
                    const std::vector<int64_t>& stride_in, const std::vector<int64_t>& padding_in,
                    const std::vector<int64_t>& dilation_in, bool transposed,
                    const std::vector<int64_t>& output_padding_in, int64_t groups) {
  const int n = input.rank() - 2;
  const auto stride = per_dim(stride_in, n, "stride"), padding = per_dim(padding_in, n, "padding");
  const auto dilation = per_dim(dilation_in, n, "dilation");
  Value out;
  if (!transposed) {
    out = regular_conv(*this, input, weight, stride, padding, padding, dilation, groups);
  } else {
    // The transposed conv is the input gradient of the regular conv whose weight it holds.
    const auto output_padding = per_dim(output_padding_in, n, "output_padding");
    std::vector<int64_t> sizes;
    for (int i = 0; i < n; ++i) {
      sizes.push_back((input.dims()[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (weight.dims()[2 + i] - 1) +
                      output_padding[i] + 1);
    }
    out = regular_grad_input(*this, input, weight, sizes, stride, padding, dilation, groups);
  }
  if (!bias) return out;
  std::vector<int64_t> shape(out.rank(), 1);
  shape[1] = out.dims()[1];
  return add(out, reshape(*bias, shape));
}

Value Builder::conv_grad_input(const Value& grad_output, const Value& input, const Value& weight,
                               const std::vector<int64_t>& stride_in, const std::vector<int64_t>& padding_in,
                               const std::vector<int64_t>& dilation_in, bool transposed, int64_t groups) {
  const int n = input.rank() - 2;
  const auto stride = per_dim(stride_in, n, "stride"), padding = per_dim(padding_in, n, "padding");
  const auto dilation = per_dim(dilation_in, n, "dilation");
  if (!transposed) {
    return regular_grad_input(*this, grad_output, weight, spatial_sizes(input), stride, padding, dilation, groups);
  }
  // A regular conv of grad_output, its high padding cut to give exactly input's sizes (output_padding).
  std::vector<int64_t> high;
  for (int i = 0; i < n; ++i) {
    high.push_back((input.dims()[2 + i] - 1) * stride[i] + dilated(weight.dims()[2 + i], dilation[i]) -
                   grad_output.dims()[2 + i] - padding[i]);
  }
  return regular_conv(*this, grad_output, weight, stride, padding, high, dilation, groups);
}

Value Builder::conv_grad_weight(const Value& grad_output, const Value& input, const Value& weight,
                                const std::vector<int64_t>& stride_in, const std::vector<int64_t>& padding_in,
                                const std::vector<int64_t>& dilation_in, bool transposed, int64_t groups) {
  const int n = input.rank() - 2;
  const auto stride = per_dim(stride_in, n, "stride"), padding = per_dim(padding_in, n, "padding");
  const auto dilation = per_dim(dilation_in, n, "dilation");
  // A transposed conv's weight gradient is the regular one with input and grad_output in swapped roles.
  const Value& x = transposed ? grad_output : input;
  const Value& gy = transposed ? input : grad_output;
  return regular_grad_weight(*this, x, gy, spatial_sizes(weight), stride, padding, dilation, groups);
}

// ---------------------------------------------------------------------------------------------
// advanced indexing primitives (index / index_put, nonzero, masked_select, isin, embedding_bag)

namespace {

// numpy broadcasting of several shapes.
std::vector<int64_t> broadcast_dims(const std::vector<std::vector<int64_t>>& shapes, const char* op) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  std::vector<int64_t> out(rank, 1);
  for (const auto& s : shapes) {
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[rank - s.size() + i];
      const int64_t d = s[i];
      if (d == o || d == 1) continue;
      if (o != 1) fail(std::string(op) + ": shape mismatch: indexing tensors could not be broadcast together");
      o = d;
    }
  }
  return out;
}

// Where an advanced index reads: the indexed dims of v, the index tensors' broadcast shape, the
// coordinates [batch..., k] (int64, negatives wrapped) and the result's layout.
struct AdvancedIndex {
  std::vector<int64_t> dims, batch, out_dims, offset_dims, slice_sizes;
  Value coords;
};

AdvancedIndex advanced_index(Builder& b, const Value& v, const std::vector<Value>& indices) {
  AdvancedIndex ai;
  if (static_cast<int>(indices.size()) > v.rank()) fail("index: too many indices for tensor of dimension " + std::to_string(v.rank()));
  std::vector<std::vector<int64_t>> shapes;
  for (size_t d = 0; d < indices.size(); ++d) {
    if (indices[d].id < 0) continue;
    if (is_float(indices[d].element()) || indices[d].element() == ElementType::Pred) fail("index: tensors used as indices must be long, int, byte or bool tensors");
    ai.dims.push_back(static_cast<int64_t>(d));
    shapes.push_back(indices[d].dims());
  }
  if (ai.dims.empty()) fail("index: no index tensors");
  ai.batch = broadcast_dims(shapes, "index");
  const int64_t nb = static_cast<int64_t>(ai.batch.size());
  const bool adjacent = ai.dims.back() - ai.dims.front() + 1 == static_cast<int64_t>(ai.dims.size());
  std::vector<int64_t> rest_before, rest_after;
  ai.slice_sizes = v.dims();
  for (int64_t d : ai.dims) ai.slice_sizes[d] = 1;
  for (int d = 0; d < v.rank(); ++d) {
    if (std::find(ai.dims.begin(), ai.dims.end(), d) != ai.dims.end()) continue;
    (adjacent && d < ai.dims.front() ? rest_before : rest_after).push_back(v.dims()[d]);
  }
  ai.out_dims = rest_before;
  ai.out_dims.insert(ai.out_dims.end(), ai.batch.begin(), ai.batch.end());
  ai.out_dims.insert(ai.out_dims.end(), rest_after.begin(), rest_after.end());
  for (int64_t i = 0; i < static_cast<int64_t>(rest_before.size()); ++i) ai.offset_dims.push_back(i);
  for (int64_t i = 0; i < static_cast<int64_t>(rest_after.size()); ++i) {
    ai.offset_dims.push_back(static_cast<int64_t>(rest_before.size()) + nb + i);
  }
  std::vector<int64_t> one = ai.batch;
  one.push_back(1);
  std::vector<Value> parts;
  for (int64_t d : ai.dims) {
    Value idx = b.broadcast_to(b.convert(indices[d], ElementType::S64), ai.batch);
    Value size = b.constant_int(v.dims()[d], ElementType::S64);
    idx = b.select(b.lt(idx, b.scalar_like(0, idx)), b.add(idx, b.broadcast_like(size, idx)), idx);
    parts.push_back(b.reshape(idx, one));
  }
  ai.coords = parts.size() == 1 ? parts[0] : b.concatenate(parts, nb);
  return ai;
}

}  // namespace

Value Builder::index_tensor(const Value& v, const std::vector<Value>& indices) {
  AdvancedIndex ai = advanced_index(*this, v, indices);
  TensorType t{v.element(), ai.out_dims};
  if (t.numel() == 0) return full(0, t);
  return emit("\"stablehlo.gather\"(" + name(v) + ", " + name(ai.coords) + ") {dimension_numbers = #stablehlo.gather<" +
                  dims_field("offset_dims", ai.offset_dims) + "collapsed_slice_dims = " + list(ai.dims) +
                  ", start_index_map = " + list(ai.dims) + ", index_vector_dim = " + std::to_string(ai.batch.size()) +
                  ">, slice_sizes = " + i64_array(ai.slice_sizes) + ", indices_are_sorted = false} : (" +
                  v.type.mlir() + ", " + ai.coords.type.mlir() + ") -> " + t.mlir(),
              t);
}

Value Builder::index_put(const Value& v, const std::vector<Value>& indices, const Value& values, bool accumulate) {
  AdvancedIndex ai = advanced_index(*this, v, indices);
  if (TensorType{v.element(), ai.out_dims}.numel() == 0 || v.type.numel() == 0) return v;
  Value updates = broadcast_to(convert(values, v.element()), ai.out_dims);
  const TensorType s{v.element(), {}};
  const std::string st = s.mlir(), r = "%r" + std::to_string(next_id_);
  const std::string a = r + "a", n = r + "b";
  std::string body, result = n;
  if (accumulate) {
    body = "      " + r + "c = stablehlo." + (v.element() == ElementType::Pred ? "or" : "add") + " " + a + ", " + n +
           " : " + st + "\n";
    result = r + "c";
  }
  return emit("\"stablehlo.scatter\"(" + name(v) + ", " + name(ai.coords) + ", " + name(updates) + ") ({\n    ^bb0(" + a +
                  ": " + st + ", " + n + ": " + st + "):\n" + body + "      stablehlo.return " + result + " : " + st +
                  "\n    }) {scatter_dimension_numbers = #stablehlo.scatter<" +
                  dims_field("update_window_dims", ai.offset_dims) + "inserted_window_dims = " + list(ai.dims) +
                  ", scatter_dims_to_operand_dims = " + list(ai.dims) + ", index_vector_dim = " +
                  std::to_string(ai.batch.size()) + ">, indices_are_sorted = false, unique_indices = false} : (" +
                  v.type.mlir() + ", " + ai.coords.type.mlir() + ", " + updates.type.mlir() + ") -> " + v.type.mlir(),
              v.type);
}

namespace {

// For each element of the flat mask m [N]: the row it lands in (its rank among the set elements),
// or N (out of range: dropped by a scatter) where it is not set.
Value packed_rows(Builder& b, const Value& m) {
  const int64_t n = m.type.numel();
  Value pos = b.sub(b.cumsum(b.convert(m, ElementType::S64), 0), b.constant_int(1, ElementType::S64));
  return b.select(m, pos, b.broadcast_like(b.constant_int(n, ElementType::S64), pos));
}

Value is_set(Builder& b, const Value& v) {
  return v.element() == ElementType::Pred ? v : b.ne(v, b.scalar_like(0, v));
}

}  // namespace

Value Builder::nonzero_padded(const Value& v) {
  const int64_t n = v.type.numel(), r = v.rank();
  TensorType t{ElementType::S64, {n, r}};
  if (n == 0 || r == 0) return full(0, t);
  Value m = reshape(is_set(*this, v), {n});
  std::vector<Value> cols;
  for (int d = 0; d < r; ++d) cols.push_back(reshape(iota(TensorType{ElementType::S64, v.dims()}, d), {n, 1}));
  Value coords = r == 1 ? cols[0] : concatenate(cols, 1);
  return index_put(full(0, t), {packed_rows(*this, m)}, coords, false);
}

Value Builder::masked_select_padded(const Value& v, const Value& mask) {
  const std::vector<int64_t> dims = broadcast_dims({v.dims(), mask.dims()}, "masked_select");
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  TensorType t{v.element(), {n}};
  if (n == 0) return full(0, t);
  Value m = reshape(broadcast_to(is_set(*this, mask), dims), {n});
  return index_put(full(0, t), {packed_rows(*this, m)}, reshape(broadcast_to(v, dims), {n}), false);
}

Value Builder::nonzero_count(const Value& v, const Value& like) {
  const std::vector<int64_t> dims = broadcast_dims({v.dims(), like.dims()}, "nonzero");
  Value m = convert(broadcast_to(is_set(*this, v), dims), ElementType::S64);
  return reduce(m, iota_list(static_cast<int64_t>(dims.size())), "add", 0);
}

Value Builder::isin(const Value& elements, const Value& test_elements, bool invert) {
  TensorType t{ElementType::Pred, elements.dims()};
  const int64_t m = test_elements.type.numel();
  if (m == 0 || t.numel() == 0) return full(invert ? 1 : 0, t);
  std::vector<int64_t> e_dims = elements.dims();
  e_dims.push_back(1);
  Value hit = eq(reshape(elements, e_dims), reshape(test_elements, {m}));
  Value found = reduce(hit, {static_cast<int64_t>(elements.rank())}, "or", 0);
  return invert ? bitwise_not(found) : found;
}

namespace {

// Each index's bag: how many bag starts (offsets[:B]) lie at or before it, minus one; int64 [N].
Value bag_of(Builder& b, const Value& indices, const Value& offsets, bool include_last_offset) {
  const int64_t n = indices.type.numel();
  const int64_t bags = offsets.type.numel() - (include_last_offset ? 1 : 0);
  if (bags <= 0) return b.full(0, TensorType{ElementType::S64, {n}});
  Value starts = b.convert(b.slice(b.reshape(offsets, {offsets.type.numel()}), {0}, {bags}, {1}), ElementType::S64);
  Value pos = b.iota(TensorType{ElementType::S64, {n, bags}}, 0);
  Value started = b.convert(b.ge(pos, b.broadcast_in_dim(starts, {n, bags}, {1})), ElementType::S64);
  return b.sub(b.reduce(started, {1}, "add", 0), b.constant_int(1, ElementType::S64));
}

Value not_padding(Builder& b, const Value& idx, int64_t padding_idx) {
  return b.ne(idx, b.broadcast_like(b.constant_int(padding_idx, ElementType::S64), idx));
}

int64_t bag_count(const Value& offsets, bool include_last_offset) {
  return std::max<int64_t>(offsets.type.numel() - (include_last_offset ? 1 : 0), 0);
}

}  // namespace

Value Builder::embedding_bag_offset2bag(const Value& indices, const Value& offsets, bool include_last_offset) {
  return bag_of(*this, indices, offsets, include_last_offset);
}

Value Builder::embedding_bag_size(const Value& indices, const Value& offsets, bool include_last_offset,
                                  int64_t padding_idx) {
  const int64_t n = indices.type.numel(), slots = offsets.type.numel();
  TensorType t{ElementType::S64, {slots}};
  if (n == 0 || bag_count(offsets, include_last_offset) == 0) return full(0, t);
  Value idx = reshape(convert(indices, ElementType::S64), {n});
  Value ones = convert(not_padding(*this, idx, padding_idx), ElementType::S64);
  return scatter_along(full(0, t), 0, bag_of(*this, indices, offsets, include_last_offset), ones, "add");
}

Value Builder::embedding_bag(const Value& weight, const Value& indices, const Value& offsets, int64_t mode,
                             const std::optional<Value>& per_sample_weights, bool include_last_offset,
                             int64_t padding_idx) {
  const int64_t n = indices.type.numel(), bags = bag_count(offsets, include_last_offset);
  const int64_t width = weight.dims().at(1);
  TensorType t{weight.element(), {bags, width}};
  if (n == 0 || t.numel() == 0) return full(0, t);
  Value idx = reshape(convert(indices, ElementType::S64), {n});
  Value bag = bag_of(*this, indices, offsets, include_last_offset);
  Value keep = broadcast_in_dim(not_padding(*this, idx, padding_idx), {n, width}, {0});
  Value rows = index_select(weight, 0, idx);
  Value bag2 = broadcast_in_dim(bag, {n, width}, {0});
  if (mode == 2) {  // max; bags with no (non-padding) index stay 0
    Value low = broadcast_like(extreme_constant(*this, weight.element(), true), rows);
    Value best = scatter_along(broadcast_to(extreme_constant(*this, weight.element(), true), t.dims), 0, bag2,
                               select(keep, rows, low), "amax");
    Value size = embedding_bag_size(indices, offsets, include_last_offset, padding_idx);
    Value empty = eq(slice(size, {0}, {bags}, {1}), constant_int(0, ElementType::S64));
    return select(broadcast_in_dim(empty, t.dims, {0}), full(0, t), best);
  }
  if (per_sample_weights) rows = mul(rows, broadcast_in_dim(convert(*per_sample_weights, rows.element()), {n, width}, {0}));
  rows = select(keep, rows, broadcast_like(scalar_like(0, rows), rows));
  Value total = scatter_along(full(0, t), 0, bag2, rows, "add");
  if (mode != 1) return total;
  Value size = convert(slice(embedding_bag_size(indices, offsets, include_last_offset, padding_idx), {0}, {bags}, {1}),
                       weight.element());
  size = maximum(size, scalar_like(1, size));
  return div(total, broadcast_in_dim(size, t.dims, {0}));
}

Value Builder::embedding_bag_max_indices(const Value& weight, const Value& indices, const Value& offsets, int64_t mode,
                                         bool include_last_offset, int64_t padding_idx) {
  if (mode != 2) return full(0, TensorType{ElementType::S64, {0}});
  const int64_t n = indices.type.numel(), bags = bag_count(offsets, include_last_offset);
  const int64_t width = weight.dims().at(1);
  TensorType t{ElementType::S64, {bags, width}};
  if (n == 0 || t.numel() == 0) return full(-1, t);
  Value best = embedding_bag(weight, indices, offsets, 2, std::nullopt, include_last_offset, padding_idx);
  Value idx = reshape(convert(indices, ElementType::S64), {n});
  Value bag2 = broadcast_in_dim(bag_of(*this, indices, offsets, include_last_offset), {n, width}, {0});
  Value rows = index_select(weight, 0, idx);
  Value keep = broadcast_in_dim(not_padding(*this, idx, padding_idx), {n, width}, {0});
  // The first position in the bag whose row holds the max, then the index at that position.
  Value hit = bitwise_and(keep, eq(rows, take_along(best, 0, bag2)));
  Value pos = iota(TensorType{ElementType::S64, {n, width}}, 0);
  Value none = broadcast_like(constant_int(n, ElementType::S64), pos);
  Value first = scatter_along(full(n, t), 0, bag2, select(hit, pos, none), "amin");
  Value picked = take_along(broadcast_in_dim(idx, {n, width}, {0}), 0, minimum(first, full(n - 1, t)));
  return select(eq(first, full(n, t)), full(-1, t), picked);
}

Value Builder::embedding_bag_dense_backward(const Value& grad, const Value& indices, const Value& offset2bag,
                                            const Value& bag_size, const Value& max_indices, int64_t num_weights,
                                            bool scale_grad_by_freq, int64_t mode,
                                            const std::optional<Value>& per_sample_weights, int64_t padding_idx) {
  const int64_t width = grad.dims().at(1), n = indices.type.numel();
  TensorType t{grad.element(), {num_weights, width}};
  if (t.numel() == 0) return full(0, t);
  if (mode == 2) {  // each bag's max row gets the bag's grad; empty bags (-1) give nothing
    const int64_t bags = grad.dims().at(0);
    if (bags == 0) return full(0, t);
    Value mi = convert(max_indices, ElementType::S64);
    Value keep = bitwise_and(ge(mi, scalar_like(0, mi)), not_padding(*this, mi, padding_idx));
    Value rows = select(keep, grad, broadcast_like(scalar_like(0, grad), grad));
    Value target = select(keep, mi, broadcast_like(constant_int(0, ElementType::S64), mi));
    return scatter_along(full(0, t), 0, target, rows, "add");
  }
  if (n == 0) return full(0, t);
  Value idx = reshape(convert(indices, ElementType::S64), {n});
  Value bag = reshape(convert(offset2bag, ElementType::S64), {n});
  Value rows = index_select(grad, 0, bag);
  if (mode == 1) {
    Value size = convert(take_along(reshape(bag_size, {bag_size.type.numel()}), 0, bag), grad.element());
    rows = div(rows, broadcast_in_dim(maximum(size, scalar_like(1, size)), {n, width}, {0}));
  }
  if (per_sample_weights) rows = mul(rows, broadcast_in_dim(convert(*per_sample_weights, grad.element()), {n, width}, {0}));
  return embedding_backward(rows, idx, num_weights, padding_idx, scale_grad_by_freq);
}

Value Builder::embedding_bag_backward(const Value& grad, const Value& indices, const Value& offset2bag,
                                      const Value& bag_size, const Value& max_indices, int64_t num_weights,
                                      bool scale_grad_by_freq, int64_t mode, bool sparse,
                                      const std::optional<Value>& per_sample_weights, int64_t padding_idx) {
  if (sparse) fail("embedding_bag: sparse gradients are not supported on tpu");
  return embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, max_indices, num_weights, scale_grad_by_freq,
                                      mode, per_sample_weights, padding_idx);
}

Value Builder::masked_scatter(const Value& v, const Value& mask, const Value& source) {
  const std::vector<int64_t> dims = broadcast_dims({v.dims(), mask.dims()}, "masked_scatter");
  Value base = broadcast_to(v, dims);
  const int64_t n = base.type.numel(), m = source.type.numel();
  if (n == 0 || m == 0) return base;  // nothing set can take a value (CPU checks source is large enough)
  Value set = reshape(broadcast_to(is_set(*this, mask), dims), {n});
  Value pos = sub(cumsum(convert(set, ElementType::S64), 0), constant_int(1, ElementType::S64));
  pos = minimum(pos, broadcast_like(constant_int(m - 1, ElementType::S64), pos));
  Value picked = take_along(reshape(convert(source, v.element()), {m}), 0, pos);
  return reshape(select(set, picked, reshape(base, {n})), dims);
}

Value Builder::embedding_bag_psw_backward(const Value& grad, const Value& weight, const Value& indices,
                                          const Value& offset2bag, int64_t padding_idx) {
  const int64_t n = indices.type.numel();
  TensorType t{grad.element(), {n}};
  if (n == 0) return full(0, t);
  Value idx = reshape(convert(indices, ElementType::S64), {n});
  Value bag = reshape(convert(offset2bag, ElementType::S64), {n});
  Value dot = reduce(mul(index_select(grad, 0, bag), convert(index_select(weight, 0, idx), grad.element())), {1}, "add", 0);
  return select(not_padding(*this, idx, padding_idx), dot, full(0, t));
}

// ---------------------------------------------------------------------------------------------
// batch norm and dropout primitives

namespace {

// Elements per channel of v [N, C, *].
double per_channel_count(const Value& v) {
  if (v.rank() < 2) fail("batch norm: input needs a channel dim (rank >= 2)");
  return static_cast<double>(v.type.numel() / v.dims()[1]);
}

}  // namespace

Value Builder::channel_mean(const Value& v) {
  return div(sum_except(v, 1), scalar_like(per_channel_count(v), v));
}

Value Builder::channel_var(const Value& v, double correction) {
  Value centered = sub(v, per_channel(channel_mean(v), v));
  const double n = per_channel_count(v) - correction;
  return div(sum_except(mul(centered, centered), 1), scalar_like(n > 0 ? n : 0.0, v));
}

Value Builder::per_channel(const Value& c, const Value& like) {
  std::vector<int64_t> shape(like.rank(), 1);
  if (like.rank() < 2) fail("per_channel: the target needs a channel dim (rank >= 2)");
  shape[1] = c.type.numel();
  return broadcast_to(reshape(c, shape), like.dims());
}

Value Builder::dropout(const Value& state, const Value& input, double p) {
  if (p >= 1) return full(0, input.type);
  return mul(convert(dropout_mask(state, input, p), input.element()), scalar_like(1.0 / (1.0 - p), input));
}

Value Builder::dropout_mask(const Value& state, const Value& input, double p) {
  Value u = uniform01(state, input.dims(), ElementType::F32);
  return ge(u, constant(p, ElementType::F32));
}

Value Builder::multinomial(const Value& state, const Value& probs, int64_t num_samples, bool replacement) {
  if (probs.rank() < 1 || probs.rank() > 2) fail("multinomial: probs must be 1-D or 2-D");
  const int64_t n = probs.dims().back();
  const int64_t rows = probs.rank() == 2 ? probs.dims()[0] : 1;
  const ElementType e = probs.element() == ElementType::F64 ? ElementType::F64 : ElementType::F32;
  Value log_p = log(convert(reshape(probs, {rows, n}), e));  // zero weights: -inf, never drawn
  Value indices;
  if (replacement) {
    Value u = uniform01(state, {rows, num_samples, n}, e);
    Value gumbel = neg(log(neg(log(u))));
    Value keys = add(broadcast_to(reshape(log_p, {rows, 1, n}), {rows, num_samples, n}), gumbel);
    indices = argmax(keys, {2}, false);
  } else {
    Value u = uniform01(state, {rows, n}, e);
    indices = topk(add(log_p, neg(log(neg(log(u))))), num_samples, 1, true, true);
  }
  indices = convert(indices, ElementType::S64);
  return probs.rank() == 1 ? reshape(indices, {num_samples}) : indices;
}

Value Builder::random_integers(const Value& state, const Value& like, int64_t low, int64_t high) {
  if (high <= low) fail("random_: expects 'from' to be less than 'to'");
  Value u = uniform01(state, like.dims(), ElementType::F64);
  const double span = static_cast<double>(high - low);
  // floor(low + u * span), kept below high where rounding reaches it.
  Value drawn = convert(floor(mul(u, constant(span, ElementType::F64))), ElementType::S64);
  drawn = minimum(drawn, constant_int(high - low - 1, ElementType::S64));
  return convert(add(drawn, constant_int(low, ElementType::S64)), like.element());
}

Value Builder::random_permutation(const Value& state, int64_t n) {
  return convert(sort_along(uniform01(state, {n}, ElementType::F64), 0, false, true), ElementType::S64);
}

// ---------------------------------------------------------------------------------------------
// shape primitives (flip, roll, repeat, tril/triu, pads, sort/topk, creation)

namespace {

int64_t shape_dim(int64_t dim, int rank, const char* op) {
  const int64_t wrapped = dim < 0 ? dim + rank : dim;
  if (wrapped < 0 || wrapped >= rank) fail(std::string(op) + ": dimension out of range");
  return wrapped;
}

// [lo, hi) of v along dim.
Value slice_dim(Builder& b, const Value& v, int64_t dim, int64_t lo, int64_t hi) {
  std::vector<int64_t> start(v.rank(), 0), limit = v.dims(), strides(v.rank(), 1);
  start[dim] = lo;
  limit[dim] = hi;
  return b.slice(v, start, limit, strides);
}

// For each padded dim (the last first), the source position of every output position (int64 [out]):
// reflect or clamp (i - before) into [0, n).
Value pad_source(Builder& b, int64_t n, int64_t before, int64_t after, bool reflect) {
  const int64_t out = n + before + after;
  Value i = b.sub(b.iota(TensorType{ElementType::S64, {out}}, 0), b.constant_int(before, ElementType::S64));
  const Value last = b.constant_int(n - 1, ElementType::S64);
  if (reflect) return b.sub(last, b.unary("abs", b.sub(last, b.unary("abs", i))));
  return b.binary("minimum", b.binary("maximum", i, b.constant_int(0, ElementType::S64)), last);
}

Value pad_gather(Builder& b, const Value& v, const std::vector<int64_t>& padding, bool reflect) {
  if (padding.size() % 2 || static_cast<int>(padding.size() / 2) > v.rank()) fail("pad: bad padding length");
  Value x = v;
  for (size_t i = 0; i < padding.size() / 2; ++i) {
    const int64_t dim = v.rank() - 1 - static_cast<int64_t>(i);
    x = b.index_select(x, dim, pad_source(b, v.dims()[dim], padding[2 * i], padding[2 * i + 1], reflect));
  }
  return x;
}

// The transpose of pad_gather: grad's elements added back to their source positions, dim by dim.
Value pad_scatter(Builder& b, const Value& grad, const Value& self, const std::vector<int64_t>& padding, bool reflect) {
  if (padding.size() % 2 || static_cast<int>(padding.size() / 2) > self.rank()) fail("pad: bad padding length");
  Value g = grad;
  for (size_t k = padding.size() / 2; k-- > 0;) {
    const int64_t dim = self.rank() - 1 - static_cast<int64_t>(k);
    std::vector<int64_t> target = g.dims();
    target[dim] = self.dims()[dim];
    Value source = pad_source(b, self.dims()[dim], padding[2 * k], padding[2 * k + 1], reflect);
    Value index = b.broadcast_in_dim(source, g.dims(), {dim});
    g = b.scatter_along(b.full(0, TensorType{g.element(), target}), dim, index, g, "add");
  }
  return g;
}

}  // namespace

Value Builder::flip(const Value& v, const std::vector<int64_t>& dims_in) {
  std::vector<int64_t> dims;
  for (int64_t d : dims_in) {
    if (v.rank() == 0) continue;
    const int64_t w = shape_dim(d, v.rank(), "flip");
    if (!std::count(dims.begin(), dims.end(), w)) dims.push_back(w);
  }
  if (dims.empty() || v.type.numel() == 0) return v;
  std::sort(dims.begin(), dims.end());
  return emit("\"stablehlo.reverse\"(" + name(v) + ") {dimensions = " + i64_array(dims) + "} : (" + v.type.mlir() +
                  ") -> " + v.type.mlir(),
              v.type);
}

Value Builder::roll(const Value& v, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims) {
  if (dims.empty()) {
    if (v.rank() == 0) return v;
    return reshape(roll(reshape(v, {v.type.numel()}), shifts, {0}), v.dims());
  }
  if (shifts.size() != dims.size()) fail("roll: shifts and dims differ in length");
  Value x = v;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (v.rank() == 0) continue;
    const int64_t dim = shape_dim(dims[i], v.rank(), "roll");
    const int64_t n = v.dims()[dim];
    if (n == 0) continue;
    const int64_t s = ((shifts[i] % n) + n) % n;
    if (s == 0) continue;
    x = concatenate({slice_dim(*this, x, dim, n - s, n), slice_dim(*this, x, dim, 0, n - s)}, dim);
  }
  return x;
}

Value Builder::repeat(const Value& v, const std::vector<int64_t>& repeats) {
  const int r = static_cast<int>(repeats.size());
  if (r < v.rank()) fail("repeat: fewer repeats than dims");
  std::vector<int64_t> padded(r - v.rank(), 1);
  padded.insert(padded.end(), v.dims().begin(), v.dims().end());
  std::vector<int64_t> interleaved, mapping, out;
  for (int i = 0; i < r; ++i) {
    interleaved.push_back(repeats[i]);
    interleaved.push_back(padded[i]);
    mapping.push_back(2 * i + 1);
    out.push_back(repeats[i] * padded[i]);
  }
  return reshape(broadcast_in_dim(reshape(v, padded), interleaved, mapping), out);
}

namespace {

// True where col - row <= diagonal (lower) or >= diagonal (upper), over v's last two dims.
Value triangle(Builder& b, const Value& v, int64_t diagonal, bool lower) {
  if (v.rank() < 2) fail("tril/triu: the input has fewer than 2 dims");
  const int64_t rows = v.dims()[v.rank() - 2], cols = v.dims()[v.rank() - 1];
  const TensorType t{ElementType::S64, {rows, cols}};
  Value offset = b.sub(b.iota(t, 1), b.iota(t, 0));
  Value keep = lower ? b.le(offset, b.constant_int(diagonal, ElementType::S64))
                     : b.ge(offset, b.constant_int(diagonal, ElementType::S64));
  return b.select(keep, v, b.scalar_like(0, v));
}

}  // namespace

Value Builder::tril(const Value& v, int64_t diagonal) { return triangle(*this, v, diagonal, true); }
Value Builder::triu(const Value& v, int64_t diagonal) { return triangle(*this, v, diagonal, false); }

Value Builder::constant_pad(const Value& v, const std::vector<int64_t>& pad, const Value& value) {
  if (pad.size() % 2 || static_cast<int>(pad.size() / 2) > v.rank()) fail("constant_pad: bad padding length");
  std::vector<int64_t> low(v.rank(), 0), high(v.rank(), 0), interior(v.rank(), 0);
  std::vector<int64_t> dims = v.dims();
  for (size_t i = 0; i < pad.size() / 2; ++i) {
    const int64_t d = v.rank() - 1 - static_cast<int64_t>(i);
    low[d] = pad[2 * i];
    high[d] = pad[2 * i + 1];
    dims[d] += low[d] + high[d];
  }
  Value fill = convert(value, v.element());
  TensorType t{v.element(), dims};
  if (t.numel() == 0) return full(0, t);
  if (v.type.numel() == 0) return broadcast_to(fill, dims);
  return emit("stablehlo.pad " + name(v) + ", " + name(fill) + ", low = " + list(low) + ", high = " + list(high) +
                  ", interior = " + list(interior) + " : (" + v.type.mlir() + ", " + fill.type.mlir() + ") -> " +
                  t.mlir(),
              t);
}

Value Builder::reflection_pad(const Value& v, const std::vector<int64_t>& padding) {
  return pad_gather(*this, v, padding, true);
}

Value Builder::replication_pad(const Value& v, const std::vector<int64_t>& padding) {
  return pad_gather(*this, v, padding, false);
}

Value Builder::reflection_pad_backward(const Value& grad, const Value& self, const std::vector<int64_t>& padding) {
  return pad_scatter(*this, grad, self, padding, true);
}

Value Builder::replication_pad_backward(const Value& grad, const Value& self, const std::vector<int64_t>& padding) {
  return pad_scatter(*this, grad, self, padding, false);
}

Value Builder::sort_along(const Value& v, int64_t dim_in, bool descending, bool indices) {
  const TensorType index_type{ElementType::S64, v.dims()};
  if (v.rank() == 0) {
    shape_dim(dim_in, 1, "sort");
    return indices ? constant_int(0, ElementType::S64) : v;
  }
  const int64_t dim = shape_dim(dim_in, v.rank(), "sort");
  if (v.type.numel() == 0) return indices ? full(0, index_type) : v;
  Value iota_v = iota(index_type, dim);
  // The comparator: does a go before b? Ascending: a < b, or b is NaN and a is not; descending: a > b,
  // or a is NaN and b is not. Equal keys keep their order (is_stable).
  const TensorType s{v.element(), {}}, si{ElementType::S64, {}}, p{ElementType::Pred, {}};
  const std::string r = "%s" + std::to_string(next_id_) + "_";
  const std::string a = r + "a", c = r + "b";
  const std::string st = s.mlir(), pt = p.mlir();
  const char* ct = compare_type(v.element());
  auto cmp = [&](const std::string& out, const char* dir, const std::string& x, const std::string& y) {
    return "      " + out + " = stablehlo.compare " + dir + ", " + x + ", " + y + ", " + ct + " : (" + st + ", " + st +
           ") -> " + pt + "\n";
  };
  std::string body = cmp(r + "0", descending ? "GT" : "LT", a, c);
  std::string result = r + "0";
  if (is_float(v.element())) {
    const std::string& nan_side = descending ? a : c;
    const std::string& other = descending ? c : a;
    body += cmp(r + "1", "NE", nan_side, nan_side);
    body += cmp(r + "2", "EQ", other, other);
    body += "      " + r + "3 = stablehlo.and " + r + "1, " + r + "2 : " + pt + "\n";
    body += "      " + r + "4 = stablehlo.or " + r + "0, " + r + "3 : " + pt + "\n";
    result = r + "4";
  }
  auto sorted = emit_multi("\"stablehlo.sort\"(" + name(v) + ", " + name(iota_v) + ") ({\n    ^bb0(" + a + ": " + st +
                               ", " + c + ": " + st + ", " + r + "c: " + si.mlir() + ", " + r + "d: " + si.mlir() +
                               "):\n" + body + "      stablehlo.return " + result + " : " + pt +
                               "\n    }) {dimension = " + std::to_string(dim) + " : i64, is_stable = true} : (" +
                               v.type.mlir() + ", " + index_type.mlir() + ") -> (" + v.type.mlir() + ", " +
                               index_type.mlir() + ")",
                           {v.type, index_type});
  return sorted[indices ? 1 : 0];
}

Value Builder::topk(const Value& v, int64_t k, int64_t dim_in, bool largest, bool indices) {
  Value sorted = sort_along(v, dim_in, largest, indices);
  if (v.rank() == 0) return sorted;
  return slice_dim(*this, sorted, shape_dim(dim_in, v.rank(), "topk"), 0, k);
}

Value Builder::arange(double start, double end, double step) {
  // The length as CPU's Meta pass computes it: from the scalars in the accumulation type (int64 for
  // integers, float for half precision, double otherwise).
  double size;
  if (!is_float(nominal_element_)) {
    size = std::ceil(static_cast<double>(static_cast<int64_t>(end) - static_cast<int64_t>(start)) /
                     static_cast<double>(static_cast<int64_t>(step)));
  } else if (element_size(nominal_element_) == 2) {
    size = std::ceil(static_cast<double>(static_cast<float>(end) - static_cast<float>(start)) /
                     static_cast<double>(static_cast<float>(step)));
  } else {
    size = std::ceil((end - start) / step);
  }
  const int64_t n = size > 0 ? static_cast<int64_t>(size) : 0;
  if (!is_float(nominal_element_)) {
    // CPU's integer arange: int64 start + i * step, from the truncated scalars.
    const TensorType t{ElementType::S64, {n}};
    return add(mul(iota(t, 0), constant_int(static_cast<int64_t>(step), ElementType::S64)),
               constant_int(static_cast<int64_t>(start), ElementType::S64));
  }
  const ElementType e = nominal_element_ == ElementType::F64 ? ElementType::F64 : ElementType::F32;
  const TensorType t{e, {n}};
  return add(mul(iota(t, 0), constant(step, e)), constant(start, e));
}

Value Builder::linspace(const Value& start_in, const Value& end_in, int64_t steps) {
  // Integer outputs compute in double and truncate, as on CPU; floats in their own type.
  const ElementType e = is_float(start_in.element()) ? start_in.element() : ElementType::F64;
  const Value start = convert(start_in, e), end = convert(end_in, e);
  const TensorType t{e, {steps}};
  if (steps <= 1) return broadcast_to(start, {steps});
  // Half precision rounds each step through its own type (CPU computes in BFloat16/Half there).
  // XLA may divide by a constant through its reciprocal: one Newton step restores the correctly
  // rounded quotient CPU has (integer outputs truncate it, so 0.99999... must not stand for 1).
  const Value span = nominal(sub(end, start)), divisor = constant(static_cast<double>(steps - 1), e);
  const Value q = div(span, divisor);
  Value step = nominal(add(q, div(sub(span, mul(q, divisor)), divisor)));
  Value i = iota(t, 0);
  Value from_start = add(start, nominal(mul(step, nominal(i))));
  Value from_end = sub(end, nominal(mul(step, nominal(sub(constant(static_cast<double>(steps - 1), e), i)))));
  return select(lt(i, constant(static_cast<double>(steps / 2), e)), from_start, from_end);
}

Value Builder::eye(int64_t n, int64_t m) {
  const TensorType t{ElementType::S64, {n, m}};
  return eq(iota(t, 0), iota(t, 1));
}

// ---------------------------------------------------------------------------------------------
// pooling / upsampling primitives (specs/pooling.yaml)

Value Builder::dense_constant(const std::string& elements, const TensorType& type) {
  return emit("stablehlo.constant dense<" + elements + "> : " + type.mlir(), type);
}

namespace {

// One spatial axis of a windowed op, taken separably: output index o reads `taps` input positions
// pos[k * out + o] (clamped into range; k-major), each with a validity flag and a weight.
struct Taps {
  int64_t axis = 0, in = 0, out = 0, taps = 0;
  std::vector<int64_t> pos;
  std::vector<bool> valid;
  std::vector<double> weight;  // empty: all 1
};

Value pool_i64_vector(Builder& b, const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return b.dense_constant(s + "]", TensorType{ElementType::S64, {static_cast<int64_t>(v.size())}});
}

Value pool_pred_vector(Builder& b, const std::vector<bool>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += std::string(i ? ", " : "") + (v[i] ? "true" : "false");
  return b.dense_constant(s + "]", TensorType{ElementType::Pred, {static_cast<int64_t>(v.size())}});
}

Value pool_float_vector(Builder& b, const std::vector<double>& v, ElementType element) {
  const ElementType e = element == ElementType::F64 ? ElementType::F64 : ElementType::F32;
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + float_literal(v[i], e);
  return b.convert(b.dense_constant(s + "]", TensorType{e, {static_cast<int64_t>(v.size())}}), element);
}

Taps make_taps(int64_t axis, int64_t in, int64_t out, int64_t taps) {
  Taps t;
  t.axis = axis, t.in = in, t.out = out, t.taps = taps;
  t.pos.assign(taps * out, 0);
  t.valid.assign(taps * out, false);
  return t;
}

void set_tap(Taps& t, int64_t k, int64_t o, int64_t pos) {
  const bool ok = pos >= 0 && pos < t.in;
  t.pos[k * t.out + o] = ok ? pos : std::min<int64_t>(std::max<int64_t>(pos, 0), t.in - 1);
  t.valid[k * t.out + o] = ok;
}

// PyTorch's pooling_output_shape.
int64_t pool_out_size(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dilation, bool ceil_mode) {
  const int64_t num = in + 2 * pad - dilation * (k - 1) - 1 + (ceil_mode ? stride - 1 : 0);
  int64_t out = (num >= 0 ? num / stride : -((-num + stride - 1) / stride)) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

Taps window_taps(int64_t axis, int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation, bool ceil_mode) {
  Taps t = make_taps(axis, in, pool_out_size(in, k, pad, stride, dilation, ceil_mode), k);
  for (int64_t j = 0; j < k; ++j) {
    for (int64_t o = 0; o < t.out; ++o) set_tap(t, j, o, o * stride - pad + j * dilation);
  }
  return t;
}

int64_t adaptive_start(int64_t o, int64_t in, int64_t out) { return (o * in) / out; }
int64_t adaptive_end(int64_t o, int64_t in, int64_t out) { return ((o + 1) * in + out - 1) / out; }

Taps adaptive_taps(int64_t axis, int64_t in, int64_t out) {
  int64_t taps = 0;
  for (int64_t o = 0; o < out; ++o) taps = std::max(taps, adaptive_end(o, in, out) - adaptive_start(o, in, out));
  Taps t = make_taps(axis, in, out, taps);
  for (int64_t o = 0; o < out; ++o) {
    const int64_t start = adaptive_start(o, in, out), len = adaptive_end(o, in, out) - start;
    for (int64_t j = 0; j < taps; ++j) {
      set_tap(t, j, o, start + j);
      if (j >= len) t.valid[j * out + o] = false;
    }
  }
  return t;
}

int64_t list_at(const std::vector<int64_t>& v, size_t i, int64_t fallback) {
  return v.empty() ? fallback : v.size() == 1 ? v[0] : v.at(i);
}

// x [.., in, ..] -> [.., taps, out, ..] (taps at t.axis).
Value gather_taps(Builder& b, const Value& x, const Taps& t) {
  Value g = b.index_select(x, t.axis, pool_i64_vector(b, t.pos));
  std::vector<int64_t> dims = x.dims();
  dims[t.axis] = t.out;
  dims.insert(dims.begin() + t.axis, t.taps);
  return b.reshape(g, dims);
}

// A [taps * out] vector laid along (axis, axis + 1) of `dims`.
Value tap_field(Builder& b, const Value& v, const Taps& t, const std::vector<int64_t>& dims) {
  return b.broadcast_in_dim(b.reshape(v, {t.taps, t.out}), dims, {t.axis, t.axis + 1});
}

// Tap k of a [.., taps, out, ..] value: [.., out, ..].
Value tap_at(Builder& b, const Value& g, const Taps& t, int64_t k) {
  std::vector<int64_t> start(g.rank(), 0), limit = g.dims(), strides(g.rank(), 1);
  start[t.axis] = k;
  limit[t.axis] = k + 1;
  std::vector<int64_t> dims = g.dims();
  dims.erase(dims.begin() + t.axis);
  return b.reshape(b.slice(g, start, limit, strides), dims);
}

// The weighted sum of each output's valid taps along one axis.
Value sum_taps(Builder& b, const Value& x, const Taps& t) {
  Value g = gather_taps(b, x, t);
  if (!t.weight.empty()) g = b.mul(g, tap_field(b, pool_float_vector(b, t.weight, g.element()), t, g.dims()));
  bool all_valid = std::all_of(t.valid.begin(), t.valid.end(), [](bool v) { return v; });
  if (!all_valid) g = b.select(tap_field(b, pool_pred_vector(b, t.valid), t, g.dims()), g, b.scalar_like(0, g));
  if (t.taps == 1) return tap_at(b, g, t, 0);
  return b.reduce(g, {t.axis}, g.element() == ElementType::Pred ? "or" : "add", 0);
}

// The transpose of sum_taps: g [.., out, ..] scattered (added) into [.., in, ..].
Value scatter_taps(Builder& b, const Value& g, const Taps& t) {
  std::vector<int64_t> dims = g.dims();
  dims.insert(dims.begin() + t.axis, t.taps);
  std::vector<int64_t> mapping;
  for (int i = 0; i < g.rank(); ++i) mapping.push_back(i < t.axis ? i : i + 1);
  Value src = b.broadcast_in_dim(g, dims, mapping);
  if (!t.weight.empty()) src = b.mul(src, tap_field(b, pool_float_vector(b, t.weight, g.element()), t, dims));
  src = b.select(tap_field(b, pool_pred_vector(b, t.valid), t, dims), src, b.scalar_like(0, src));
  std::vector<int64_t> flat_dims = g.dims();
  flat_dims[t.axis] = t.taps * t.out;
  src = b.reshape(src, flat_dims);
  Value index = b.broadcast_in_dim(pool_i64_vector(b, t.pos), flat_dims, {t.axis});
  std::vector<int64_t> out_dims = g.dims();
  out_dims[t.axis] = t.in;
  return b.scatter_along(b.full(0, TensorType{g.element(), out_dims}), t.axis, index, src, "add");
}

Value sum_all_taps(Builder& b, Value x, const std::vector<Taps>& axes) {
  for (auto it = axes.rbegin(); it != axes.rend(); ++it) x = sum_taps(b, x, *it);
  return x;
}

Value scatter_all_taps(Builder& b, Value g, const std::vector<Taps>& axes) {
  for (const Taps& t : axes) g = scatter_taps(b, g, t);
  return g;
}

// Max (and the flat index of the first max, or of the last NaN) over the taps of every axis, taken
// separably from the last axis to the first, which picks the same element as CPU's row-major scan.
std::pair<Value, Value> max_all_taps(Builder& b, const Value& x_in, const std::vector<Taps>& axes) {
  Value x = x_in;
  std::optional<Value> index;
  int64_t plane_stride = 1;
  for (auto it = axes.rbegin(); it != axes.rend(); ++it) {
    const Taps& t = *it;
    Value g = gather_taps(b, x, t);
    Value flat = b.mul(tap_field(b, pool_i64_vector(b, t.pos), t, g.dims()),
                       b.constant_int(plane_stride, ElementType::S64));
    if (index) flat = b.add(flat, gather_taps(b, *index, t));
    Value valid = tap_field(b, pool_pred_vector(b, t.valid), t, g.dims());
    std::vector<int64_t> out_dims = g.dims();
    out_dims.erase(out_dims.begin() + t.axis);
    Value best = b.full(0, TensorType{g.element(), out_dims});
    Value best_index = b.full(-1, TensorType{ElementType::S64, out_dims});
    for (int64_t k = 0; k < t.taps; ++k) {
      Value c = tap_at(b, g, t, k);
      Value take = b.binary("or", b.eq(best_index, b.constant_int(-1, ElementType::S64)), b.gt(c, best));
      if (is_float(c.element())) take = b.binary("or", take, b.ne(c, c));
      take = b.binary("and", take, tap_at(b, valid, t, k));
      best = b.select(take, c, best);
      best_index = b.select(take, tap_at(b, flat, t, k), best_index);
    }
    x = best;
    index = best_index;
    plane_stride *= t.in;
  }
  return {x, *index};
}

std::vector<Taps> max_pool_axes(const Value& self, const std::vector<int64_t>& kernel_size,
                                const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                                const std::vector<int64_t>& dilation, bool ceil_mode, int64_t nd) {
  std::vector<Taps> axes;
  for (int64_t i = 0; i < nd; ++i) {
    const int64_t axis = self.rank() - nd + i, k = list_at(kernel_size, i, 1);
    axes.push_back(window_taps(axis, self.dims()[axis], k, list_at(stride, i, k), list_at(padding, i, 0),
                               list_at(dilation, i, 1), ceil_mode));
  }
  return axes;
}

std::vector<Taps> adaptive_axes(const Value& self, const std::vector<int64_t>& output_size) {
  std::vector<Taps> axes;
  const int64_t nd = output_size.size();
  for (int64_t i = 0; i < nd; ++i) {
    const int64_t axis = self.rank() - nd + i;
    axes.push_back(adaptive_taps(axis, self.dims()[axis], output_size[i]));
  }
  return axes;
}

// The divisor of every output of an average pool, [out...] broadcast over the leading dims.
Value avg_divisor(Builder& b, const Value& self, const std::vector<Taps>& axes, const std::vector<int64_t>& kernel_size,
                  const std::vector<int64_t>& stride, const std::vector<int64_t>& padding, bool count_include_pad,
                  int64_t divisor_override, const std::vector<int64_t>& out_dims) {
  if (divisor_override != 0) return b.scalar_like(static_cast<double>(divisor_override), self);
  std::optional<Value> divisor;
  const int64_t nd = axes.size();
  for (int64_t i = 0; i < nd; ++i) {
    const Taps& t = axes[i];
    const int64_t k = list_at(kernel_size, i, 1), s = list_at(stride, i, k), p = list_at(padding, i, 0);
    std::vector<double> sizes;
    for (int64_t o = 0; o < t.out; ++o) {
      const int64_t start = o * s - p, end = std::min(start + k, t.in + p);
      const int64_t count = count_include_pad ? end - start : std::min(end, t.in) - std::max<int64_t>(start, 0);
      sizes.push_back(static_cast<double>(std::max<int64_t>(count, 1)));  // an empty window sums to 0
    }
    Value v = b.broadcast_in_dim(pool_float_vector(b, sizes, self.element()), out_dims, {t.axis});
    divisor = divisor ? b.mul(*divisor, v) : v;
  }
  return *divisor;
}

std::vector<int64_t> taps_out_dims(const Value& self, const std::vector<Taps>& axes) {
  std::vector<int64_t> dims = self.dims();
  for (const Taps& t : axes) dims[t.axis] = t.out;
  return dims;
}

// PyTorch's compute_scales_value<float> and the nearest-neighbour source indices.
float scale_value(std::optional<double> scale, int64_t in, int64_t out) {
  return scale && *scale > 0 ? static_cast<float>(1.0 / *scale) : static_cast<float>(in) / static_cast<float>(out);
}

Taps nearest_taps(int64_t axis, int64_t in, int64_t out, std::optional<double> scale, bool exact) {
  Taps t = make_taps(axis, in, out, 1);
  const float s = scale_value(scale, in, out);
  for (int64_t o = 0; o < out; ++o) {
    int64_t src;
    if (exact) {
      src = std::min(static_cast<int64_t>(floorf(static_cast<float>((o + 0.5) * s))), in - 1);
    } else if (out == in) {
      src = o;
    } else if (out == 2 * in) {
      src = o >> 1;
    } else {
      src = std::min(static_cast<int64_t>(floorf(static_cast<float>(o) * s)), in - 1);
    }
    set_tap(t, 0, o, src);
  }
  return t;
}

// Linear interpolation's two taps and weights (compute_source_index_and_lambda), in float (double
// for F64) as PyTorch's opmath.
template <typename T>
Taps linear_taps_as(int64_t axis, int64_t in, int64_t out, bool align_corners, std::optional<double> scale) {
  Taps t = make_taps(axis, in, out, 2);
  t.weight.assign(2 * out, 0.0);
  T ratio;
  if (align_corners) {
    ratio = out > 1 ? static_cast<T>(in - 1) / static_cast<T>(out - 1) : static_cast<T>(0);
  } else {
    ratio = scale && *scale > 0 ? static_cast<T>(1.0 / *scale) : static_cast<T>(in) / static_cast<T>(out);
  }
  for (int64_t o = 0; o < out; ++o) {
    int64_t i0, i1;
    T l0, l1;
    if (out == in) {
      i0 = i1 = o;
      l0 = 1, l1 = 0;
    } else {
      T real = align_corners ? ratio * static_cast<T>(o)
                             : ratio * (static_cast<T>(o) + static_cast<T>(0.5)) - static_cast<T>(0.5);
      if (!align_corners && real < 0) real = 0;
      i0 = std::min(static_cast<int64_t>(floorf(static_cast<float>(real))), in - 1);
      l1 = std::min(std::max(real - static_cast<T>(i0), static_cast<T>(0)), static_cast<T>(1));
      i1 = i0 + (i0 < in - 1 ? 1 : 0);
      l0 = static_cast<T>(1) - l1;
    }
    set_tap(t, 0, o, i0);
    set_tap(t, 1, o, i1);
    t.weight[o] = static_cast<double>(l0);
    t.weight[out + o] = static_cast<double>(l1);
  }
  return t;
}

std::vector<Taps> upsample_axes(int64_t rank, const std::vector<int64_t>& in_dims, const std::vector<int64_t>& output_size,
                                bool linear, bool align_corners, bool exact, ElementType element,
                                const std::vector<std::optional<double>>& scales) {
  std::vector<Taps> axes;
  const int64_t nd = output_size.size();
  for (int64_t i = 0; i < nd; ++i) {
    const int64_t axis = rank - nd + i, in = in_dims[axis], out = output_size[i];
    if (!linear) {
      axes.push_back(nearest_taps(axis, in, out, scales[i], exact));
    } else if (element == ElementType::F64) {
      axes.push_back(linear_taps_as<double>(axis, in, out, align_corners, scales[i]));
    } else {
      axes.push_back(linear_taps_as<float>(axis, in, out, align_corners, scales[i]));
    }
  }
  return axes;
}

}  // namespace

Value Builder::max_pool(const Value& self, const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& stride,
                        const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, bool ceil_mode,
                        int64_t nd, bool indices) {
  auto r = max_all_taps(*this, self, max_pool_axes(self, kernel_size, stride, padding, dilation, ceil_mode, nd));
  return indices ? r.second : r.first;
}

Value Builder::adaptive_max_pool(const Value& self, const std::vector<int64_t>& output_size, bool indices) {
  auto r = max_all_taps(*this, self, adaptive_axes(self, output_size));
  return indices ? r.second : r.first;
}

Value Builder::max_pool_backward(const Value& grad, const Value& self, const Value& indices, int64_t nd) {
  const int64_t lead = self.rank() - nd;
  std::vector<int64_t> dims(self.dims().begin(), self.dims().begin() + lead), gdims = dims;
  int64_t plane = 1, out_plane = 1;
  for (int64_t i = lead; i < self.rank(); ++i) plane *= self.dims()[i], out_plane *= grad.dims()[i];
  dims.push_back(plane);
  gdims.push_back(out_plane);
  Value r = scatter_along(full(0, TensorType{grad.element(), dims}), lead, reshape(indices, gdims),
                          reshape(grad, gdims), "add");
  return reshape(r, self.dims());
}

Value Builder::avg_pool(const Value& self, const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& stride,
                        const std::vector<int64_t>& padding, bool ceil_mode, bool count_include_pad,
                        int64_t divisor_override, int64_t nd) {
  auto axes = max_pool_axes(self, kernel_size, stride, padding, {}, ceil_mode, nd);
  Value sum = sum_all_taps(*this, self, axes);
  return div(sum, avg_divisor(*this, self, axes, kernel_size, stride, padding, count_include_pad, divisor_override,
                              sum.dims()));
}

Value Builder::avg_pool_backward(const Value& grad, const Value& self, const std::vector<int64_t>& kernel_size,
                                 const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                                 bool ceil_mode, bool count_include_pad, int64_t divisor_override, int64_t nd) {
  auto axes = max_pool_axes(self, kernel_size, stride, padding, {}, ceil_mode, nd);
  Value g = div(grad, avg_divisor(*this, grad, axes, kernel_size, stride, padding, count_include_pad,
                                  divisor_override, grad.dims()));
  return scatter_all_taps(*this, g, axes);
}

Value Builder::adaptive_avg_pool(const Value& self, const std::vector<int64_t>& output_size) {
  auto axes = adaptive_axes(self, output_size);
  Value sum = sum_all_taps(*this, self, axes);
  Value divisor = scalar_like(1, sum);
  for (const Taps& t : axes) {
    std::vector<double> lens;
    for (int64_t o = 0; o < t.out; ++o) lens.push_back(adaptive_end(o, t.in, t.out) - adaptive_start(o, t.in, t.out));
    divisor = mul(divisor, broadcast_in_dim(pool_float_vector(*this, lens, sum.element()), sum.dims(), {t.axis}));
  }
  return div(sum, divisor);
}

Value Builder::adaptive_avg_pool_backward(const Value& grad, const Value& self, int64_t nd) {
  std::vector<int64_t> output_size(grad.dims().end() - nd, grad.dims().end());
  auto axes = adaptive_axes(self, output_size);
  Value g = grad;
  for (const Taps& t : axes) {
    std::vector<double> lens;
    for (int64_t o = 0; o < t.out; ++o) lens.push_back(adaptive_end(o, t.in, t.out) - adaptive_start(o, t.in, t.out));
    g = div(g, broadcast_in_dim(pool_float_vector(*this, lens, g.element()), g.dims(), {t.axis}));
  }
  return scatter_all_taps(*this, g, axes);
}

Value Builder::upsample_nearest(const Value& self, const std::vector<int64_t>& output_size, std::optional<double> s0,
                                std::optional<double> s1, std::optional<double> s2, bool exact) {
  auto axes = upsample_axes(self.rank(), self.dims(), output_size, false, false, exact, self.element(), {s0, s1, s2});
  return sum_all_taps(*this, self, axes);
}

Value Builder::upsample_nearest_backward(const Value& grad, const std::vector<int64_t>& input_size,
                                         std::optional<double> s0, std::optional<double> s1, std::optional<double> s2,
                                         bool exact) {
  const int64_t nd = static_cast<int64_t>(input_size.size()) - 2;
  std::vector<int64_t> output_size(grad.dims().end() - nd, grad.dims().end());
  auto axes = upsample_axes(grad.rank(), input_size, output_size, false, false, exact, grad.element(), {s0, s1, s2});
  return scatter_all_taps(*this, grad, axes);
}

Value Builder::upsample_linear(const Value& self, const std::vector<int64_t>& output_size, bool align_corners,
                               std::optional<double> s0, std::optional<double> s1, std::optional<double> s2) {
  auto axes = upsample_axes(self.rank(), self.dims(), output_size, true, align_corners, false, self.element(),
                            {s0, s1, s2});
  return sum_all_taps(*this, self, axes);
}

Value Builder::upsample_linear_backward(const Value& grad, const std::vector<int64_t>& input_size, bool align_corners,
                                        std::optional<double> s0, std::optional<double> s1, std::optional<double> s2) {
  const int64_t nd = static_cast<int64_t>(input_size.size()) - 2;
  std::vector<int64_t> output_size(grad.dims().end() - nd, grad.dims().end());
  auto axes = upsample_axes(grad.rank(), input_size, output_size, true, align_corners, false, grad.element(),
                            {s0, s1, s2});
  return scatter_all_taps(*this, grad, axes);
}

}  // namespace torchtpu::rt
