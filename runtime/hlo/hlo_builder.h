// The StableHLO builder: appends ops to one function and prints the module as text.
// Emitters (generated from specs) call its primitives and return Values, so one lowering
// serves a one-op eager module and a whole graph alike. Knows no torch and no op spec.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "pjrt/element_type.h"

namespace torchtpu::rt {

struct Value {
  int id = -1;
  TensorType type;
  int result = -1;  // which result of a multi-result op (%v3#1), or -1
  const std::vector<int64_t>& dims() const { return type.dims; }
  ElementType element() const { return type.element; }
  int rank() const { return type.rank(); }
};

// Where a view's elements lie in the flat storage (PyTorch's sizes/strides/offset).
struct ViewGeometry {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t offset = 0;
};

// How a module computes float32 math: part of its text, so of every cache key.
// PyTorch's torch.set_float32_matmul_precision: "highest" (its default) = HIGHEST (full float32),
// "high" = HIGH (bfloat16x3 passes on a TPU), "medium" = DEFAULT (one bfloat16 pass).
enum class MatmulPrecision : uint8_t { Highest, High, Default };
struct Numerics {
  MatmulPrecision matmul = MatmulPrecision::Highest;
  // Float32 exp, expm1, log, log1p and tanh ask XLA for its accurate lowering (StableHLO
  // result_accuracy HIGHEST) and sigmoid is built on that exp; false takes the backend's fast
  // approximations (torch.tpu.set_math_mode("fast")).
  bool accurate_math = true;
};

class Builder {
 public:
  Builder() = default;
  explicit Builder(const Numerics& numerics) : numerics_(numerics) {}
  const Numerics& numerics() const { return numerics_; }

  Value parameter(const TensorType& type);
  int num_parameters() const { return static_cast<int>(parameters_.size()); }
  const TensorType& parameter_type(int i) const { return parameters_.at(i).type; }

  // Constants. A value is stored exactly for ints/bools; floats go through their bit pattern.
  Value constant(double value, ElementType element);
  Value constant_int(int64_t value, ElementType element);
  Value scalar_like(double value, const Value& like) { return constant(value, like.element()); }
  Value full(double value, const TensorType& type);

  // Structure.
  Value convert(const Value& v, ElementType element);
  // The same bits as another element type of the same width (a storage viewed with another dtype).
  Value reinterpret(const Value& v, ElementType element);
  // A storage's bytes as a flat array of `element`, which may be narrower or wider than its own
  // (torch.save reads a float storage as bytes; a storage loaded as bytes is viewed as floats).
  Value reinterpret_bytes(const Value& v, ElementType element);
  Value broadcast_in_dim(const Value& v, const std::vector<int64_t>& dims, const std::vector<int64_t>& mapping);
  Value broadcast_to(const Value& v, const std::vector<int64_t>& dims);  // numpy rules, trailing alignment
  Value reshape(const Value& v, const std::vector<int64_t>& dims);
  Value transpose(const Value& v, const std::vector<int64_t>& permutation);
  Value slice(const Value& v, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
              const std::vector<int64_t>& strides);
  Value concatenate(const std::vector<Value>& values, int64_t dim);
  Value iota(const TensorType& type, int64_t dim);
  // stablehlo.dynamic_slice / dynamic_update_slice at run-time starts (0-d int64 Values, one per dim;
  // clamped into range as StableHLO does): a loop step reads or writes its own slice.
  Value dynamic_slice(const Value& v, const std::vector<Value>& starts, const std::vector<int64_t>& sizes);
  Value dynamic_update_slice(const Value& v, const Value& update, const std::vector<Value>& starts);

  // Elementwise (both operands broadcast to a common shape; element types must agree).
  Value binary(const char* op, const Value& a, const Value& b);
  Value unary(const char* op, const Value& v);
  Value compare(const char* direction, const Value& a, const Value& b);  // EQ NE LT LE GT GE
  Value select(const Value& pred, const Value& on_true, const Value& on_false);
  // The dtype an op nominally computes in where its values are wider (half precision computes in
  // float32); the primitive nominal() rounds through it.
  void set_nominal_element(ElementType e) { nominal_element_ = e; }

  // Contractions and reductions.
  Value dot_general(const Value& a, const Value& b, const std::vector<int64_t>& lhs_batch,
                    const std::vector<int64_t>& rhs_batch, const std::vector<int64_t>& lhs_contract,
                    const std::vector<int64_t>& rhs_contract);
  // v rounded to the nominal element as a contraction's operand: a half type's dot_general takes it narrow.
  Value contraction_operand(const Value& v);
  // `combiner` is a binary elementwise op name (add, multiply, maximum, minimum, and, or).
  Value reduce(const Value& v, const std::vector<int64_t>& dims, const char* combiner, double init);
  // The same with an init Value (any 0-d value of v's element type: e.g. an exact int64 bound).
  Value reduce_from(const Value& v, const std::vector<int64_t>& dims, const char* combiner, const Value& init);

  // Flat (1-D) element access at computed indices: the general strided view.
  Value gather_flat(const Value& flat, const Value& indices);
  Value scatter_flat(const Value& flat, const Value& indices, const Value& updates);

  // Per row along dim: the element at sorted (ascending, NaN last, stable) position k, a 0-d or a
  // keepdim-shaped integer Value; or (indices) its position in v.
  Value kth_along(const Value& v, const Value& k, int64_t dim, bool keepdim, bool indices);

