// Builder reduction family: reduce, sum/mean/prod, amax/amin, any/all, argmax/argmin, var/std, logsumexp, norms, scans.
#include "hlo/hlo_builder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "hlo/builder_internal.h"

namespace torchtpu::rt {

using namespace builder_internal;

namespace {

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

Value Builder::reduce(const Value& v, const std::vector<int64_t>& dims, const char* combiner, double init) {
  return reduce_from(v, dims, combiner, constant(init, v.element()));
}

Value Builder::reduce_from(const Value& v, const std::vector<int64_t>& dims, const char* combiner, const Value& init) {
  TensorType t{v.element(), reduced_dims(v, dims)};
  const Value reduced = emit("stablehlo.reduce(" + name(v) + " init: " + name(init) + ") applies stablehlo." +
                                 combiner + " across dimensions = [" + join(dims) + "] : (" + v.type.mlir() + ", " +
                                 init.type.mlir() + ") -> " + t.mlir(),
                             t);
  // A sum or product rounds at each step (max and min are exact): see convert.
  if (v.element() == ElementType::F32 && (std::strcmp(combiner, "add") == 0 || std::strcmp(combiner, "multiply") == 0)) {
    accumulated_.insert(reduced.id);
  }
  return reduced;
}

Value Builder::sum(const Value& v, const std::vector<int64_t>& dims_in, bool keepdim) {
  const auto dims = normalize_dims(dims_in, v.rank());
  return keep_dims(*this, reduce(v, dims, v.element() == ElementType::Pred ? "or" : "add", 0), v, dims, keepdim);
}

Value Builder::sum_except_dim(const Value& v, int64_t dim) {
  const int64_t kept = normalize_dims({dim}, v.rank()).at(0);
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < v.rank(); ++d) {
    if (d != kept) dims.push_back(d);
  }
  return sum(v, dims, true);
}

Value Builder::mean(const Value& v, const std::vector<int64_t>& dims_in, bool keepdim) {
  const auto dims = normalize_dims(dims_in, v.rank());
  int64_t count = 1;
  for (int64_t d : dims) count *= v.dims()[d];
  // 0/0 gives NaN for an empty reduction, as PyTorch does.
  return div(sum(v, dims, keepdim), constant(static_cast<double>(count), v.element()));
}

Value Builder::max_along(const Value& v, int64_t dim) {
  const auto dims = normalize_dims({dim}, v.rank());
  return keep_dims(*this, reduce(v, dims, "maximum", -std::numeric_limits<double>::infinity()), v, dims, true);
}

namespace {

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

Value Builder::hash_xor(const Value& v, const std::vector<int64_t>& dims_in, bool keepdim, int64_t mode) {
  if (mode != 0) fail("Unknown hash_tensor mode: " + std::to_string(mode));
  if (is_complex(v.element())) fail("\"xor_sum\" not implemented for complex tensors");
  const auto dims = normalize_dims(dims_in, v.rank());
  check_not_empty(v, dims, "hash_tensor");
  const Value wide = convert(v, is_float(v.element()) ? ElementType::F64 : ElementType::S64);
  const Value bits = reinterpret(wide, ElementType::U64);
  return keep_dims(*this, reduce(bits, dims, "xor", 0), v, dims, keepdim);
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

namespace {

// A 2- or p-norm in two parts: the sum of |v|^ord over dims, then its root (sqrt for ord 2).
Value powered_sum(Builder& b, const Value& v, double ord, const std::vector<int64_t>& dims, bool keepdim) {
  const Value a = b.unary("abs", v);
  return b.sum(ord == 2 ? b.mul(a, a) : b.binary("power", a, b.scalar_like(ord, a)), dims, keepdim);
}

Value norm_root(Builder& b, const Value& sum, double ord) {
  return ord == 2 ? b.sqrt(sum) : b.binary("power", sum, b.scalar_like(1.0 / ord, sum));
}

// inf, -inf, 0 and 1 are a max, a min, a count and a sum; every other ord (NaN too) takes the power path.
bool has_root(double ord) { return ord != HUGE_VAL && ord != -HUGE_VAL && ord != 0 && ord != 1; }

}  // namespace

Value Builder::vector_norm(const Value& v, double ord, const std::vector<int64_t>& dims, bool keepdim) {
  if (has_root(ord)) return norm_root(*this, powered_sum(*this, v, ord, dims, keepdim), ord);
  Value a = unary("abs", v);
  if (ord == HUGE_VAL) return amax(a, dims, keepdim);
  if (ord == -HUGE_VAL) return amin(a, dims, keepdim);
  if (ord == 0) return sum(convert(ne(v, scalar_like(0, v)), v.element()), dims, keepdim);
  return sum(a, dims, keepdim);  // ord 1
}

// The root of a 2- or p-norm is its costly part to compile (an accurate float32 sqrt is ~60 ops): one
// per tensor made clip_grad_norm_ over a 110M Llama's 75 gradients ~4,800 ops of its compiled step.
// The sums are joined into one vector (N scalars: no memory traffic) and the root runs once over it.
std::vector<Value> Builder::foreach_vector_norm(const std::vector<Value>& tensors, double ord) {
  const bool one_dtype = std::all_of(tensors.begin(), tensors.end(),
                                     [&](const Value& v) { return v.element() == tensors.front().element(); });
  std::vector<Value> norms;
  if (!has_root(ord) || !one_dtype || tensors.size() < 2) {
    for (const Value& v : tensors) norms.push_back(vector_norm(v, ord, {}, false));
    return norms;
  }
  std::vector<Value> sums;
  for (const Value& v : tensors) sums.push_back(reshape(powered_sum(*this, v, ord, {}, false), {1}));
  const Value roots = norm_root(*this, concatenate(sums, 0), ord);
  for (int64_t i = 0; i < static_cast<int64_t>(tensors.size()); ++i) {
    norms.push_back(reshape(slice(roots, {i}, {i + 1}, {1}), {}));
  }
  return norms;
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

}  // namespace torchtpu::rt
