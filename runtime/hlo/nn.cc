// Builder nn family: softmax, gelu, loss reduction, layer/group/batch norm statistics and gradients, dropout.
#include "hlo/hlo_builder.h"

#include "hlo/builder_internal.h"

namespace torchtpu::rt {

using namespace builder_internal;

Value Builder::softmax(const Value& v, int64_t dim) {
  Value e = exp(sub(v, max_along(v, dim)));
  return div(e, sum(e, {dim}, true));
}

Value Builder::log_softmax(const Value& v, int64_t dim) {
  Value shifted = sub(v, max_along(v, dim));
  return sub(shifted, log(sum(exp(shifted), {dim}, true)));
}

// --- attention (specs/nn.yaml: _scaled_dot_product_flash_attention_for_cpu and its backward) ---
// Query head h reads key/value head h / G where there are G query heads per key/value head (sdpa's
// enable_gqa, which CPU's kernel takes too): the contractions group the query heads as [B, Hk, G, ...]
// instead of repeating the keys and values.

namespace {

void check_attention(const Value& q, const Value& k, const Value& v, double dropout_p) {
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4) fail("attention: query, key and value are [B, H, L, E]");
  if (k.dims()[1] != v.dims()[1] || q.dims()[1] % k.dims()[1] != 0) {
    fail("attention: the query heads are a multiple of the key/value heads");
  }
  // CPU's flash attention has no dropout either (sdpa takes the math path for a nonzero dropout_p).
  if (dropout_p != 0) fail("scaled_dot_product_attention_flash_attention: Currently do not support dropout > 0");
}

double attention_scale(const Value& q, std::optional<double> scale) {
  return scale.value_or(1.0 / std::sqrt(static_cast<double>(q.dims().at(3))));
}

// [B, Hq, X, Y] as [B, Hk, G, X, Y], a contraction's operand (a reshaped half value is narrow again).
Value grouped(Builder& b, const Value& x, int64_t kv_heads) {
  const auto& d = x.dims();
  return b.contraction_operand(b.reshape(x, {d[0], kv_heads, d[1] / kv_heads, d[2], d[3]}));
}

// a [B, Hq, L, X] . kv [B, Hk, S, X] over X: [B, Hq, L, S] (the scores; dO . V).
Value per_query(Builder& b, const Value& a, const Value& kv) {
  const int64_t kv_heads = kv.dims()[1];
  if (kv_heads == a.dims()[1]) return b.dot_general(a, kv, {0, 1}, {0, 1}, {3}, {3});
  const auto& d = a.dims();
  return b.reshape(b.dot_general(grouped(b, a, kv_heads), kv, {0, 1}, {0, 1}, {4}, {3}), {d[0], d[1], d[2], kv.dims()[2]});
}

// w [B, Hq, L, S] . kv [B, Hk, S, X] over S: [B, Hq, L, X] (P . V; dS . K).
Value weighted(Builder& b, const Value& w, const Value& kv) {
  const int64_t kv_heads = kv.dims()[1];
  if (kv_heads == w.dims()[1]) return b.dot_general(w, kv, {0, 1}, {0, 1}, {3}, {2});
  const auto& d = w.dims();
  return b.reshape(b.dot_general(grouped(b, w, kv_heads), kv, {0, 1}, {0, 1}, {4}, {2}), {d[0], d[1], d[2], kv.dims()[3]});
}

// w [B, Hq, L, S] . a [B, Hq, L, X] over L and a key/value head's query heads: [B, Hk, S, X] (P^T . dO; dS^T . Q).
Value per_key(Builder& b, const Value& w, const Value& a, int64_t kv_heads) {
  if (kv_heads == w.dims()[1]) return b.dot_general(w, a, {0, 1}, {0, 1}, {2}, {2});
  return b.dot_general(grouped(b, w, kv_heads), grouped(b, a, kv_heads), {0, 1}, {0, 1}, {2, 3}, {2, 3});
}

}  // namespace

Value Builder::contraction_operand(const Value& v) {
  const bool half = nominal_element_ == ElementType::BF16 || nominal_element_ == ElementType::F16;
  if (!half || v.element() != ElementType::F32) return v;
  return convert(convert(v, nominal_element_), ElementType::F32);  // dot_general takes the narrow operand
}

Value Builder::attention_scores(const Value& q, const Value& k, const std::optional<Value>& mask, bool causal,
                                std::optional<double> scale) {
  Value s = per_query(*this, q, k);
  s = mul(s, scalar_like(attention_scale(q, scale), s));
  const Value minus_inf = scalar_like(-HUGE_VAL, s);
  if (mask) {
    s = mask->element() == ElementType::Pred ? select(broadcast_to(*mask, s.dims()), s, minus_inf)
                                             : add(s, convert(*mask, s.element()));
  }
  if (causal) {  // top left aligned, as CPU's: query i sees keys 0..i
    const TensorType grid{ElementType::S32, {q.dims().at(2), k.dims().at(2)}};
    s = select(broadcast_to(ge(iota(grid, 0), iota(grid, 1)), s.dims()), s, minus_inf);
  }
  return s;
}