  // --- Primitives that spec lowerings name (specs/*.yaml) ---
  // codegen reads this section (codegen/model.py _PARAMETER_KINDS): one declaration per line;
  // parameters are const Value&, const std::vector<Value>&, const std::vector<int64_t>&, int64_t,
  // bool, double, const std::string& or const std::vector<bool>&; an optional schema argument (None
  // allowed) as const std::optional<Value>& or std::optional<double>.
  Value add(const Value& a, const Value& b) { return binary("add", a, b); }
  Value sub(const Value& a, const Value& b) { return binary("subtract", a, b); }
  Value mul(const Value& a, const Value& b) { return binary("multiply", a, b); }
  Value div(const Value& a, const Value& b) { return binary("divide", a, b); }
  // NaN if either operand is NaN, as torch.maximum/minimum (XLA's CPU maximum(1, NaN) gives 1).
  Value maximum(const Value& a, const Value& b);
  Value minimum(const Value& a, const Value& b);
  Value neg(const Value& v) { return unary("negate", v); }
  Value exp(const Value& v) { return transcendental("exponential", v); }
  Value log(const Value& v) { return transcendental("log", v); }
  Value sqrt(const Value& v) { return unary("sqrt", v); }
  Value eq(const Value& a, const Value& b) { return compare("EQ", a, b); }
  Value ne(const Value& a, const Value& b) { return compare("NE", a, b); }
  Value lt(const Value& a, const Value& b) { return compare("LT", a, b); }
  Value le(const Value& a, const Value& b) { return compare("LE", a, b); }
  Value gt(const Value& a, const Value& b) { return compare("GT", a, b); }
  Value ge(const Value& a, const Value& b) { return compare("GE", a, b); }
  Value where(const Value& pred, const Value& a, const Value& b) { return select(pred, a, b); }
  Value relu(const Value& v) { return maximum(v, scalar_like(0, v)); }
  Value matmul(const Value& a, const Value& b);  // 2-D x 2-D
  // PyTorch reduction conventions: `dims` may be negative; empty = all dims.
  Value sum(const Value& v, const std::vector<int64_t>& dims, bool keepdim);
  // The sum over every dim but `dim`, kept as size 1 (weight norm's reductions).
  Value sum_except_dim(const Value& v, int64_t dim);
  Value mean(const Value& v, const std::vector<int64_t>& dims, bool keepdim);
  Value cat(const std::vector<Value>& values, int64_t dim);  // skips PyTorch's legacy empty 1-D inputs
  Value broadcast_like(const Value& v, const Value& like) { return broadcast_to(v, like.dims()); }
  Value fill(const Value& value, const Value& like) { return broadcast_like(value, like); }
  Value identity(const Value& v) { return v; }
  // unary elementwise primitives
  Value abs(const Value& v);    // unsigned and bool unchanged; the int minimum stays itself, as in PyTorch
  Value sign(const Value& v);   // (0 < v) - (v < 0): NaN gives 0 as in PyTorch; bool unchanged
  Value expm1(const Value& v) { return transcendental("exponential_minus_one", v); }
  Value log1p(const Value& v) { return transcendental("log_plus_one", v); }
  Value rsqrt(const Value& v) { return unary("rsqrt", v); }
  Value sin(const Value& v) { return unary("sine", v); }
  Value cos(const Value& v) { return unary("cosine", v); }
  Value tan(const Value& v) { return unary("tan", v); }
  Value tanh(const Value& v) { return transcendental("tanh", v); }
  Value atan2(const Value& a, const Value& b) { return binary("atan2", a, b); }
  Value sinh(const Value& v);
  Value cosh(const Value& v);
  Value sigmoid(const Value& v);
  Value erf(const Value& v);
  Value floor(const Value& v);  // floor/ceil/round/trunc leave integers unchanged
  Value ceil(const Value& v);
  Value round(const Value& v);  // half to even
  Value round_decimals(const Value& v, int64_t decimals);  // PyTorch's: round(v * 10^d) / 10^d, or for d < 0 round(v / 10^-d) * 10^-d
  Value trunc(const Value& v);
  Value isnan(const Value& v) { return ne(v, v); }
  Value isinf(const Value& v);  // false for integers
  Value isposinf(const Value& v);
  Value isneginf(const Value& v);
  Value signbit(const Value& v);  // the sign bit of floats (-0.0 and -NaN too); v < 0 for integers
  Value bitwise_not(const Value& v) { return unary("not", v); }
  // None: NaN -> 0, +inf -> the element type's largest finite value, -inf -> its lowest.
  Value nan_to_num(const Value& v, std::optional<double> nan, std::optional<double> posinf, std::optional<double> neginf);
  Value clamp(const Value& v, const std::optional<Value>& min, const std::optional<Value>& max);  // None: no bound

  // random primitives: `state` is a generator's (seed, offset) as tensor<2xui64>; results have
  // the shape and element type of `like`.
  Value uniform(const Value& state, const Value& like, double low, double high);
  Value normal(const Value& state, const Value& like, double mean, double std);
  Value bernoulli(const Value& state, const Value& like, double p);
  // nn (activations, softmax, losses) primitives
  Value softmax(const Value& v, int64_t dim);  // stable: subtracts the max along dim
  Value log_softmax(const Value& v, int64_t dim);
  Value gelu(const Value& v, const std::string& approximate);  // approximate: "none" | "tanh"
  Value gelu_backward(const Value& grad, const Value& v, const std::string& approximate);
  Value nn_pick(bool first, const Value& a, const Value& b) { return first ? a : b; }  // compile-time choice
  Value nn_loss_reduce(const Value& v, int64_t reduction);  // 0 none, 1 mean, 2 sum (over all dims)
  Value mse_loss_norm(const Value& like, int64_t reduction);  // 2/numel (mean) or 2, as a 0-d of like's type
  // Scaled dot-product attention without the [L, S] probabilities as a result (what PyTorch's flash
  // attention computes): q [B,H,L,E], k [B,H,S,E], v [B,H,S,Ev]; `mask` broadcasts to [B,H,L,S]
  // (added, or bool: true keeps); `causal` keeps key j <= query i; scale defaults to 1/sqrt(E). Like
  // CPU's kernel it has no dropout: a nonzero dropout_p fails.
  Value attention(const Value& q, const Value& k, const Value& v, const std::optional<Value>& mask, double dropout_p, bool causal, std::optional<double> scale);
  // Per query row [B,H,L]: the log of the sum of its exponentiated scores (0 where every key is masked).
  Value attention_logsumexp(const Value& q, const Value& k, const std::optional<Value>& mask, bool causal, std::optional<double> scale);
  // The gradient of attention() for q (which 0), k (1) or v (2), recomputing the probabilities from logsumexp.
  Value attention_grad(const Value& grad_out, const Value& q, const Value& k, const Value& v, const Value& out, const Value& logsumexp, const std::optional<Value>& mask, double dropout_p, bool causal, std::optional<double> scale, int64_t which);
  // reduction family primitives (PyTorch conventions: `dims` may be negative; empty = all dims)
  Value prod(const Value& v, const std::vector<int64_t>& dims, bool keepdim);
  Value amax(const Value& v, const std::vector<int64_t>& dims, bool keepdim);  // NaN propagates
  Value amin(const Value& v, const std::vector<int64_t>& dims, bool keepdim);
  // Truth of any/all elements over `dims` (over every dim where all_dims; empty dims otherwise = none).
  Value any(const Value& v, const std::vector<int64_t>& dims, bool keepdim, bool all_dims);
  Value all(const Value& v, const std::vector<int64_t>& dims, bool keepdim, bool all_dims);
  // hash_tensor's mode 0: the xor of the elements' bits as uint64 (floats widened to float64, integers
  // and booleans to int64 first, as CPU does); empty dims = all dims.
  Value hash_xor(const Value& v, const std::vector<int64_t>& dims, bool keepdim, int64_t mode);
  // int64 index of the first max/min (a NaN counts as the max and the min); empty dims = flattened.
  Value argmax(const Value& v, const std::vector<int64_t>& dims, bool keepdim);
  Value argmin(const Value& v, const std::vector<int64_t>& dims, bool keepdim);
  Value var(const Value& v, const std::vector<int64_t>& dims, double correction, bool keepdim);
  Value stddev(const Value& v, const std::vector<int64_t>& dims, double correction, bool keepdim);
  Value logsumexp(const Value& v, const std::vector<int64_t>& dims, bool keepdim);
  Value vector_norm(const Value& v, double ord, const std::vector<int64_t>& dims, bool keepdim);
  // Each tensor's vector_norm over all its dims, the root taken once over the N sums joined into one
  // vector (a `foreach: lists` lowering: a list primitive gives every result).
  std::vector<Value> foreach_vector_norm(const std::vector<Value>& tensors, double ord);
  Value cumsum(const Value& v, int64_t dim);
  Value cumprod(const Value& v, int64_t dim);

