// Builder core: emission, parameters, constants, structure (convert ... iota, cat), flat gather/scatter, views, finish.
#include "hlo/hlo_builder.h"

#include <algorithm>
#include <numeric>

#include "hlo/builder_internal.h"

namespace torchtpu::rt {

using namespace builder_internal;

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

Builder::Emitted Builder::emitted_since(const Mark& mark) const {
  Emitted e{body_.substr(mark.body), next_id_, {}, {}, {}, {}, nominal_element_, random_counters_};
  for (int id = mark.next_id; id < next_id_; ++id) {
    if (const auto it = widened_.find(id); it != widened_.end()) e.widened.emplace_back(id, it->second);
    if (accumulated_.count(id)) e.accumulated.push_back(id);
    if (const auto it = merged_rows_.find(id); it != merged_rows_.end()) e.merged_rows.emplace_back(id, it->second);
    if (const auto it = reshaped_from_.find(id); it != reshaped_from_.end()) e.reshaped_from.emplace_back(id, it->second);
  }
  return e;
}

void Builder::advance_ids(int next_id) {
  if (next_id < next_id_) fail("replaying a recorded call: value ids would go back");
  next_id_ = next_id;
}

void Builder::replay(const Emitted& emitted) {
  advance_ids(emitted.next_id);
  body_ += emitted.body;
  for (const auto& [id, narrow] : emitted.widened) widened_.emplace(id, narrow);
  accumulated_.insert(emitted.accumulated.begin(), emitted.accumulated.end());
  for (const auto& [id, unmerged] : emitted.merged_rows) merged_rows_.emplace(id, unmerged);
  for (const auto& [id, source] : emitted.reshaped_from) reshaped_from_.emplace(id, source);
  nominal_element_ = emitted.nominal_element;
  random_counters_ = emitted.random_counters;
}

std::pair<Value, Value> Builder::barrier(const Value& a, const Value& b) {
  const std::vector<Value> kept = emit_multi(
      "stablehlo.optimization_barrier " + name(a) + ", " + name(b) + " : " + a.type.mlir() + ", " + b.type.mlir(),
      {a.type, b.type});
  return {kept[0], kept[1]};
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
  if (is_complex(element)) {  // (value, 0)
    const ElementType part = component_type(element);
    return complex_from(constant(value, part), constant(0, part));
  }
  if (element == ElementType::F16 || element == ElementType::BF16 || is_float8(element)) {
    return convert(constant(value, ElementType::F32), element);
  }
  if (!is_float(element)) return constant_int(static_cast<int64_t>(value), element);
  TensorType t{element, {}};
  return emit("stablehlo.constant dense<" + float_literal(value, element) + "> : " + t.mlir(), t);
}

Value Builder::constant_int(int64_t value, ElementType element) {
  if (is_float(element) || is_complex(element)) return constant(static_cast<double>(value), element);
  TensorType t{element, {}};
  std::string literal = element == ElementType::Pred ? (value ? "true" : "false") : std::to_string(value);
  return emit("stablehlo.constant dense<" + literal + "> : " + t.mlir(), t);
}

Value Builder::full(double value, const TensorType& type) { return broadcast_to(constant(value, type.element), type.dims); }

Value Builder::convert(const Value& v, ElementType element) {
  if (v.element() == element) return v;
  // Complex values convert part by part; to a real type only the real part is kept (PyTorch's rule).
  if (is_complex(element)) {
    const ElementType part = component_type(element);
    return complex_from(convert(real_part(v), part), convert(imag_part(v), part));
  }
  if (is_complex(v.element())) return convert(real_part(v), element);
  // XLA on a TPU (with excess precision off, as we compile) folds a float32 -> bfloat16 convert into
  // the reduce that feeds it, and the reduce then keeps its running sum in bfloat16: each step rounds
  // (a v5e's bfloat16 bilinear interpolate, two taps a sum, had 121 of 390 outputs off CPU's, some by
  // 3x near zero). Rounding on the bits first leaves the convert exact and nothing to fold. float16
  // likewise (XLA on a TPU folds converts into float16 dots too).
  if ((element == ElementType::BF16 || element == ElementType::F16) && accumulated_.count(v.id)) {
    return convert(round_significand_on_bits(v, element), element);
  }
  if (const auto it = merged_rows_.find(v.id); it != merged_rows_.end()) {
    const Value unmerged = it->second;  // a copy: the calls below may grow the map
    return reshape(convert(unmerged, element), v.dims());
  }
  TensorType t{element, v.dims()};
  Value widened = emit("stablehlo.convert " + name(v) + " : (" + v.type.mlir() + ") -> " + t.mlir(), t);
  if (element == ElementType::F32 && (v.element() == ElementType::BF16 || v.element() == ElementType::F16)) {
    widened_.emplace(widened.id, v);
  }
  return widened;
}

Value Builder::round_significand_on_bits(const Value& v, ElementType element) {
  // Round to nearest, ties to even, on the float32 bits: add half the dropped part less one plus the
  // kept part's lowest bit, clear the dropped bits. A carry moves into the exponent as it should (past
  // the narrow type's largest, the convert gives infinity); NaN keeps its own value, and below
  // float16's normals (a fixed 2^-24 step there, not 11 significant bits) the convert rounds alone.
  const int dropped = element == ElementType::BF16 ? 16 : 13;
  const auto u32 = [&](int64_t value) { return constant_int(value, ElementType::U32); };
  const Value bits = reinterpret(v, ElementType::U32);
  const Value kept_lowest_bit = bitwise_and(binary("shift_right_logical", bits, u32(dropped)), u32(1));
  const Value rounded = bitwise_and(add(add(bits, u32((int64_t{1} << (dropped - 1)) - 1)), kept_lowest_bit),
                                    u32(~((int64_t{1} << dropped) - 1) & 0xffffffff));
  Value as_is = ne(v, v);
  if (element == ElementType::F16) as_is = bitwise_or(as_is, lt(abs(v), scalar_like(std::ldexp(1.0, -14), v)));
  return select(as_is, v, reinterpret(rounded, ElementType::F32));
}

Value Builder::reinterpret(const Value& v, ElementType element) {
  if (v.element() == element) return v;
  // bitcast_convert takes no complex types: their bytes go through (real, imaginary) pairs.
  if (is_complex(v.element()) || is_complex(element)) {
    if (element_size(v.element()) != element_size(element)) fail("reinterpret changes the element width");
    return reshape(reinterpret_bytes(v, element), v.dims());
  }
  // Booleans are one byte holding 0 or 1 in PyTorch: a numeric conversion keeps those bits.
  if (v.element() == ElementType::Pred || element == ElementType::Pred) {
    if (element_size(v.element()) != 1 || element_size(element) != 1) fail("reinterpret changes the element width");
    return convert(v, element);
  }
  if (element_size(v.element()) != element_size(element)) fail("reinterpret changes the element width");
  TensorType t{element, v.dims()};
  return emit("stablehlo.bitcast_convert " + name(v) + " : (" + v.type.mlir() + ") -> " + t.mlir(), t);
}

Value Builder::reinterpret_bytes(const Value& v, ElementType element) {
  // Booleans are bytes holding 0 or 1: they cross as u8.
  if (v.element() == ElementType::Pred) return reinterpret_bytes(convert(v, ElementType::U8), element);
  if (element == ElementType::Pred) return convert(reinterpret_bytes(v, ElementType::U8), ElementType::Pred);
  // Complex elements are (real, imaginary) pairs of their part type in memory.
  if (is_complex(v.element())) {
    const Value f = flat(v);
    const int64_t n = f.type.numel();
    const Value pairs = concatenate({reshape(real_part(f), {n, 1}), reshape(imag_part(f), {n, 1})}, 1);
    return reinterpret_bytes(reshape(pairs, {2 * n}), element);
  }
  if (is_complex(element)) {
    const Value parts = reinterpret_bytes(v, component_type(element));
    const int64_t n = parts.type.numel() / 2;
    if (parts.type.numel() % 2 != 0) fail("a storage holds no whole number of complex elements");
    const Value pairs = reshape(parts, {n, 2});
    const Value re = reshape(slice(pairs, {0, 0}, {n, 1}, {1, 1}), {n});
    const Value im = reshape(slice(pairs, {0, 1}, {n, 2}, {1, 1}), {n});
    return complex_from(re, im);
  }
  const int64_t from = element_size(v.element()), to = element_size(element);
  const int64_t bytes = v.type.numel() * from;
  if (bytes % to != 0) fail("a storage of " + std::to_string(bytes) + " bytes holds no whole number of " +
                            std::to_string(to) + "-byte elements");
  const Value f = flat(v);
  if (from == to) return reinterpret(f, element);
  if (from > to) {  // each element becomes from/to narrower ones (a trailing dimension)
    TensorType split{element, {f.type.numel(), from / to}};
    return flat(emit("stablehlo.bitcast_convert " + name(f) + " : (" + f.type.mlir() + ") -> " + split.mlir(), split));
  }
  const Value grouped = reshape(f, {bytes / to, to / from});  // to/from narrow elements make one wide one
  TensorType joined{element, {bytes / to}};
  return emit("stablehlo.bitcast_convert " + name(grouped) + " : (" + grouped.type.mlir() + ") -> " + joined.mlir(),
              joined);
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
  for (const auto* earlier : {&merged_rows_, &reshaped_from_}) {
    if (const auto it = earlier->find(v.id); it != earlier->end()) {
      const Value source = it->second;  // a copy: the call below grows the maps
      return reshape(source, dims);
    }
  }
  TensorType t{v.element(), dims};
  const Value reshaped = emit("stablehlo.reshape " + name(v) + " : (" + v.type.mlir() + ") -> " + t.mlir(), t);
  if (accumulated_.count(v.id)) accumulated_.insert(reshaped.id);
  reshaped_from_.emplace(reshaped.id, v);
  // [M, K] rows of v's leading dims: v itself where its last dim is K, else v as [leading..., K].
  if (dims.size() == 2 && v.result < 0) {
    int64_t trailing = 1;
    for (int split = v.rank() - 1; split >= 2; --split) {
      trailing *= v.dims()[static_cast<size_t>(split)];
      if (trailing > dims[1]) break;
      if (trailing != dims[1]) continue;
      std::vector<int64_t> unmerged(v.dims().begin(), v.dims().begin() + split);
      unmerged.push_back(dims[1]);
      merged_rows_.emplace(reshaped.id, reshape(v, unmerged));
      break;
    }
  }
  return reshaped;
}

Value Builder::transpose(const Value& v, const std::vector<int64_t>& permutation) {
  std::vector<int64_t> identity(permutation.size());
  std::iota(identity.begin(), identity.end(), 0);
  if (permutation == identity) return v;
  // libtpu fails to compile a complex128 transpose (its float64 emulation meets a layout it does not
  // expect: "xprecision_emitters ... f64[4,3]{0,1} vs c128[4,3]{1,0}", seen on a v5e): move the parts.
  if (v.element() == ElementType::C128) {
    return complex_from(transpose(real_part(v), permutation), transpose(imag_part(v), permutation));
  }
  std::vector<int64_t> dims;
  for (int64_t p : permutation) dims.push_back(v.dims().at(p));
  TensorType t{v.element(), dims};
  const Value transposed = emit("stablehlo.transpose " + name(v) + ", dims = [" + join(permutation) + "] : (" +
                                    v.type.mlir() + ") -> " + t.mlir(),
                                t);
  if (accumulated_.count(v.id)) accumulated_.insert(transposed.id);
  return transposed;
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

Value Builder::dynamic_slice(const Value& v, const std::vector<Value>& starts, const std::vector<int64_t>& sizes) {
  if (starts.size() != static_cast<size_t>(v.rank()) || sizes.size() != starts.size()) {
    fail("dynamic_slice: one start and one size per dim");
  }
  std::string operands = name(v), types = v.type.mlir();
  for (const Value& s : starts) operands += ", " + name(s), types += ", " + s.type.mlir();
  TensorType t{v.element(), sizes};
  return emit("\"stablehlo.dynamic_slice\"(" + operands + ") {slice_sizes = " + i64_array(sizes) + "} : (" + types +
                  ") -> " + t.mlir(),
              t);
}

Value Builder::dynamic_update_slice(const Value& v, const Value& update, const std::vector<Value>& starts) {
  if (starts.size() != static_cast<size_t>(v.rank()) || update.rank() != v.rank() || update.element() != v.element()) {
    fail("dynamic_update_slice: the update must match the operand's rank and element type, one start per dim");
  }
  std::string operands = name(v) + ", " + name(update), types = v.type.mlir() + ", " + update.type.mlir();
  for (const Value& s : starts) operands += ", " + name(s), types += ", " + s.type.mlir();
  return emit("\"stablehlo.dynamic_update_slice\"(" + operands + ") : (" + types + ") -> " + v.type.mlir(), v.type);
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

// A strided view whose dims nest (sorted by stride, each stride a multiple of the next and at least
// the next's extent; stride-0 dims broadcast) reads as slices: the storage reshaped so that each stride
// is a dim, then each dim cut to the view's size. XLA turns that into copies, where the general path's
// gather computes every index.
namespace {

// How a nesting view steps through memory: its stepping dims, outermost first; the radix of each
// (base[0] the outermost dim's size, base[i] = stride[i-1] / stride[i], the last the innermost stride:
// elements skipped between two read ones) and the extent read in each.
struct Nesting {
  std::vector<int64_t> dims, base, limit;
};

std::optional<Nesting> nesting_of(const ViewGeometry& view) {
  const int rank = static_cast<int>(view.sizes.size());
  Nesting n;
  for (int d = 0; d < rank; ++d) {
    if (view.sizes[d] > 1 && view.strides[d] > 0) n.dims.push_back(d);
    if (view.sizes[d] > 1 && view.strides[d] < 0) return std::nullopt;
  }
  std::stable_sort(n.dims.begin(), n.dims.end(), [&](int64_t a, int64_t b) { return view.strides[a] > view.strides[b]; });
  for (size_t i = 0; i + 1 < n.dims.size(); ++i) {
    const int64_t outer = view.strides[n.dims[i]], inner = view.strides[n.dims[i + 1]];
    if (outer % inner != 0 || outer < inner * view.sizes[n.dims[i + 1]]) return std::nullopt;
  }
  if (n.dims.empty()) {
    n.base = {1};
    n.limit = {1};
    return n;
  }
  n.base.push_back(view.sizes[n.dims[0]]);
  n.limit.push_back(view.sizes[n.dims[0]]);
  for (size_t i = 1; i < n.dims.size(); ++i) {
    n.base.push_back(view.strides[n.dims[i - 1]] / view.strides[n.dims[i]]);
    n.limit.push_back(view.sizes[n.dims[i]]);
  }
  n.base.push_back(view.strides[n.dims.back()]);
  n.limit.push_back(1);
  return n;
}

// The view's elements in memory order (the caller reshapes them): a box of the storage seen as
// [numel / outermost stride, base[1], ...], each dim starting at the offset's digit in that mixed
// radix, when no dim's range carries into the next: one reshape and one slice. Otherwise the flat
// storage from the offset, padded past its end: on a TPU's tiled layouts the flat value and the
// padding are copies of the whole storage (rotate_half's x[..., d/2:], the second half of a split).
Value read_nested(Builder& b, const Value& storage, const ViewGeometry& view, const Nesting& n) {
  const int64_t storage_numel = storage.type.numel();
  if (!n.dims.empty() && storage_numel % view.strides[n.dims[0]] == 0) {
    std::vector<int64_t> shape{storage_numel / view.strides[n.dims[0]]};
    shape.insert(shape.end(), n.base.begin() + 1, n.base.end());
    std::vector<int64_t> start(shape.size()), end(shape.size());
    int64_t rest = view.offset;
    bool fits = true;
    for (size_t i = shape.size(); i-- > 0;) {
      start[i] = i == 0 ? rest : rest % shape[i];
      rest = i == 0 ? 0 : rest / shape[i];
      end[i] = start[i] + n.limit[i];
      fits = fits && end[i] <= shape[i];
    }
    if (fits) {
      if (shape.size() > 1 && shape.back() == 1) {  // stride 1 innermost: no size-1 dim (a TPU tiles the last two)
        shape.pop_back();
        start.pop_back();
        end.pop_back();
      }
      return b.slice(b.reshape(storage, shape), start, end, std::vector<int64_t>(shape.size(), 1));
    }
  }
  int64_t extent = 1;
  for (int64_t step : n.base) extent *= step;
  Value f = b.reshape(storage, {storage_numel});
  if (view.offset + extent > storage_numel) {  // the last row's unread tail lies past the storage
    f = b.concatenate({f, b.full(0, TensorType{storage.element(), {view.offset + extent - storage_numel}})}, 0);
  }
  Value region = b.reshape(b.slice(f, {view.offset}, {view.offset + extent}, {1}), n.base);
  return b.slice(region, std::vector<int64_t>(n.base.size(), 0), n.limit, std::vector<int64_t>(n.base.size(), 1));
}

std::optional<Value> read_strided(Builder& b, const Value& storage, const ViewGeometry& view) {
  const std::optional<Nesting> n = nesting_of(view);
  if (!n) return std::nullopt;
  const Value cut = read_nested(b, storage, view, *n);
  std::vector<int64_t> sorted_sizes;
  for (int64_t d : n->dims) sorted_sizes.push_back(view.sizes[d]);
  Value v = b.reshape(cut, sorted_sizes);
  // Back to the view's dim order (its stepping dims), then its size-1 and broadcast dims.
  std::vector<int64_t> by_dim(n->dims.begin(), n->dims.end());
  std::sort(by_dim.begin(), by_dim.end());
  std::vector<int64_t> permutation;
  for (int64_t d : by_dim) permutation.push_back(std::find(n->dims.begin(), n->dims.end(), d) - n->dims.begin());
  if (!std::is_sorted(permutation.begin(), permutation.end())) v = b.transpose(v, permutation);
  return b.broadcast_in_dim(v, view.sizes, by_dim);
}

}  // namespace

Value Builder::read_view(const Value& storage, const ViewGeometry& view) {
  const int64_t n = numel_of(view.sizes);
  const int64_t storage_numel = storage.type.numel();
  if (n == 0) return full(0, TensorType{storage.element(), view.sizes});
  // (A contiguous view with an offset nests: read_strided below reads it.)
  if (is_contiguous(view) && view.offset == 0 && n == storage_numel) return reshape(storage, view.sizes);
  std::vector<int64_t> order;
  if (view.offset == 0 && n == storage_numel && dense_permutation(view, &order)) {
    std::vector<int64_t> memory_dims;
    for (int64_t d : order) memory_dims.push_back(view.sizes[d]);
    Value in_memory_order = reshape(storage, memory_dims);
    std::vector<int64_t> inverse(order.size());
    for (size_t i = 0; i < order.size(); ++i) inverse[order[i]] = static_cast<int64_t>(i);
    return transpose(in_memory_order, inverse);
  }
  if (std::optional<Value> sliced = read_strided(*this, storage, view)) return *sliced;
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

namespace {

// A function of a module: its parameters (with their aliases), results and body.
std::string function_of(const char* visibility, const std::string& name, const std::vector<std::string>& parameters,
                        const std::vector<std::string>& result_names, const std::vector<std::string>& result_types,
                        const std::string& body) {
  std::string text = std::string("  func.func ") + visibility + " @" + name + "(";
  for (size_t i = 0; i < parameters.size(); ++i) text += (i ? ", " : "") + parameters[i];
  std::string names, types;
  for (size_t i = 0; i < result_names.size(); ++i) {
    names += (i ? ", " : "") + result_names[i];
    types += (i ? ", " : "") + result_types[i];
  }
  // A function with no results (a captured graph piece that only reads) returns nothing.
  const std::string ret = result_names.empty() ? "    return\n" : "    return " + names + " : " + types + "\n";
  return text + ") -> (" + types + ") {\n" + body + ret + "  }\n";
}

}  // namespace

std::string Builder::function_text(const std::string& name, const std::vector<Value>& results) const {
  std::vector<std::string> parameters, result_names, result_types;
  for (const Value& p : parameters_) parameters.push_back(this->name(p) + ": " + p.type.mlir());
  for (const Value& r : results) {
    result_names.push_back(this->name(r));
    result_types.push_back(r.type.mlir());
  }
  return function_of("private", name, parameters, result_names, result_types, body_);
}

std::string Builder::finish(const std::vector<Value>& results, const std::vector<std::pair<int, int>>& aliases) const {
  std::vector<std::string> parameters, result_names, result_types;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    std::string p = name(parameters_[i]) + ": " + parameters_[i].type.mlir();
    for (const auto& [parameter, result] : aliases) {
      if (parameter == static_cast<int>(i)) p += " {tf.aliasing_output = " + std::to_string(result) + " : i32}";
    }
    parameters.push_back(std::move(p));
  }
  for (const Value& r : results) {
    result_names.push_back(name(r));
    result_types.push_back(r.type.mlir());
  }
  std::string text = "module @torchtpu {\n" + function_of("public", "main", parameters, result_names, result_types, body_);
  for (const auto& function : functions_) text += function.second;
  return text + "}\n";
}

std::vector<Value> Builder::call_function(const std::string& name, const std::string& definition,
                                          const std::vector<Value>& args, const std::vector<TensorType>& result_types) {
  if (std::none_of(functions_.begin(), functions_.end(), [&](const auto& f) { return f.first == name; })) {
    functions_.emplace_back(name, definition);
  }
  std::string operands, arg_types, types;
  for (size_t i = 0; i < args.size(); ++i) {
    operands += (i ? ", " : "") + this->name(args[i]);
    arg_types += (i ? ", " : "") + args[i].type.mlir();
  }
  for (size_t i = 0; i < result_types.size(); ++i) types += (i ? ", " : "") + result_types[i].mlir();
  const std::string call = "func.call @" + name + "(" + operands + ") : (" + arg_types + ") -> (" + types + ")";
  if (result_types.empty()) {
    body_ += "    " + call + "\n";
    return {};
  }
  return emit_multi(call, result_types);
}

Value Builder::dense_constant(const std::string& elements, const TensorType& type) {
  return emit("stablehlo.constant dense<" + elements + "> : " + type.mlir(), type);
}

}  // namespace torchtpu::rt
