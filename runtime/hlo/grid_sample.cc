// grid_sample (grid_sampler_2d / 3d) and its gradients: every output point reads a few taps of the
// input (bilinear 2^nd, nearest 1, bicubic 16), each tap the product of one tap per spatial axis.
// Forward gathers the taps; the input gradient scatter-adds them back; the grid gradient sums each
// tap's value times the derivative of its weight along one axis.
#include <cmath>

#include "hlo/builder_internal.h"

namespace torchtpu::rt {

using builder_internal::fail;

namespace {

constexpr int64_t kBilinear = 0, kNearest = 1, kBicubic = 2;
constexpr int64_t kZeros = 0, kBorder = 1, kReflection = 2;
constexpr double kCubicA = -0.75;  // the cubic convolution constant CPU uses

// One axis's taps for every output point ([N, *out] each): the integer index into the axis, its
// weight, the weight's derivative with respect to the unnormalized coordinate, and whether the
// index is inside the axis (a tap outside reads and receives nothing).
struct AxisTap {
  Value index, weight, weight_grad, inside;
};

struct Axis {
  std::vector<AxisTap> taps;
  Value coordinate_grad;  // d(unnormalized, padded coordinate) / d(grid value)
};

// A coordinate clipped to [0, size - 1]; its derivative is 1 strictly inside, else 0 (CPU's rule).
std::pair<Value, Value> clip(Builder& b, const Value& c, int64_t size) {
  const Value limit = b.scalar_like(static_cast<double>(size - 1), c);
  const Value zero = b.scalar_like(0, c);
  const Value clipped = b.minimum(b.maximum(c, zero), limit);
  const Value inside = b.binary("and", b.gt(c, zero), b.lt(c, limit));
  return {clipped, b.select(inside, b.full(1, c.type), b.full(0, c.type))};
}

// c reflected into [twice_low / 2, twice_high / 2], and the derivative's sign (CPU's reflect_coordinates).
std::pair<Value, Value> reflect(Builder& b, const Value& c, int64_t twice_low, int64_t twice_high) {
  if (twice_low == twice_high) return {b.full(0, c.type), b.full(0, c.type)};
  const double low = twice_low / 2.0, span = (twice_high - twice_low) / 2.0;
  const Value shifted = b.sub(c, b.scalar_like(low, c));
  const Value negative = b.lt(shifted, b.scalar_like(0, c));
  const Value distance = b.abs(shifted);
  const Value extra = b.fmod(distance, b.scalar_like(span, c));
  const Value flips = b.floor(b.div(distance, b.scalar_like(span, c)));
  const Value even = b.eq(b.fmod(flips, b.scalar_like(2, c)), b.scalar_like(0, c));
  const Value reflected = b.select(even, b.add(extra, b.scalar_like(low, c)),
                                   b.sub(b.scalar_like(span + low, c), extra));
  const Value one = b.full(1, c.type), minus_one = b.full(-1, c.type);
  const Value sign = b.select(negative, minus_one, one);
  return {reflected, b.select(even, sign, b.neg(sign))};
}

// The padding mode applied to an unnormalized coordinate, with its derivative.
std::pair<Value, Value> pad_coordinate(Builder& b, const Value& c, int64_t size, int64_t padding, bool align_corners) {
  if (padding == kBorder) return clip(b, c, size);
  if (padding == kReflection) {
    auto [r, r_grad] = align_corners ? reflect(b, c, 0, 2 * (size - 1)) : reflect(b, c, -1, 2 * size - 1);
    auto [clipped, clip_grad] = clip(b, r, size);
    return {clipped, b.mul(r_grad, clip_grad)};
  }
  return {c, b.full(1, c.type)};
}

AxisTap tap_at(Builder& b, const Value& position, int64_t size, const Value& weight, const Value& weight_grad) {
  const Value index = b.convert(position, ElementType::S64);
  const Value inside = b.binary("and", b.ge(position, b.scalar_like(0, position)),
                                b.le(position, b.scalar_like(static_cast<double>(size - 1), position)));
  return {index, weight, weight_grad, inside};
}

// cubic convolution weights of the taps at floor - 1 .. floor + 2 for fraction t, and their derivatives.
std::pair<std::vector<Value>, std::vector<Value>> cubic_weights(Builder& b, const Value& t) {
  auto k = [&](double v) { return b.scalar_like(v, t); };
  const double a = kCubicA;
  // near(x) = ((a + 2) x - (a + 3)) x^2 + 1 for |x| <= 1; far(x) = ((a x - 5a) x + 8a) x - 4a for 1 < |x| < 2
  auto near = [&](const Value& x) { return b.add(b.mul(b.sub(b.mul(k(a + 2), x), k(a + 3)), b.mul(x, x)), k(1)); };
  auto far = [&](const Value& x) {
    return b.sub(b.mul(b.add(b.mul(b.sub(b.mul(k(a), x), k(5 * a)), x), k(8 * a)), x), k(4 * a));
  };
  auto near_grad = [&](const Value& x) { return b.mul(b.sub(b.mul(k(3 * (a + 2)), x), k(2 * (a + 3))), x); };
  auto far_grad = [&](const Value& x) { return b.add(b.mul(b.sub(b.mul(k(3 * a), x), k(10 * a)), x), k(8 * a)); };
  const Value one_plus = b.add(t, k(1)), one_minus = b.sub(k(1), t), two_minus = b.sub(k(2), t);
  return {{far(one_plus), near(t), near(one_minus), far(two_minus)},
          {far_grad(one_plus), near_grad(t), b.neg(near_grad(one_minus)), b.neg(far_grad(two_minus))}};
}

// The taps along one spatial axis of `size` for grid values g ([N, *out]).
Axis axis_taps(Builder& b, const Value& g, int64_t size, int64_t interpolation, int64_t padding, bool align_corners) {
  const double n = static_cast<double>(size);
  // unnormalize: [-1, 1] onto pixel centers (align_corners) or pixel edges
  const double scale = align_corners ? (n - 1) / 2 : n / 2;
  Value c = align_corners ? b.mul(b.add(g, b.scalar_like(1, g)), b.scalar_like(scale, g))
                          : b.div(b.sub(b.mul(b.add(g, b.scalar_like(1, g)), b.scalar_like(n, g)), b.scalar_like(1, g)),
                                  b.scalar_like(2, g));
  Axis axis;
  if (interpolation == kBicubic) {
    // the coordinate stays unpadded; each tap's position is padded on its own
    axis.coordinate_grad = b.full(scale, g.type);
    const Value start = b.floor(c);
    auto [weights, grads] = cubic_weights(b, b.sub(c, start));
    for (int k = 0; k < 4; ++k) {
      Value position = b.add(start, b.scalar_like(k - 1, g));
      position = pad_coordinate(b, position, size, padding, align_corners).first;
      axis.taps.push_back(tap_at(b, position, size, weights[k], grads[k]));
    }
    return axis;
  }
  auto [padded, pad_grad] = pad_coordinate(b, c, size, padding, align_corners);
  axis.coordinate_grad = b.mul(pad_grad, b.scalar_like(scale, g));
  if (interpolation == kNearest) {
    axis.taps.push_back(tap_at(b, b.round(padded), size, b.full(1, g.type), b.full(0, g.type)));
    return axis;
  }
  const Value start = b.floor(padded);
  const Value t = b.sub(padded, start);
  axis.taps.push_back(tap_at(b, start, size, b.sub(b.scalar_like(1, g), t), b.full(-1, g.type)));
  axis.taps.push_back(tap_at(b, b.add(start, b.scalar_like(1, g)), size, t, b.full(1, g.type)));
  return axis;
}

// A tap of the whole grid: one tap per axis. flat: [N, 1, Q] int64 into the input's [N, C, P];
// weight [N, 1, Q] (0 where any axis is outside); weight_grads[a]: the weight's derivative along axis a.
struct Tap {
  Value flat, weight;
  std::vector<Value> weight_grads;
};

struct Sampling {
  std::vector<Tap> taps;
  std::vector<Value> coordinate_grads;  // per spatial axis, [N, 1, Q]
  int64_t n = 0, c = 0, points = 0, plane = 0;
  std::vector<int64_t> spatial, out;
};

Sampling sampling(Builder& b, const Value& input, const Value& grid, int64_t interpolation, int64_t padding,
                  bool align_corners) {
  const int64_t nd = input.rank() - 2;
  if (nd != 2 && nd != 3) fail("grid_sample: input must be 4-d or 5-d");
  if (interpolation == kBicubic && nd != 2) fail("grid_sample: bicubic interpolation only supports 4-d input");
  if (grid.rank() != nd + 2 || grid.dims().back() != nd) fail("grid_sample: grid must be [N, *out, nd]");
  Sampling s;
  s.n = input.dims()[0];
  s.c = input.dims()[1];
  s.spatial.assign(input.dims().begin() + 2, input.dims().end());
  s.out.assign(grid.dims().begin() + 1, grid.dims().end() - 1);
  s.plane = 1;
  for (int64_t d : s.spatial) s.plane *= d;
  s.points = 1;
  for (int64_t d : s.out) s.points *= d;
  const std::vector<int64_t> flat_dims{s.n, 1, s.points};
  std::vector<Axis> axes;
  for (int64_t a = 0; a < nd; ++a) {
    // the grid's last dim lists x (the last spatial axis) first
    std::vector<int64_t> start(grid.rank(), 0), limit = grid.dims(), strides(grid.rank(), 1);
    start.back() = nd - 1 - a;
    limit.back() = nd - a;
    const Value g = b.reshape(b.slice(grid, start, limit, strides), flat_dims);
    axes.push_back(axis_taps(b, g, s.spatial[a], interpolation, padding, align_corners));
    s.coordinate_grads.push_back(axes.back().coordinate_grad);
  }
  // the cartesian product of the axes' taps
  std::vector<std::vector<const AxisTap*>> combos{{}};
  for (const Axis& axis : axes) {
    std::vector<std::vector<const AxisTap*>> next;
    for (const auto& combo : combos) {
      for (const AxisTap& t : axis.taps) {
        next.push_back(combo);
        next.back().push_back(&t);
      }
    }
    combos = std::move(next);
  }
  for (const auto& combo : combos) {
    Tap tap;
    Value flat = b.constant_int(0, ElementType::S64);
    Value inside;
    int64_t stride = s.plane;
    for (int64_t a = 0; a < nd; ++a) {
      stride /= s.spatial[a];
      const AxisTap& t = *combo[a];
      const Value clamped = b.clamp(t.index, b.constant_int(0, ElementType::S64),
                                    b.constant_int(s.spatial[a] - 1, ElementType::S64));
      flat = b.add(flat, b.mul(clamped, b.constant_int(stride, ElementType::S64)));
      inside = a == 0 ? t.inside : b.binary("and", inside, t.inside);
    }
    const Value zero = b.full(0, combo[0]->weight.type);
    for (int64_t a = 0; a <= nd; ++a) {  // a == nd: the weight itself; else its derivative along axis a
      Value w = a == 0 ? combo[0]->weight_grad : combo[0]->weight;
      for (int64_t other = 1; other < nd; ++other) w = b.mul(w, other == a ? combo[other]->weight_grad : combo[other]->weight);
      w = b.select(inside, w, zero);
      if (a == nd) tap.weight = w; else tap.weight_grads.push_back(w);
    }
    tap.flat = flat;
    s.taps.push_back(std::move(tap));
  }
  return s;
}

// The input's values at a tap: [N, C, Q].
Value gather_tap(Builder& b, const Value& planes, const Sampling& s, const Tap& tap) {
  return b.take_along(planes, 2, b.broadcast_to(tap.flat, {s.n, s.c, s.points}));
}

}  // namespace

Value Builder::grid_sample(const Value& input, const Value& grid, int64_t interpolation, int64_t padding,
                           bool align_corners) {
  const Sampling s = sampling(*this, input, grid, interpolation, padding, align_corners);
  const Value planes = reshape(input, {s.n, s.c, s.plane});
  Value out;
  for (const Tap& tap : s.taps) {
    const Value term = mul(gather_tap(*this, planes, s, tap), tap.weight);
    out = out.id < 0 ? term : add(out, term);
  }
  std::vector<int64_t> dims{s.n, s.c};
  dims.insert(dims.end(), s.out.begin(), s.out.end());
  return reshape(out, dims);
}

Value Builder::grid_sample_backward(const Value& grad, const Value& input, const Value& grid, int64_t interpolation,
                                    int64_t padding, bool align_corners, int64_t which) {
  const Sampling s = sampling(*this, input, grid, interpolation, padding, align_corners);
  const Value grad_points = reshape(grad, {s.n, s.c, s.points});
  if (which == 0) {  // every tap's share of the output gradient, added back where it was read
    std::vector<Value> indices, updates;
    for (const Tap& tap : s.taps) {
      indices.push_back(broadcast_to(tap.flat, {s.n, s.c, s.points}));
      updates.push_back(mul(grad_points, tap.weight));
    }
    const Value zeros = full(0, TensorType{input.element(), {s.n, s.c, s.plane}});
    const Value summed = scatter_along(zeros, 2, concatenate(indices, 2), concatenate(updates, 2), "add");
    return reshape(summed, input.dims());
  }
  const int64_t nd = static_cast<int64_t>(s.spatial.size());
  const Value planes = reshape(input, {s.n, s.c, s.plane});
  std::vector<Value> per_axis(nd);
  for (const Tap& tap : s.taps) {
    const Value weighted = sum(mul(gather_tap(*this, planes, s, tap), grad_points), {1}, true);  // [N, 1, Q]
    for (int64_t a = 0; a < nd; ++a) {
      const Value term = mul(weighted, tap.weight_grads[a]);
      per_axis[a] = per_axis[a].id < 0 ? term : add(per_axis[a], term);
    }
  }
  std::vector<int64_t> point_dims{s.n};
  point_dims.insert(point_dims.end(), s.out.begin(), s.out.end());
  point_dims.push_back(1);
  std::vector<Value> components;  // x (the last spatial axis) first, as the grid lists them
  for (int64_t a = nd - 1; a >= 0; --a) {
    components.push_back(reshape(mul(per_axis[a], s.coordinate_grads[a]), point_dims));
  }
  return concatenate(components, static_cast<int64_t>(point_dims.size()) - 1);
}

}  // namespace torchtpu::rt