  // special-function primitives (specs/special.yaml): CHLO ops that XLA expands into StableHLO, and
  // Chebyshev series (Cephes' published coefficients). Operands broadcast; floats only.
  Value lgamma(const Value& v);
  Value digamma(const Value& v);
  Value polygamma(int64_t n, const Value& v);
  Value zeta(const Value& x, const Value& q);  // Hurwitz zeta
  Value erfc(const Value& v);
  Value erfcx(const Value& v);  // exp(x^2) erfc(x)
  Value erfinv(const Value& v);
  Value nextafter(const Value& a, const Value& b);
  Value acosh(const Value& v);
  Value asinh(const Value& v);
  Value atanh(const Value& v);
  Value bessel_i0e(const Value& v);  // exp(-|x|) I0(x)
  Value bessel_i1e(const Value& v);  // exp(-|x|) I1(x)
  // Bessel functions as CPU computes them (Cephes): kind "j0" "j1" "y0" "y1" (first and second kind),
  // "k0" "k1" (modified, second kind), "k0e" "k1e" (those times exp(x)), and "airy_ai" (Airy's Ai).
  Value bessel(const Value& v, const std::string& kind);
  // Orthogonal polynomials of degree trunc(n) (n < 0: 0), CPU's recurrences and closed forms; kind
  // "t" "u" "v" "w" (Chebyshev), "st" "su" "sv" "sw" (shifted Chebyshev), "h" "he" (Hermite),
  // "l" (Laguerre), "p" (Legendre). The recurrence is unrolled to degree 24: higher degrees give NaN
  // where CPU has no closed form for them.
  Value orthogonal_polynomial(const Value& x, const Value& n, const std::string& kind);
  // The regularized lower incomplete gamma function P(a, x), or (complement) Q(a, x) = 1 - P: Cephes'
  // series and continued fraction, unrolled to 40 terms.
  Value igamma(const Value& a, const Value& x, bool complement);
  Value logit(const Value& v, std::optional<double> eps);  // eps: clamp to [eps, 1 - eps] first
  // grad / (v (1 - v)); 0 outside [eps, 1 - eps], or without eps NaN outside [0, 1].
  Value logit_backward(const Value& grad, const Value& v, std::optional<double> eps);
  Value glu(const Value& v, int64_t dim);  // first half of dim times sigmoid of the second half
  Value glu_backward(const Value& grad, const Value& v, int64_t dim);
  Value channel_shuffle(const Value& v, int64_t groups);
  // Margin losses over input [C] or [N, C] (classes along the last dim) and their input gradients.
  // multi_margin: target holds one class per row; multilabel: target [N, C] holds each row's classes
  // up to the first -1 (is_target: the [N, C] 0/1 mask of those classes instead of the loss).
  Value multi_margin_loss(const Value& self, const Value& target, double p, double margin, const std::optional<Value>& weight, int64_t reduction);
  Value multi_margin_loss_backward(const Value& grad_output, const Value& self, const Value& target, double p, double margin, const std::optional<Value>& weight, int64_t reduction);
  Value multilabel_margin_loss(const Value& self, const Value& target, int64_t reduction, bool is_target);
  Value multilabel_margin_loss_backward(const Value& grad_output, const Value& self, const Value& target, int64_t reduction);
  // Each sub-tensor along dim with p-norm above maxnorm scaled to maxnorm / (norm + 1e-7).
  Value renorm(const Value& v, double p, int64_t dim, double maxnorm);  // dim 1 viewed as [groups, C/groups], transposed

  // binary primitives (specs/binary.yaml)
  // `v` rounded through the op's nominal dtype (bfloat16/float16 ops compute in float32): what CPU's
  // TensorIterator does to a Python scalar or 0-d operand of another dtype, and to some intermediates.
  Value nominal(const Value& v);
  Value power(const Value& a, const Value& b);  // integers: CPU's rules for negative exponents
  // a ** exponent for a compile-time exponent, with CPU's special cases (squares and cubes as
  // products, +-0.5 as sqrt/rsqrt, -1 and -2 as divisions): exact where pow's exp(y log x) is not.
  Value pow_scalar(const Value& a, double exponent);
  Value fmod(const Value& a, const Value& b) { return binary("remainder", a, b); }  // C: sign of the dividend
  Value remainder(const Value& a, const Value& b);  // Python: sign of the divisor
  Value div_rounded(const Value& a, const Value& b, const std::string& mode);  // mode "" | "trunc" | "floor"
  Value bitwise_and(const Value& a, const Value& b) { return binary("and", a, b); }
  Value bitwise_or(const Value& a, const Value& b) { return binary("or", a, b); }
  Value bitwise_xor(const Value& a, const Value& b) { return binary("xor", a, b); }
  Value fmax(const Value& a, const Value& b);  // the other operand where one is NaN
  Value fmin(const Value& a, const Value& b);
  Value hypot(const Value& a, const Value& b);
  Value copysign(const Value& a, const Value& b);
  Value xlogy(const Value& x, const Value& y);
  Value lerp(const Value& start, const Value& end, const Value& weight);

