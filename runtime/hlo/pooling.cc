// Builder pooling family: max/avg/adaptive pools and nearest/linear upsampling (with gradients), as separable taps.
#include "hlo/hlo_builder.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "hlo/builder_internal.h"

namespace torchtpu::rt {

using namespace builder_internal;

namespace {

// One spatial axis of a windowed op, taken separably: output index o reads `taps` input positions
// pos[k * out + o] (clamped into range; k-major), each with a validity flag and a weight.
struct Taps {
  int64_t axis = 0, in = 0, out = 0, taps = 0;
  std::vector<int64_t> pos;
  std::vector<bool> valid;
  std::vector<double> weight;  // empty: all 1
};

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
  Value g = b.index_select(x, t.axis, i64_vector(b, t.pos));
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
  Value index = b.broadcast_in_dim(i64_vector(b, t.pos), flat_dims, {t.axis});
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

// Whether tap value c replaces the best so far: a greater value (so the first max stays) or a NaN
// (so the last NaN wins), as CPU's scan picks.
Value replaces_max(Builder& b, const Value& c, const Value& best) {
  const Value greater = b.gt(c, best);
  return is_float(c.element()) ? b.binary("or", greater, b.ne(c, c)) : greater;
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
    Value flat = b.mul(tap_field(b, i64_vector(b, t.pos), t, g.dims()),
                       b.constant_int(plane_stride, ElementType::S64));
    if (index) flat = b.add(flat, gather_taps(b, *index, t));
    Value valid = tap_field(b, pool_pred_vector(b, t.valid), t, g.dims());
    std::vector<int64_t> out_dims = g.dims();
    out_dims.erase(out_dims.begin() + t.axis);
    Value best = b.full(0, TensorType{g.element(), out_dims});
    Value best_index = b.full(-1, TensorType{ElementType::S64, out_dims});
    for (int64_t k = 0; k < t.taps; ++k) {
      Value c = tap_at(b, g, t, k);
      Value take = b.binary("or", b.eq(best_index, b.constant_int(-1, ElementType::S64)), replaces_max(b, c, best));
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

Value Builder::fractional_max_pool(const Value& self, const std::vector<int64_t>& kernel_size,
                                   const std::vector<int64_t>& output_size, const Value& samples, int64_t nd,
                                   bool indices) {
  const int64_t lead = self.rank() - nd;
  const std::vector<int64_t> lead_dims(self.dims().begin(), self.dims().begin() + lead);
  const ElementType e = self.element();
  const Value u = convert(samples, e);
  // Separable, from the last spatial axis to the first (max_all_taps' order, so ties and NaNs pick
  // CPU's element); every window lies inside the input (the Meta pass checked the sizes).
  Value x = self;
  std::optional<Value> index;
  int64_t plane_stride = 1;
  for (int64_t i = nd - 1; i >= 0; --i) {
    const int64_t axis = lead + i, in = self.dims()[axis], out = output_size.at(i), pool = kernel_size.at(i);
    // CPU's 2-d kernel draws the width from sample 0 and the height from sample 1; the 3-d one
    // draws spatial axis i from sample i.
    const int64_t which = nd == 2 ? 1 - i : i;
    std::vector<int64_t> start(u.rank(), 0), limit = u.dims(), strides(u.rank(), 1);
    start.back() = which, limit.back() = which + 1;
    std::vector<int64_t> starts_dims = lead_dims;
    starts_dims.push_back(out);
    std::vector<int64_t> lead_axes(lead);
    for (int64_t d = 0; d < lead; ++d) lead_axes[d] = d;
    const Value sample = broadcast_in_dim(reshape(slice(u, start, limit, strides), lead_dims), starts_dims, lead_axes);
    // starts[o] = int((o + sample) * alpha) - int(sample * alpha), the last one in - pool, in the
    // samples' type (alpha rounded to it as CPU's scalar_t division does).
    Value starts = full(static_cast<double>(in - pool), TensorType{ElementType::S64, starts_dims});
    if (out > 1) {
      const double alpha = e == ElementType::F64 ? static_cast<double>(in - pool) / static_cast<double>(out - 1)
                                                 : static_cast<double>(static_cast<float>(in - pool) / static_cast<float>(out - 1));
      const Value a = scalar_like(alpha, sample);
      const Value position = iota(TensorType{ElementType::S64, starts_dims}, lead);
      const Value steps = sub(convert(mul(add(convert(position, e), sample), a), ElementType::S64),
                              convert(mul(sample, a), ElementType::S64));
      starts = select(eq(position, constant_int(out - 1, ElementType::S64)), starts, steps);
    }
    // The taps' positions along this axis, laid over x's dims with the axis cut to `out`.
    std::vector<int64_t> out_dims = x.dims();
    out_dims[axis] = out;
    std::vector<int64_t> starts_axes = lead_axes;
    starts_axes.push_back(axis);
    Value best, best_index;
    for (int64_t k = 0; k < pool; ++k) {
      const Value pos = broadcast_in_dim(add(starts, constant_int(k, ElementType::S64)), out_dims, starts_axes);
      const Value c = take_along(x, axis, pos);
      Value flat = mul(pos, constant_int(plane_stride, ElementType::S64));
      if (index) flat = add(flat, take_along(*index, axis, pos));
      if (k == 0) {
        best = c, best_index = flat;
        continue;
      }
      const Value take = replaces_max(*this, c, best);
      best = select(take, c, best);
      best_index = select(take, flat, best_index);
    }
    x = best;
    index = best_index;
    plane_stride *= in;
  }
  return indices ? *index : x;
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