Value Builder::attention(const Value& q, const Value& k, const Value& v, const std::optional<Value>& mask,
                         double dropout_p, bool causal, std::optional<double> scale) {
  check_attention(q, k, v, dropout_p);
  const Value s = attention_scores(q, k, mask, causal, scale);
  // Shifted by the row max (0 for a row with every key masked, whose result is 0 as CPU's).
  const Value m = max_along(s, 3);
  const Value e = exp(sub(s, select(eq(m, scalar_like(-HUGE_VAL, m)), scalar_like(0, m), m)));
  // The sum divides the [L, Ev] products, not the [L, S] exponentials (CPU's order too). It is the
  // product with a column of ones beside the values: a separate row sum was a third pass over the
  // [L, S] scores on a TPU (XLA fuses no reduction into a product's epilogue).
  const auto& vd = v.dims();
  const Value ones = full(1, TensorType{v.element(), {vd[0], vd[1], vd[2], 1}});
  const Value both = weighted(*this, contraction_operand(e), contraction_operand(concatenate({v, ones}, 3)));
  const auto& bd = both.dims();
  const Value products = slice(both, {0, 0, 0, 0}, {bd[0], bd[1], bd[2], vd[3]}, {1, 1, 1, 1});
  const Value total = slice(both, {0, 0, 0, vd[3]}, {bd[0], bd[1], bd[2], vd[3] + 1}, {1, 1, 1, 1});
  return div(products, select(eq(total, scalar_like(0, total)), scalar_like(1, total), total));
}

Value Builder::attention_logsumexp(const Value& q, const Value& k, const std::optional<Value>& mask, bool causal,
                                   std::optional<double> scale) {
  const Value s = attention_scores(q, k, mask, causal, scale);
  const Value m = max_along(s, 3);
  const Value no_key = eq(m, scalar_like(-HUGE_VAL, m));
  const Value shift = select(no_key, scalar_like(0, m), m);
  const Value lse = add(log(sum(exp(sub(s, shift)), {3}, true)), shift);
  const auto& d = q.dims();
  return reshape(select(no_key, scalar_like(0, lse), lse), {d[0], d[1], d[2]});  // 0 without keys, as CPU
}

Value Builder::attention_grad(const Value& grad_out_in, const Value& q, const Value& k, const Value& v,
                              const Value& out_in, const Value& logsumexp, const std::optional<Value>& mask,
                              double dropout_p, bool causal, std::optional<double> scale, int64_t which) {
  check_attention(q, k, v, dropout_p);
  // In the scores' type (a half grad_out widened, so that its products still take it narrow).
  const Value grad_out = convert(grad_out_in, q.element()), out = convert(out_in, q.element());
  if (which < 0 || which > 2) fail("attention_grad: which is 0 (query), 1 (key) or 2 (value)");
  const Value s = attention_scores(q, k, mask, causal, scale);
  const auto& d = s.dims();
  const Value p = exp(sub(s, convert(reshape(logsumexp, {d[0], d[1], d[2], 1}), s.element())));
  const int64_t kv_heads = k.dims()[1];
  if (which == 2) return per_key(*this, contraction_operand(p), grad_out, kv_heads);
  const Value dp = per_query(*this, grad_out, v);
  const Value ds = contraction_operand(mul(p, sub(dp, sum(mul(grad_out, out), {3}, true))));
  const Value g = which == 0 ? weighted(*this, ds, k) : per_key(*this, ds, q, kv_heads);
  return mul(g, scalar_like(attention_scale(q, scale), g));
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

Value Builder::batch_norm_apply(const Value& input, const std::optional<Value>& weight, const std::optional<Value>& bias,
                                const Value& mean, const Value& invstd) {
  const Value normalized = mul(sub(input, per_channel(mean, input)), per_channel(invstd, input));
  const Value scaled = weight ? mul(normalized, per_channel(*weight, input)) : normalized;
  return bias ? add(scaled, per_channel(*bias, input)) : scaled;
}

Value Builder::batch_norm_grad(const Value& grad_out, const Value& input, const std::optional<Value>& weight,
                               const Value& mean, const Value& invstd, bool train, int64_t which) {
  const Value x_hat = mul(sub(input, per_channel(mean, input)), per_channel(invstd, input));
  if (which == 1) return sum_except(mul(grad_out, x_hat), 1);
  if (which == 2) return sum_except(grad_out, 1);
  const Value g = weight ? mul(grad_out, per_channel(*weight, input)) : grad_out;
  if (!train) return mul(g, per_channel(invstd, input));
  const Value centered = sub(sub(g, per_channel(channel_mean(g), input)),
                             mul(x_hat, per_channel(channel_mean(mul(g, x_hat)), input)));
  return mul(centered, per_channel(invstd, input));
}

Value Builder::dropout(const Value& state, const Value& input, double p) {
  if (p >= 1) return full(0, input.type);
  return mul(mul(input, convert(dropout_mask(state, input, p), input.element())), scalar_like(1.0 / (1.0 - p), input));
}

Value Builder::dropout_mask(const Value& state, const Value& input, double p) {
  Value u = uniform01(state, input.dims(), ElementType::F32);
  return ge(u, constant(p, ElementType::F32));
}

}  // namespace torchtpu::rt