  // linalg primitives (specs/linalg.yaml): operands share an element type; integers contract exactly
  Value bmm(const Value& a, const Value& b);  // [B, n, k] x [B, k, m] -> [B, n, m]
  Value mv(const Value& a, const Value& v);  // [n, m] x [m] -> [n]
  Value dot(const Value& a, const Value& b);  // [n] . [n] -> 0-d
  // CPU's addbmm: beta * self (0 where beta is 0) plus alpha * each batch's product, one batch at a
  // time, rounding through the nominal dtype after each (bfloat16 accumulates in bfloat16 there).
  Value addbmm(const Value& self, const Value& batch1, const Value& batch2, const Value& beta, const Value& alpha);
  // indexing (gather / scatter, embedding, nll_loss) primitives. Indices may be any integer type.
  // Out-of-range (and negative) indices are not checked, as a compiled module cannot raise: gathers
  // clamp them into range, scatters drop their updates.
  Value index_select(const Value& v, int64_t dim, const Value& index);  // v's dims, dim resized to index's numel
  Value take_along(const Value& v, int64_t dim, const Value& index);  // torch.gather: index's shape
  // torch.scatter family along dim: src (0-d: broadcast) is cut to index's shape, then each element is
  // combined into v: reduce "" (replace) | "add" | "multiply" | "amax" | "amin".
  Value scatter_along(const Value& v, int64_t dim, const Value& index, const Value& src, const std::string& reduce);
  // scatter_reduce.two: reduce "sum" | "prod" | "mean" | "amax" | "amin"; include_self false: v's value
  // takes no part where an index points.
  Value scatter_reduce_along(const Value& v, int64_t dim, const Value& index, const Value& src, const std::string& reduce, bool include_self);
  // [num_weights, grad's last dim]: the rows of grad summed by index (rows at padding_idx dropped).
  Value embedding_backward(const Value& grad, const Value& indices, int64_t num_weights, int64_t padding_idx, bool scale_grad_by_freq);
  // embedding's max_norm (embedding_renorm_): each row of v [rows, D] that indices name and whose
  // norm_type-norm exceeds max_norm, scaled by max_norm / (norm + 1e-7) once, as CPU does.
  Value embedding_renorm(const Value& v, const Value& indices, double max_norm, double norm_type);
  // self: [C] or [N, C, ...] (classes along dim 1); target: self's shape without the class dim.
  Value nll_loss(const Value& self, const Value& target, const std::optional<Value>& weight, int64_t reduction, int64_t ignore_index);
  Value nll_loss_total_weight(const Value& self, const Value& target, const std::optional<Value>& weight, int64_t reduction, int64_t ignore_index);
  Value nll_loss_backward(const Value& grad_output, const Value& self, const Value& target, const std::optional<Value>& weight, int64_t reduction, int64_t ignore_index, const Value& total_weight);
  // normalization primitives (specs/normalization.yaml). Layer norm normalizes over the trailing
  // normalized_shape dims; its mean/rstd keep those dims as 1s. Group norm views input as
  // [N, group, C/group * HxW]; its mean/rstd are [N, group]. Variances are biased.
  Value layer_norm(const Value& input, const std::vector<int64_t>& normalized_shape, const std::optional<Value>& weight, const std::optional<Value>& bias, double eps);
  Value layer_norm_mean(const Value& input, const std::vector<int64_t>& normalized_shape);
  Value layer_norm_rstd(const Value& input, const std::vector<int64_t>& normalized_shape, double eps);  // 1/sqrt(var + eps)
  Value layer_norm_grad_input(const Value& grad_out, const Value& input, const std::vector<int64_t>& normalized_shape, const Value& mean, const Value& rstd, const std::optional<Value>& weight);
  Value layer_norm_grad_weight(const Value& grad_out, const Value& input, const std::vector<int64_t>& normalized_shape, const Value& mean, const Value& rstd);
  Value layer_norm_grad_bias(const Value& grad_out, const std::vector<int64_t>& normalized_shape);
  Value group_norm(const Value& input, const std::optional<Value>& weight, const std::optional<Value>& bias, int64_t N, int64_t C, int64_t HxW, int64_t group, double eps);
  Value group_norm_mean(const Value& input, int64_t N, int64_t C, int64_t HxW, int64_t group);
  Value group_norm_rstd(const Value& input, int64_t N, int64_t C, int64_t HxW, int64_t group, double eps);
  Value group_norm_grad_input(const Value& grad_out, const Value& input, const Value& mean, const Value& rstd, const std::optional<Value>& weight, int64_t N, int64_t C, int64_t HxW, int64_t group);
  Value group_norm_grad_weight(const Value& grad_out, const Value& input, const Value& mean, const Value& rstd, int64_t N, int64_t C, int64_t HxW, int64_t group);
  Value group_norm_grad_bias(const Value& grad_out, int64_t N, int64_t C, int64_t HxW);
  // shape primitives (specs/shape.yaml, specs/creation.yaml, sort/topk in specs/reduction.yaml).
  // Dims may be negative. Padding lists hold (before, after) pairs starting from the last dim.
  Value flip(const Value& v, const std::vector<int64_t>& dims);
  Value roll(const Value& v, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims);  // no dims: over the flattened tensor
  Value repeat(const Value& v, const std::vector<int64_t>& repeats);  // torch.Tensor.repeat (tiles)
  Value tril(const Value& v, int64_t diagonal);  // over the last two dims
  Value triu(const Value& v, int64_t diagonal);
  Value constant_pad(const Value& v, const std::vector<int64_t>& pad, const Value& value);  // negative pads crop
  // self with src written over self[start:end:step] along dim (start/end as in Python slicing:
  // negative counts from the end, clamped to the dim): torch.slice_scatter, slice_backward.
  Value slice_scatter(const Value& self, const Value& src, int64_t dim, int64_t start, int64_t end, int64_t step);
  // self with src written over self.select(dim, index): torch.select_scatter, select_backward.
  Value select_scatter(const Value& self, const Value& src, int64_t dim, int64_t index);
  // The gradients of slicing and select: grad placed in zeros of the input's sizes.
  Value slice_backward(const Value& grad, const std::vector<int64_t>& input_sizes, int64_t dim, int64_t start, int64_t end, int64_t step);
  Value select_backward(const Value& grad, const std::vector<int64_t>& input_sizes, int64_t dim, int64_t index);
  Value reflection_pad(const Value& v, const std::vector<int64_t>& padding);
  Value replication_pad(const Value& v, const std::vector<int64_t>& padding);
  // The gradient of a reflection/replication pad of `self` (its shape): grad's elements summed back.
  Value reflection_pad_backward(const Value& grad, const Value& self, const std::vector<int64_t>& padding);
  Value replication_pad_backward(const Value& grad, const Value& self, const std::vector<int64_t>& padding);
  // A stable sort along dim (NaN ranks above everything, as in PyTorch): the values, or (indices)
  // their int64 positions in v. topk: the first k of the sort (descending where largest).
  Value sort_along(const Value& v, int64_t dim, bool descending, bool indices);
  Value topk(const Value& v, int64_t k, int64_t dim, bool largest, bool indices);
  // Creation: arange's 1-D [ceil((end - start) / step)] in the op's nominal dtype's kind (integer
  // outputs: int64 from truncated start/step, as on CPU); linspace of `steps` between two 0-d values
  // (CPU's formula: from start up to the halfway point, from end after it); eye: a bool [n, m].
  Value arange(double start, double end, double step);
  Value linspace(const Value& start, const Value& end, int64_t steps);
  Value eye(int64_t n, int64_t m);

  // convolution primitives (specs/conv.yaml)
  // stablehlo.convolution. `dims` labels each dim of lhs, rhs and the result, in order, as three words:
  // b/f (batch/feature), i/o (input/output feature) and 0-9 (spatial dims), e.g. "bf01 oi01 bf01" (NCHW).
  // padding: a (low, high) pair per spatial dim, flattened; negative pads crop.
  Value convolution(const Value& lhs, const Value& rhs, const std::string& dims, const std::vector<int64_t>& window_strides, const std::vector<int64_t>& padding, const std::vector<int64_t>& lhs_dilation, const std::vector<int64_t>& rhs_dilation, int64_t feature_group_count, int64_t batch_group_count);
  Value reverse(const Value& v, const std::vector<int64_t>& dims);  // reversed along dims
  Value sum_except(const Value& v, int64_t dim);  // summed over every dim but dim (a conv's grad_bias)
  // PyTorch's convolution (aten::convolution_overrideable): input [N, C_in, *S]; weight [C_out, C_in/groups, *K],
  // or [C_in, C_out/groups, *K] where transposed; bias [C_out] or None.
  Value conv(const Value& input, const Value& weight, const std::optional<Value>& bias, const std::vector<int64_t>& stride, const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, bool transposed, const std::vector<int64_t>& output_padding, int64_t groups);
  // Its gradients with respect to input and weight (same arguments, plus the gradient of its result).
  Value conv_grad_input(const Value& grad_output, const Value& input, const Value& weight, const std::vector<int64_t>& stride, const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, bool transposed, int64_t groups);
  Value conv_grad_weight(const Value& grad_output, const Value& input, const Value& weight, const std::vector<int64_t>& stride, const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, bool transposed, int64_t groups);

