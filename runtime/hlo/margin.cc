// Builder margin-loss family (multi_margin_loss, multilabel_margin_loss and their gradients) and
// renorm: ops over [N, C] rows whose class indices pick elements of the row.
#include "hlo/hlo_builder.h"

#include <cmath>
#include <string>
#include <vector>

#include "hlo/builder_internal.h"

namespace torchtpu::rt {

using namespace builder_internal;

namespace {

// input [C] or [N, C] as [N, C].
Value as_rows(Builder& b, const Value& v) {
  if (v.rank() == 2) return v;
  const int64_t c = v.rank() == 0 ? 1 : v.dims().back();
  return b.reshape(v, {v.type.numel() / std::max<int64_t>(c, 1), c});
}

// [N, C] pred: column c equals target[n] (target: N integers, any shape).
Value class_mask(Builder& b, const Value& target, int64_t n, int64_t c) {
  const Value t = b.reshape(b.convert(target, ElementType::S64), {n, 1});
  return b.eq(b.iota(TensorType{ElementType::S64, {n, c}}, 1), t);
}

Value row_sum(Builder& b, const Value& v) { return b.sum(v, {1}, false); }

struct MultiMargin {
  Value onehot;  // [N, C]: the target class
  Value active;  // [N, C]: margin - x[target] + x[c] > 0, c not the target
  Value z;  // [N, C]: margin - x[target] + x[c]
  std::optional<Value> w_target;  // [N, 1]: weight[target], where there is a weight
  Value scale;  // [N, 1]: weight[target] / C (1 / C without weight)
};

MultiMargin multi_margin(Builder& b, const Value& self, const Value& target, double margin,
                         const std::optional<Value>& weight) {
  const Value x = as_rows(b, self);
  const int64_t n = x.dims()[0], c = x.dims()[1];
  MultiMargin m;
  m.onehot = class_mask(b, target, n, c);
  const Value zero = b.scalar_like(0, x);
  const Value x_target = b.reshape(row_sum(b, b.select(m.onehot, x, zero)), {n, 1});
  m.z = b.add(b.sub(b.scalar_like(margin, x), x_target), x);
  m.active = b.bitwise_and(b.gt(m.z, zero), b.bitwise_not(m.onehot));
  m.scale = b.full(1.0 / static_cast<double>(c), TensorType{x.element(), {n, 1}});
  if (weight) {
    const Value w = b.reshape(*weight, {1, c});
    const Value w_target = b.reshape(row_sum(b, b.select(m.onehot, b.broadcast_to(w, {n, c}), zero)), {n, 1});
    m.w_target = w_target;
    m.scale = b.mul(w_target, m.scale);
  }
  return m;
}

}  // namespace

Value Builder::multi_margin_loss(const Value& self, const Value& target, double p, double margin,
                                 const std::optional<Value>& weight, int64_t reduction) {
  if (p != 1 && p != 2) fail("multi_margin_loss: p must be 1 or 2");
  const MultiMargin m = multi_margin(*this, self, target, margin, weight);
  const Value h = p == 1 ? m.z : mul(m.z, m.z);
  // CPU's order: weight[target] times each term, the sum, then / C.
  const Value c = scalar_like(static_cast<double>(m.z.dims()[1]), m.z);
  const Value terms = m.w_target ? mul(h, *m.w_target) : h;
  const Value per_row = div(row_sum(*this, select(m.active, terms, scalar_like(0, h))), c);
  if (reduction == 0) return reshape(per_row, target.dims());
  return nn_loss_reduce(per_row, reduction);
}

Value Builder::multi_margin_loss_backward(const Value& grad_output, const Value& self, const Value& target, double p,
                                          double margin, const std::optional<Value>& weight, int64_t reduction) {
  const MultiMargin m = multi_margin(*this, self, target, margin, weight);
  const int64_t n = m.z.dims()[0];
  const Value zero = scalar_like(0, m.z);
  const Value slope = p == 1 ? broadcast_to(m.scale, m.z.dims()) : mul(mul(scalar_like(2, m.z), m.z), m.scale);
  const Value others = select(m.active, slope, zero);
  const Value at_target = reshape(neg(row_sum(*this, others)), {n, 1});
  Value g = select(m.onehot, broadcast_to(at_target, m.z.dims()), others);
  if (reduction == 1) g = div(g, scalar_like(static_cast<double>(n), g));
  g = reduction == 0 ? mul(g, reshape(grad_output, {n, 1})) : mul(g, reshape(grad_output, {}));
  return reshape(g, self.dims());
}

namespace {

// count[n, c]: how often class c appears in target[n] before its first -1; [N, C] of x's type.
Value label_counts(Builder& b, const Value& x, const Value& target) {
  const int64_t n = x.dims()[0], c = x.dims()[1];
  const Value t = b.convert(as_rows(b, target), ElementType::S64);  // [N, C]
  // valid[n, k]: no -1 at or before k (a running product of t != -1 along k).
  const Value not_end = b.convert(b.ne(t, b.constant_int(-1, ElementType::S64)), ElementType::S64);
  const Value valid = b.eq(b.cumprod(not_end, 1), b.constant_int(1, ElementType::S64));
  // [N, K, C]: target[n, k] == c where valid.
  const Value classes = b.iota(TensorType{ElementType::S64, {n, c, c}}, 2);
  const Value hits = b.bitwise_and(b.eq(b.broadcast_to(b.reshape(t, {n, c, 1}), {n, c, c}), classes),
                                   b.broadcast_to(b.reshape(valid, {n, c, 1}), {n, c, c}));
  return b.sum(b.convert(hits, x.element()), {1}, false);
}

// m[n, j, i]: count[j] where i is no target and 1 - (x[j] - x[i]) > 0; and that margin.
std::pair<Value, Value> label_terms(Builder& b, const Value& x, const Value& counts) {
  const int64_t n = x.dims()[0], c = x.dims()[1];
  const std::vector<int64_t> cube = {n, c, c};
  const Value xj = b.broadcast_to(b.reshape(x, {n, c, 1}), cube), xi = b.broadcast_to(b.reshape(x, {n, 1, c}), cube);
  const Value z = b.sub(b.scalar_like(1, x), b.sub(xj, xi));
  const Value zero = b.scalar_like(0, x);
  const Value non_target = b.broadcast_to(b.reshape(b.eq(counts, zero), {n, 1, c}), cube);
  const Value weight = b.broadcast_to(b.reshape(counts, {n, c, 1}), cube);
  const Value live = b.bitwise_and(non_target, b.gt(z, zero));
  return {b.select(live, weight, zero), z};
}

}  // namespace

Value Builder::multilabel_margin_loss(const Value& self, const Value& target, int64_t reduction, bool is_target) {
  const Value x = as_rows(*this, self);
  const Value counts = label_counts(*this, x, target);
  if (is_target) return reshape(convert(gt(counts, scalar_like(0, counts)), x.element()), self.dims());
  const auto [weight, z] = label_terms(*this, x, counts);
  const Value per_row =
      div(sum(mul(weight, z), {1, 2}, false), scalar_like(static_cast<double>(x.dims()[1]), x));
  if (reduction == 0) return self.rank() <= 1 ? reshape(per_row, {}) : per_row;
  return nn_loss_reduce(per_row, reduction);
}

Value Builder::multilabel_margin_loss_backward(const Value& grad_output, const Value& self, const Value& target,
                                               int64_t reduction) {
  const Value x = as_rows(*this, self);
  const int64_t n = x.dims()[0], c = x.dims()[1];
  const Value counts = label_counts(*this, x, target);
  const Value weight = label_terms(*this, x, counts).first;
  // d/dx[j] of count[j] (1 - x[j] + x[i]): -count[j]; d/dx[i]: +count[j].
  Value g = sub(sum(weight, {1}, false), sum(weight, {2}, false));
  g = div(g, scalar_like(static_cast<double>(c), g));
  if (reduction == 1) g = div(g, scalar_like(static_cast<double>(n), g));
  g = reduction == 0 ? mul(g, reshape(grad_output, {n, 1})) : mul(g, reshape(grad_output, {}));
  return reshape(g, self.dims());
}

Value Builder::renorm(const Value& v, double p, int64_t dim, double maxnorm) {
  if (dim < 0) dim += v.rank();
  std::vector<int64_t> others;
  for (int64_t d = 0; d < v.rank(); ++d) {
    if (d != dim) others.push_back(d);
  }
  // A 1-D tensor's sub-tensors along dim 0 are its elements.
  const Value norm = others.empty() ? abs(v) : vector_norm(v, p, others, true);
  const Value factor = select(gt(norm, scalar_like(maxnorm, norm)),
                              div(scalar_like(maxnorm, norm), add(norm, scalar_like(1e-7, norm))), scalar_like(1, norm));
  return mul(v, factor);
}

}  // namespace torchtpu::rt