  // advanced indexing primitives (specs/indexing.yaml, the advanced indexing block). `indices` is a
  // Tensor?[]: a None element is a Value whose id is -1 (a full slice); bool masks never get here
  // (the kernel expands them through nonzero first). Index tensors broadcast together; negative
  // indices wrap once; out-of-range ones are not checked: index clamps them, index_put drops them.
  Value index_tensor(const Value& v, const std::vector<Value>& indices);
  Value index_put(const Value& v, const std::vector<Value>& indices, const Value& values, bool accumulate);
  // Data-dependent shapes (spec `data_dependent: true`): a padded result of the largest size plus the
  // count of leading rows that are real. nonzero: [numel, rank] int64 coordinates of the nonzero
  // elements, row-major order; masked_select: [numel of the broadcast shape] elements where mask is set.
  Value nonzero_padded(const Value& v);
  Value masked_select_padded(const Value& v, const Value& mask);
  Value nonzero_count(const Value& v, const Value& like);  // 0-d int64: nonzeros of v broadcast with like
  // torch.unique of the flattened input, sorted (each NaN its own value, last): which 0 the values padded
  // to numel, 1 each element's int64 index among them (self's shape), 2 the int64 counts padded to
  // numel, 3 how many values there are (0-d int64).
  Value unique_sorted(const Value& self, int64_t which);
  Value isin(const Value& elements, const Value& test_elements, bool invert);  // bool, elements' shape
  // _embedding_bag (mode 0 sum, 1 mean, 2 max) over 1-D indices and offsets; rows at padding_idx count
  // for nothing; empty bags give 0. The four outputs, with CUDA's shapes (what Meta gives a device):
  Value embedding_bag(const Value& weight, const Value& indices, const Value& offsets, int64_t mode, const std::optional<Value>& per_sample_weights, bool include_last_offset, int64_t padding_idx);
  Value embedding_bag_offset2bag(const Value& indices, const Value& offsets, bool include_last_offset);  // [N]: each index's bag
  Value embedding_bag_size(const Value& indices, const Value& offsets, bool include_last_offset, int64_t padding_idx);  // [offsets numel]: non-padding count per bag
  Value embedding_bag_max_indices(const Value& weight, const Value& indices, const Value& offsets, int64_t mode, bool include_last_offset, int64_t padding_idx);  // max: [B, D] row picked (-1: empty bag); else [0]
  Value embedding_bag_dense_backward(const Value& grad, const Value& indices, const Value& offset2bag, const Value& bag_size, const Value& max_indices, int64_t num_weights, bool scale_grad_by_freq, int64_t mode, const std::optional<Value>& per_sample_weights, int64_t padding_idx);
  // _embedding_bag_backward: the dense backward; sparse (a sparse gradient) is not supported.
  Value embedding_bag_backward(const Value& grad, const Value& indices, const Value& offset2bag, const Value& bag_size, const Value& max_indices, int64_t num_weights, bool scale_grad_by_freq, int64_t mode, bool sparse, const std::optional<Value>& per_sample_weights, int64_t padding_idx);
  // masked_scatter: where mask (broadcast with v) is set, the next element of source in row-major order.
  Value masked_scatter(const Value& v, const Value& mask, const Value& source);
  Value embedding_bag_psw_backward(const Value& grad, const Value& weight, const Value& indices, const Value& offset2bag, int64_t padding_idx);  // [N]: grad[bag] . weight[index]

  // batch norm and dropout primitives (specs/normalization.yaml, specs/nn.yaml)
  Value channel_mean(const Value& v);  // [C]: mean of v [N, C, *] over every dim but 1
  Value channel_var(const Value& v, double correction);  // [C]: variance over every dim but 1
  Value per_channel(const Value& c, const Value& like);  // c [C] viewed as [1, C, 1, ...] and broadcast to like
  // Batch norm: input normalized with the per-channel mean and invstd [C], then scaled and shifted.
  Value batch_norm_apply(const Value& input, const std::optional<Value>& weight, const std::optional<Value>& bias, const Value& mean, const Value& invstd);
  // Batch norm's gradients given the statistics it normalized with (train: the batch's, which the
  // input's gradient flows through too): which 0 input, 1 weight, 2 bias.
  Value batch_norm_grad(const Value& grad_out, const Value& input, const std::optional<Value>& weight, const Value& mean, const Value& invstd, bool train, int64_t which);
  // input with elements zeroed with probability p and the rest scaled by 1/(1-p); dropout_mask: the kept ones (pred).
  // Both draw the same bits from `state`, so they agree.
  Value dropout(const Value& state, const Value& input, double p);
  Value dropout_mask(const Value& state, const Value& input, double p);
  // num_samples category indices (int64) per row of probs [n] or [rows, n] (unnormalized weights),
  // by Gumbel-max: with replacement an independent argmax per sample, without the top num_samples keys.
  Value multinomial(const Value& state, const Value& probs, int64_t num_samples, bool replacement);
  // Integers uniform in [low, high) in like's shape and element type (random_, randint).
  Value random_integers(const Value& state, const Value& like, int64_t low, int64_t high);
  // random_() without bounds, as CPU draws it: integers in [0, 2^mantissa digits] for floats and
  // [0, the type's max] for integers (int64: [0, 2^63 - 2], from 53 random bits).
  Value random_full_range(const Value& state, const Value& like);
  // A random permutation of 0..n-1 (int64): the order that sorts n uniform keys (randperm).
  Value random_permutation(const Value& state, int64_t n);

  // pooling / upsampling primitives (specs/pooling.yaml). The last `nd` dims are spatial (nd = the
  // length of output_size for adaptive pools and upsampling); list arguments of one element apply to
  // every spatial dim, an empty stride is the kernel size. Max pools give the max or (indices) the
  // int64 flat index within each spatial plane of the first max (the last NaN), as on CPU.
  Value max_pool(const Value& self, const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& stride, const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, bool ceil_mode, int64_t nd, bool indices);
  Value adaptive_max_pool(const Value& self, const std::vector<int64_t>& output_size, bool indices);
  // fractional_max_pool2d/3d: each (batch, plane)'s window starts come from its random samples
  // ([N, C, nd] in [0, 1)) by CPU's interval rule; then max / indices as max_pool.
  Value fractional_max_pool(const Value& self, const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& output_size, const Value& samples, int64_t nd, bool indices);
  // grad scatter-added into self's shape at the flat per-plane indices a max pool gave.
  Value max_pool_backward(const Value& grad, const Value& self, const Value& indices, int64_t nd);
  // divisor_override 0: none.
  Value avg_pool(const Value& self, const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& stride, const std::vector<int64_t>& padding, bool ceil_mode, bool count_include_pad, int64_t divisor_override, int64_t nd);
  Value avg_pool_backward(const Value& grad, const Value& self, const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& stride, const std::vector<int64_t>& padding, bool ceil_mode, bool count_include_pad, int64_t divisor_override, int64_t nd);
  Value adaptive_avg_pool(const Value& self, const std::vector<int64_t>& output_size);
  Value adaptive_avg_pool_backward(const Value& grad, const Value& self, int64_t nd);
  // Scales (None: from the sizes) in schema order, one per spatial dim (unused ones None); exact:
  // _upsample_nearest_exact's half-pixel rule. Backward ops take the full input_size.
  Value upsample_nearest(const Value& self, const std::vector<int64_t>& output_size, std::optional<double> s0, std::optional<double> s1, std::optional<double> s2, bool exact);
  Value upsample_nearest_backward(const Value& grad, const std::vector<int64_t>& input_size, std::optional<double> s0, std::optional<double> s1, std::optional<double> s2, bool exact);
  Value upsample_linear(const Value& self, const std::vector<int64_t>& output_size, bool align_corners, std::optional<double> s0, std::optional<double> s1, std::optional<double> s2);
  Value upsample_linear_backward(const Value& grad, const std::vector<int64_t>& input_size, bool align_corners, std::optional<double> s0, std::optional<double> s1, std::optional<double> s2);

  // special functions and op_db gap primitives (specs/special.yaml; runtime/hlo/special.cc)
  // base ** exponent (exp2, logspace, a Python number ** a tensor). Float32 in accurate mode: the
  // power of two of exponent * log2(base) split off exactly, so 2 ** n is exact and the rest within
  // ~2 ulps (a TPU's pow is exp(y log x) with its fast log).
  Value power_of(double base, const Value& exponent);
  Value count_nonzero(const Value& v, const std::vector<int64_t>& dims);  // int64; empty dims = all
  Value logaddexp(const Value& a, const Value& b);  // log(exp(a) + exp(b)) without overflow
  // index (1-D or 0-d; negatives wrap by like's size along dim) laid along dim of like's shape, dim resized to
  // index's numel: what makes index_add / index_copy / index_fill / index_reduce a scatter_along.
  Value expand_index(const Value& index, int64_t dim, const Value& like);
  // torch.take / Tensor.put_: v read / written as if flattened (negative indices wrap once).
  Value take(const Value& v, const Value& index);
  Value put(const Value& v, const Value& index, const Value& source, bool accumulate);
  Value diagonal(const Value& v, int64_t offset, int64_t dim1, int64_t dim2);  // a copy of torch.diagonal
  // The gradient of v.unfold(dim, size, step): each window's elements (grad's last dim) added back at
  // their positions along dim of a zero tensor of input_sizes.
  Value unfold_backward(const Value& grad, const std::vector<int64_t>& input_sizes, int64_t dim, int64_t size, int64_t step);
  // Integer gcd by CPU's Euclid (|a|, |b|, then (a, b) <- (b % a, a) until a is 0: the int minimum
  // stays negative as on CPU); lcm |a / gcd * b|, 0 where the gcd is 0. Operands broadcast.
  Value gcd(const Value& a, const Value& b);
  Value lcm(const Value& a, const Value& b);
  // cummax / cummin along dim: the running extreme (the last one where equal; NaN wins and stays) or
  // (indices) its int64 position.
  Value cumulative_extreme(const Value& v, int64_t dim, bool max, bool indices);
  Value logcumsumexp(const Value& v, int64_t dim);
  // The k-th smallest (1-based; NaN largest) along dim, or (indices) its position.
  Value kthvalue(const Value& v, int64_t k, int64_t dim, bool keepdim, bool indices);
  // The most frequent value along dim (the smallest of a tie) or, with `indices`, its last position.
  Value mode(const Value& v, int64_t dim, bool keepdim, bool indices);
  // The lower median along dim (all_dims: of every element, a 0-d result); a NaN in a row makes it NaN
  // unless ignore_nan (nanmedian); indices: its position.
  Value median(const Value& v, int64_t dim, bool all_dims, bool keepdim, bool ignore_nan, bool indices);

  // op_db leftovers (specs: binary, creation, reduction, pooling, nn, indexing, normalization;
  // runtime/hlo/opdb_leftovers.cc)
  Value empty_1d(const Value& like);  // [0] of like's element type: a result CPU leaves empty
  Value zeros(const std::vector<int64_t>& size);  // float32 zeros (a creation op's result converts them)
  // a << b or a >> b (arithmetic for signed types); a shift by a negative amount or by the width or
  // more gives 0, or for a signed >> the sign, as on CPU.
  Value bitwise_shift(const Value& a, const Value& b, bool left);
  Value tri_indices(int64_t row, int64_t col, int64_t offset, bool upper);  // [2, n] int64, row-major
  // int64 insertion points of values in the last dim of sorted (1-D: shared by every value; else
  // matching leading dims); right or side "right": after equal elements; sorter: sorted's order.
  Value search_sorted(const Value& sorted, const Value& values, bool right, const std::string& side, const std::optional<Value>& sorter);
  // bins equal-width counts over [min, max] (min == max: the data's extremes), of v's element type.
  Value histc(const Value& v, int64_t bins, const Value& min, const Value& max);
  // torch.histogram: `bins` + 1 evenly spaced edges over `range` (empty: the data's min and max), and
  // the counts (or summed weights; density: divided by the total and the bin widths) over sorted edges.
  Value histogram_edges(const Value& v, int64_t bins, const std::vector<double>& range);
  Value histogram_counts(const Value& v, const Value& edges, const std::optional<Value>& weight, bool density);
  // CTC loss of log_probs [T, N, C] against targets ([N, S] padded, or 1-D concatenated), lengths
  // per batch element: which 0 the negative log likelihood [N], 1 log alpha [N, T, 2 * max target + 1]
  // (-inf where CPU leaves it unwritten). The backward gives log_probs' gradient (zero_infinity: 0
  // where the likelihood is 0).
  Value ctc_loss(const Value& log_probs, const Value& targets, const std::vector<int64_t>& input_lengths, const std::vector<int64_t>& target_lengths, int64_t blank, int64_t which);
  Value ctc_loss_backward(const Value& grad, const Value& log_probs, const Value& targets, const std::vector<int64_t>& input_lengths, const std::vector<int64_t>& target_lengths, const Value& neg_log_likelihood, const Value& log_alpha, int64_t blank, bool zero_infinity);
  // torch.segment_reduce along axis by lengths ([..., S]: data's dims before axis, then S) or offsets
  // ([..., S + 1]); reduce sum | mean | max | min | prod from initial, else the reduction's identity (an
  // empty mean without initial is NaN). runtime/hlo/segment.cc. The backward gives data's gradient
  // (max/min: shared among the elements equal to the result; prod: initial times the segment's others).
  Value segment_reduce(const Value& data, const std::string& reduce, const std::optional<Value>& lengths, const std::optional<Value>& offsets, int64_t axis, std::optional<double> initial);
  Value segment_reduce_backward(const Value& grad, const Value& output, const Value& data, const std::string& reduce, const std::optional<Value>& lengths, const std::optional<Value>& offsets, int64_t axis, std::optional<double> initial);
  // self's elements placed at their flat per-plane indices in zeros of [..., *output_size].
  Value max_unpool(const Value& self, const Value& indices, const std::vector<int64_t>& output_size);
  // nn.functional.unfold / fold: [N, C, H, W] <-> [N, C * kh * kw, L] (overlaps summed by col2im).
  Value im2col(const Value& self, const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& dilation, const std::vector<int64_t>& padding, const std::vector<int64_t>& stride);
  Value col2im(const Value& self, const std::vector<int64_t>& output_size, const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& dilation, const std::vector<int64_t>& padding, const std::vector<int64_t>& stride);
  // p-norm distances between the rows of x1 [..., P, M] and x2 [..., R, M]; pdist: between the rows
  // i < j of v [N, M]. The backward ops give the gradient with respect to x1 / v.
  Value cdist(const Value& x1, const Value& x2, double p);
  Value cdist_backward(const Value& grad, const Value& x1, const Value& x2, double p, const Value& dist);
  Value pdist(const Value& v, double p);
  Value pdist_backward(const Value& grad, const Value& v, double p, const Value& dist);
  // [size, rank] int64: nonzero's rows, cut to size or filled with fill_value.
  Value nonzero_static(const Value& v, int64_t size, int64_t fill_value);
  // Bicubic upsampling of [N, C, H, W] (A = -0.75, edges clamped, CPU's source-index rule) and its
  // gradient, as an interpolation matrix per spatial dim.
  Value upsample_bicubic(const Value& self, const std::vector<int64_t>& output_size, bool align_corners, std::optional<double> scales_h, std::optional<double> scales_w);
  Value upsample_bicubic_backward(const Value& grad, const std::vector<int64_t>& input_size, bool align_corners, std::optional<double> scales_h, std::optional<double> scales_w);
  // Anti-aliased bilinear / bicubic resize (interpolate(..., antialias=True)): downscaling averages
  // over the scale's footprint instead of sampling.
  Value upsample_antialiased(const Value& self, const std::vector<int64_t>& output_size, bool align_corners, std::optional<double> scales_h, std::optional<double> scales_w, bool bicubic);
  Value upsample_antialiased_backward(const Value& grad, const std::vector<int64_t>& input_size, bool align_corners, std::optional<double> scales_h, std::optional<double> scales_w, bool bicubic);
  // grid_sample of input [N, C, *spatial] (2-d or 3-d) at grid [N, *out, nd] ((x, y[, z]) in [-1, 1]):
  // interpolation 0 bilinear, 1 nearest, 2 bicubic (2-d only); padding 0 zeros, 1 border,
  // 2 reflection; CPU's coordinate rules. The backward gives (which) 0 the input's gradient, 1 the grid's.
  Value grid_sample(const Value& input, const Value& grid, int64_t interpolation, int64_t padding, bool align_corners);
  Value grid_sample_backward(const Value& grad, const Value& input, const Value& grid, int64_t interpolation, int64_t padding, bool align_corners, int64_t which);

  // linalg decompositions and solvers (specs/linalg.yaml; runtime/hlo/linalg_decomp.cc). Matrices are
  // the last two dims; leading dims are batch dims (broadcast between operands as in PyTorch). Loops
  // are stablehlo.while loops over one matrix step, so module size does not grow with the matrix.
  // A general loop: `init` are the loop-carried values; `condition` builds the 0-d i1 that keeps it
  // going and `body` the next values (same types), each from the region's own block arguments.
  std::vector<Value> while_loop(const std::vector<Value>& init, const std::function<Value(Builder&, const std::vector<Value>&)>& condition, const std::function<std::vector<Value>(Builder&, const std::vector<Value>&)>& body);
  Value identity_like(const Value& a);  // the identity in a's shape (batch dims too) and element type
  Value matrix_transpose(const Value& a);  // a.mT: the last two dims swapped
  // op(A) X = B (left) or X op(A) = B, A triangular (lower or upper; op: transposed where transpose_a).
  Value triangular_solve(const Value& a, const Value& b, bool left, bool lower, bool transpose_a, bool unit_diagonal);
  // Cholesky factor of the triangle `upper` names: L (A = L L^T) or U (A = U^T U); which 1: LAPACK's
  // info (int32: the order of the first leading minor that is not positive definite, else 0).
  Value cholesky(const Value& a, bool upper, int64_t which);
  // LU with partial pivoting (LAPACK getrf; Gaussian elimination where not pivot): which 0 the packed
  // LU, 1 the int32 1-based pivots, 2 info.
  Value lu_factor(const Value& a, bool pivot, int64_t which);
  // lu_unpack: which 0 the permutation matrix P, 1 L (unit lower), 2 U; an output not unpacked is empty.
  Value lu_unpack(const Value& lu, const Value& pivots, bool unpack_data, bool unpack_pivots, int64_t which);
  // X with A X = B (left) or X A = B, A^T where adjoint, from A's packed LU and pivots.
  Value lu_solve(const Value& lu, const Value& pivots, const Value& b, bool left, bool adjoint);
  // From a packed LU and pivots: which 0 det, 1 the sign of det, 2 log|det|.
  Value lu_det(const Value& lu, const Value& pivots, int64_t which);
  // linalg.solve's B where it is a (batch of) vector(s): B as a column, and the column back.
  Value solve_rhs(const Value& a, const Value& b, bool left);
  Value solve_result(const Value& a, const Value& b, const Value& x, bool left);
  // Householder QR (LAPACK geqrf): which 0 the packed reflectors and R, 1 tau.
  Value geqrf(const Value& a, int64_t which);
  // C multiplied by Q = H_0 ... H_{k-1} from reflectors (LAPACK ormqr): Q C, Q^T C, C Q or C Q^T.
  Value ormqr(const Value& reflectors, const Value& tau, const Value& c, bool left, bool transpose);
  Value householder_product(const Value& reflectors, const Value& tau);  // LAPACK orgqr: Q's first n columns
  // linalg.qr: which 0 Q, 1 R; mode "reduced" | "complete" | "r" (Q empty).
  Value qr(const Value& a, const std::string& mode, int64_t which);
  // Symmetric eigendecomposition from the triangle uplo ("L" | "U") names, by cyclic Jacobi:
  // which 0 eigenvalues ascending, 1 eigenvectors as columns (empty unless compute_v).
  Value eigh(const Value& a, const std::string& uplo, bool compute_v, int64_t which);
  // SVD by one-sided Jacobi: which 0 U, 1 S (descending), 2 Vh; U and Vh empty unless compute_uv.
  Value svd(const Value& a, bool full_matrices, bool compute_uv, int64_t which);
  Value matrix_exp(const Value& a);  // scaling and squaring with a [13/13] Pade approximant
  Value cross(const Value& a, const Value& b, int64_t dim);  // a x b along dim (size 3), broadcast

  // complex and FFT primitives (specs/complex.yaml; runtime/hlo/complex.cc)
  Value real_part(const Value& v);  // a real v is its own real part
  Value imag_part(const Value& v);  // zeros for a real v
  Value complex_from(const Value& re, const Value& im);  // operands broadcast; parts of one real float type
  Value conj_of(const Value& v);  // complex conjugate; a real v unchanged
  Value angle(const Value& v);  // atan2(imag, real); a real v gives 0, pi where negative, NaN stays NaN
  // PyTorch's _fft_c2c / _fft_r2c / _fft_c2r over `dims` (any order, negative allowed; one stablehlo.fft
  // per dim along the last axis). normalization: 0 none, 1 by 1/sqrt(n), 2 by 1/n (n: the signal's numel).
  Value fft_c2c(const Value& v, const std::vector<int64_t>& dims, int64_t normalization, bool forward);
  Value fft_r2c(const Value& v, const std::vector<int64_t>& dims, int64_t normalization, bool onesided);
  Value fft_c2r(const Value& v, const std::vector<int64_t>& dims, int64_t normalization, int64_t last_dim_size);

  // --- Views of a storage (the storage model) ---
  // Reads the elements a view sees from `storage` (any shape; row-major order).
  Value read_view(const Value& storage, const ViewGeometry& view);
  // Returns the new storage contents after writing `value` through `view`. `storage` is the old
  // contents, or nullptr where nothing needs to be kept (a fresh or lazy storage).
  Value write_view(const Value* storage, const TensorType& storage_type, const Value& value,
                   const ViewGeometry& view);

  // A constant tensor from its element literals ("[1, 2]"; pooling block).
  Value dense_constant(const std::string& elements, const TensorType& type);

  // The most counter values (of a random state parameter) one random draw consumed since the last
  // restart: a call must advance its generator past them so that the next call's stream does not
  // overlap. Restarted per op (a module of many ops draws each op's from its own state).
  int64_t random_counters() const { return random_counters_; }
  void restart_random_counters() { random_counters_ = 0; }

  // Fused eager mode's replay of a call it has emitted before at the same point of a block (the same
  // ops before it, so the same builder state): what the call added, kept from its first emission,
  // is added again without emitting it. The parameters it asked for are asked for again (they take
  // the recorded ids: advance_ids first), then replay() adds its body and the rest of its state.
  struct Mark {
    size_t body = 0;
    int next_id = 0;
  };
  struct Emitted {
    std::string body;
    int next_id = 0;
    std::vector<std::pair<int, Value>> widened;
    std::vector<int> accumulated;
    std::vector<std::pair<int, Value>> merged_rows;
    std::vector<std::pair<int, Value>> reshaped_from;
    ElementType nominal_element = ElementType::F64;
    int64_t random_counters = 0;
  };
  Mark mark() const { return Mark{body_.size(), next_id_}; }
  Emitted emitted_since(const Mark& mark) const;
  int next_id() const { return next_id_; }
  void advance_ids(int next_id);
  void replay(const Emitted& emitted);

  // Prints the module whose function returns `results`.
  // The module text. `aliases`: (parameter, result) pairs whose result may reuse the parameter's
  // buffer (input/output aliasing: a donated input is updated in place).
  std::string finish(const std::vector<Value>& results, const std::vector<std::pair<int, int>>& aliases = {}) const;

  // A compiled graph joining a fused block: this builder's function (as finish() would print it)
  // as a private function `name` of another module, and a call of such a function, whose
  // definition the module gains once (XLA inlines the call: one module, fused across graphs).
  std::string function_text(const std::string& name, const std::vector<Value>& results) const;
  std::vector<Value> call_function(const std::string& name, const std::string& definition,
                                   const std::vector<Value>& args, const std::vector<TensorType>& result_types);

 private:
  Value emit(const std::string& op_and_operands, const TensorType& result_type);
  // stablehlo.fft of `type` (FFT IFFT RFFT IRFFT) over v's last dim, giving `length` points.
  Value fft_last(const Value& v, const char* type, int64_t length);
  std::vector<Value> emit_multi(const std::string& op_and_operands, const std::vector<TensorType>& result_types);
  // a and b through a stablehlo.optimization_barrier: XLA cannot fold what made them into their user.
  std::pair<Value, Value> barrier(const Value& a, const Value& b);
  // Uniform floats in [0, 1) of `dims`, in F32 (or F64 for an F64 `element`), from random bits.
  Value uniform01(const Value& state, const std::vector<int64_t>& dims, ElementType element);
  std::string name(const Value& v) const;
  Value flat(const Value& v);
  Value view_indices(const ViewGeometry& view);
  // numpy broadcasting: the common shape of the operands (throws if there is none).
  std::vector<int64_t> broadcast_shape(const std::vector<const Value*>& operands, const char* op) const;
  // 64-bit integer division (the quotient, or the remainder) as a loop: binary() routes it here.
  Value divide_64(const Value& a, const Value& d, bool remainder);
  // Max along one dim (may be negative), kept as size 1: the shift that keeps softmax stable.
  Value max_along(const Value& v, int64_t dim);
  // attention()'s scaled, masked scores [B,H,L,S], in q's element type.
  Value attention_scores(const Value& q, const Value& k, const std::optional<Value>& mask, bool causal,
                         std::optional<double> scale);
  // A CHLO op (which XLA expands) over operands broadcast to one shape, of their element type.
  Value chlo(const char* op, std::vector<Value> operands);
  std::vector<int64_t> normalize_dims(const std::vector<int64_t>& dims, int rank) const;

  // A float32 transcendental (stablehlo op name) with the accuracy the numerics ask for.
  Value transcendental(const char* op, const Value& v);
  // Whether v's math takes the accurate float32 formulations (float32, accurate mode, not bfloat16).
  bool accurate_f32(const Value& v) const;
  // The precision_config of a contraction of `element`'s operands: "HIGHEST", "HIGH" or "" (DEFAULT).
  // float16 operands never reach a contraction: dot_general and convolution widen them.
  std::string precision_of(ElementType element) const;

  Numerics numerics_;
  ElementType nominal_element_ = ElementType::F64;  // never narrower than a value: no rounding
  int64_t random_counters_ = 0;
  std::vector<Value> parameters_;
  std::string body_;
  int next_id_ = 0;
  std::vector<std::pair<std::string, std::string>> functions_;  // call_function's: (name, definition), in order met
  // float32 values converted from bfloat16 or float16 (id -> the narrow value): a dot_general of two
  // widened from bfloat16 takes the bfloat16 operands with a float32 result, as a TPU's MXU does
  // natively (the same products and float32 sums, without the widened copies); two widened from
  // float16 stay float32 behind a barrier, at HIGHEST (dot_general says why).
  std::unordered_map<int, Value> widened_;
  // float32 sums and products of a reduce (and reshapes or transposes of them): converted to bfloat16
  // or float16, they are rounded on their bits first (convert says why).
  std::unordered_set<int> accumulated_;
  // Matrices that merge the leading dims of a higher-rank value (id -> that value): PyTorch's linear
  // and matmul fold [..., K] inputs into [M, K] around mm. A contraction over K takes the higher-rank
  // value itself, converts and reshapes go through it, so that XLA sees jax's [B, L, K] x [K, N]
  // (on a v5e the folded form left the 110M Llama's residual stream transposed, with a relayout copy
  // around each projection: 50 copies against jax's 2).
  std::unordered_map<int, Value> merged_rows_;
  // Reshapes (id -> the value reshaped, itself no reshape): a reshape of a reshape reshapes the first
  // value, so that rows merged through a flat storage read ([B, L, H, D] -> [B*L*H*D] -> [B*L, H*D], the
  // attention output before its projection) are seen as merged from [B, L, H*D].
  std::unordered_map<int, Value> reshaped_from_;
  // A float32 value rounded to the significand of `element` (bfloat16 or float16), still float32.
  Value round_significand_on_bits(const Value& v, ElementType element);
};

}  // namespace torchtpu::rt
