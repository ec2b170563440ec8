// The op_db leftovers' primitives: bit shifts, tril/triu_indices, searchsorted/bucketize, histc,
// max_unpool, im2col/col2im, cdist/pdist with their gradients, nonzero_static, and the empty result
// of eval batch norm, zeros (_efficientzerotensor). Declared in hlo_builder.h's "op_db leftovers" block.
#include <cmath>

#include "hlo/builder_internal.h"

namespace torchtpu::rt {

using builder_internal::bits_of;
using builder_internal::fail;
using builder_internal::product;

namespace {

// An int64 iota of `dims` along `dim`, times `scale`: one term of a flat index.
Value index_term(Builder& b, const std::vector<int64_t>& dims, int64_t dim, int64_t scale) {
  Value i = b.iota(TensorType{ElementType::S64, dims}, dim);
  return scale == 1 ? i : b.mul(i, b.constant_int(scale, ElementType::S64));
}

// The window geometry im2col and col2im share: for input planes [C, H, W] (after padding) the flat
// index into the padded [N, C, Hp, Wp] of every element of the [N, C * kh * kw, L] columns.
struct Columns {
  int64_t hp = 0, wp = 0, out_h = 0, out_w = 0;
  Value index;
};

Columns column_indices(Builder& b, int64_t n, int64_t c, int64_t h, int64_t w, const std::vector<int64_t>& kernel,
                       const std::vector<int64_t>& dilation, const std::vector<int64_t>& padding,
                       const std::vector<int64_t>& stride) {
  auto pick = [](const std::vector<int64_t>& v, int i) { return v.size() == 1 ? v[0] : v.at(i); };
  const int64_t kh = pick(kernel, 0), kw = pick(kernel, 1), dh = pick(dilation, 0), dw = pick(dilation, 1);
  const int64_t ph = pick(padding, 0), pw = pick(padding, 1), sh = pick(stride, 0), sw = pick(stride, 1);
  Columns cols;
  cols.hp = h + 2 * ph;
  cols.wp = w + 2 * pw;
  cols.out_h = (cols.hp - (dh * (kh - 1) + 1)) / sh + 1;
  cols.out_w = (cols.wp - (dw * (kw - 1) + 1)) / sw + 1;
  if (cols.out_h <= 0 || cols.out_w <= 0) fail("im2col/col2im: the kernel does not fit the padded input");
  // dims: n, c, ki, kj, oh, ow
  const std::vector<int64_t> dims{n, c, kh, kw, cols.out_h, cols.out_w};
  const int64_t plane = cols.hp * cols.wp;
  Value index = index_term(b, dims, 0, c * plane);
  index = b.add(index, index_term(b, dims, 1, plane));
  index = b.add(index, index_term(b, dims, 2, dh * cols.wp));
  index = b.add(index, index_term(b, dims, 3, dw));
  index = b.add(index, index_term(b, dims, 4, sh * cols.wp));
  index = b.add(index, index_term(b, dims, 5, sw));
  cols.index = b.reshape(index, {n, c * kh * kw, cols.out_h * cols.out_w});
  return cols;
}

// d||diff||_p / d diff, given the distance (diff's last dim reduced, kept as 1): CPU's rules, 0 where
// the distance is 0.
Value distance_gradient(Builder& b, const Value& diff, const Value& dist, double p) {
  const Value zero = b.scalar_like(0, diff);
  Value g;
  if (p == 0) return b.mul(diff, zero);
  if (p == 1) {
    g = b.sign(diff);
  } else if (p == 2) {
    g = b.div(diff, dist);
  } else if (std::isinf(p)) {
    g = b.mul(b.sign(diff), b.convert(b.eq(b.abs(diff), dist), diff.element()));
  } else if (p < 2) {
    g = b.div(b.mul(b.sign(diff), b.binary("power", b.abs(diff), b.scalar_like(p - 1, diff))),
              b.binary("power", dist, b.scalar_like(p - 1, dist)));
    g = b.select(b.eq(b.broadcast_like(diff, g), zero), b.broadcast_like(zero, g), g);
  } else {
    g = b.div(b.mul(diff, b.binary("power", b.abs(diff), b.scalar_like(p - 2, diff))),
              b.binary("power", dist, b.scalar_like(p - 1, dist)));
  }
  const Value at_zero = b.broadcast_like(b.eq(dist, b.scalar_like(0, dist)), g);
  return b.select(at_zero, b.broadcast_like(zero, g), g);
}

}  // namespace

Value Builder::empty_1d(const Value& like) { return full(0, TensorType{like.element(), {0}}); }

Value Builder::zeros(const std::vector<int64_t>& size) { return full(0, TensorType{ElementType::F32, size}); }

Value Builder::bitwise_shift(const Value& a, const Value& b, bool left) {
  const int bits = bits_of(a.element());
  const bool is_unsigned_type = a.element() == ElementType::Pred || builder_internal::compare_type(a.element())[0] == 'U';
  Value shifted = binary(left ? "shift_left" : (is_unsigned_type ? "shift_right_logical" : "shift_right_arithmetic"), a, b);
  // PyTorch: a shift by a negative amount or by the width or more gives 0, or the sign (signed >>).
  Value out_of_range = ge(b, scalar_like(bits, b));
  if (!is_unsigned_type) out_of_range = binary("or", out_of_range, lt(b, scalar_like(0, b)));
  Value saturated = left || is_unsigned_type
                        ? broadcast_like(scalar_like(0, a), shifted)
                        : binary("shift_right_arithmetic", broadcast_like(a, shifted),
                                 broadcast_like(scalar_like(bits - 1, a), shifted));
  return select(broadcast_like(out_of_range, shifted), saturated, shifted);
}

Value Builder::tri_indices(int64_t row, int64_t col, int64_t offset, bool upper) {
  std::string rows, cols;
  int64_t n = 0;
  for (int64_t r = 0; r < row; ++r) {
    for (int64_t c = 0; c < col; ++c) {
      if (upper ? c - r >= offset : c - r <= offset) {
        rows += (n ? ", " : "") + std::to_string(r);
        cols += (n ? ", " : "") + std::to_string(c);
        ++n;
      }
    }
  }
  const TensorType t{ElementType::S64, {2, n}};
  if (n == 0) return full(0, t);
  return dense_constant("[[" + rows + "], [" + cols + "]]", t);
}

Value Builder::search_sorted(const Value& sorted_in, const Value& values, bool right, const std::string& side,
                             const std::optional<Value>& sorter) {
  const bool upper = right || side == "right";
  const Value sorted = sorter ? take_along(sorted_in, -1, *sorter) : sorted_in;
  const int64_t m = sorted.rank() == 0 ? 1 : sorted.dims().back();
  TensorType out{ElementType::S64, values.dims()};
  if (out.numel() == 0) return full(0, out);
  if (m == 0) return full(0, out);
  // values [..., K, 1] against boundaries [..., 1, M] (or [M] for 1-D boundaries): count those below.
  std::vector<int64_t> v_dims = values.dims();
  v_dims.push_back(1);
  Value boundaries = sorted;
  if (sorted.rank() > 1) {
    std::vector<int64_t> s_dims = sorted.dims();
    s_dims.insert(s_dims.end() - 1, 1);
    boundaries = reshape(sorted, s_dims);
  } else {
    boundaries = reshape(sorted, {m});
  }
  const Value v = reshape(values, v_dims);
  std::vector<int64_t> both = v_dims;
  both.back() = m;
  const Value vb = broadcast_to(v, both), sb = broadcast_to(boundaries, both);
  const Value below = upper ? le(sb, vb) : lt(sb, vb);
  return sum(convert(below, ElementType::S64), {-1}, false);
}

Value Builder::histc(const Value& v, int64_t bins, const Value& min, const Value& max) {
  TensorType out{v.element(), {bins}};
  const int64_t n = v.type.numel();
  if (n == 0) return full(0, out);
  const Value flat = reshape(v, {n});
  // min == max: the data's extremes; still equal: widened by 1 either way (CPU's rule).
  // Each step rounds through the op's nominal dtype, as CPU computes bfloat16/float16 bins in them.
  Value lo = nominal(convert(min, v.element())), hi = nominal(convert(max, v.element()));
  const Value unset = eq(lo, hi);
  lo = select(unset, amin(flat, {}, false), lo);
  hi = select(unset, amax(flat, {}, false), hi);
  const Value degenerate = eq(lo, hi);
  lo = select(degenerate, nominal(sub(lo, scalar_like(1, lo))), lo);
  hi = select(degenerate, nominal(add(hi, scalar_like(1, hi))), hi);
  const Value inside = binary("and", ge(flat, broadcast_to(lo, {n})), le(flat, broadcast_to(hi, {n})));
  const Value offset = nominal(sub(flat, broadcast_to(lo, {n})));
  const Value scaled = nominal(mul(offset, scalar_like(static_cast<double>(bins), flat)));
  const Value position = nominal(div(scaled, broadcast_to(nominal(sub(hi, lo)), {n})));
  Value bin = convert(floor(position), ElementType::S64);
  bin = select(eq(bin, constant_int(bins, ElementType::S64)), broadcast_to(constant_int(bins - 1, ElementType::S64), {n}),
               bin);
  bin = select(inside, bin, broadcast_to(constant_int(-1, ElementType::S64), {n}));  // outside: no bin
  const Value hits = eq(broadcast_to(reshape(bin, {n, 1}), {n, bins}), iota(TensorType{ElementType::S64, {n, bins}}, 1));
  return sum(convert(hits, v.element()), {0}, false);
}

Value Builder::histogram_edges(const Value& v, int64_t bins, const std::vector<double>& range) {
  const ElementType e = v.element();
  const int64_t n = v.type.numel();
  // (torchtpu/_meta.py checked the range.) No range: the data's extremes (no data: [0, 1]); ends that
  // meet are widened by 0.5 either way (CPU's rule).
  Value lo, hi;
  if (range.size() == 2) {
    lo = constant(range[0], e), hi = constant(range[1], e);
  } else if (n == 0) {
    lo = constant(0, e), hi = constant(1, e);
  } else {
    lo = amin(reshape(v, {n}), {}, false), hi = amax(reshape(v, {n}), {}, false);
  }
  const Value meet = eq(lo, hi);
  lo = select(meet, sub(lo, constant(0.5, e)), lo);
  hi = select(meet, add(hi, constant(0.5, e)), hi);
  return linspace(lo, hi, bins + 1);
}

Value Builder::histogram_counts(const Value& v, const Value& edges_in, const std::optional<Value>& weight, bool density) {
  const ElementType e = v.element();
  const int64_t n = v.type.numel(), k = edges_in.type.numel(), bins = k - 1;
  if (bins < 1) fail("torch.histogramdd: bins must have at least 2 edges");
  const Value edges = convert(reshape(edges_in, {k}), e);
  Value hist = full(0, TensorType{e, {bins}});
  if (n > 0) {
    // x's bin: the last edge <= x (the top edge closes the last bin); outside the edges (or NaN): none.
    const Value flat = reshape(v, {n});
    const Value at_or_below = le(broadcast_in_dim(edges, {n, k}, {1}), broadcast_in_dim(flat, {n, k}, {0}));
    Value bin = sub(reduce(convert(at_or_below, ElementType::S64), {1}, "add", 0),
                    broadcast_to(constant_int(1, ElementType::S64), {n}));
    bin = minimum(bin, broadcast_to(constant_int(bins - 1, ElementType::S64), {n}));
    const Value first = reshape(slice(edges, {0}, {1}, {1}), {}), last = reshape(slice(edges, {bins}, {k}, {1}), {});
    const Value inside = binary("and", ge(flat, broadcast_to(first, {n})), le(flat, broadcast_to(last, {n})));
    bin = select(inside, bin, broadcast_to(constant_int(-1, ElementType::S64), {n}));
    const Value hits = convert(eq(broadcast_in_dim(bin, {n, bins}, {0}), iota(TensorType{ElementType::S64, {n, bins}}, 1)), e);
    hist = weight ? sum(mul(hits, broadcast_in_dim(convert(reshape(*weight, {n}), e), {n, bins}, {0})), {0}, false)
                  : sum(hits, {0}, false);
  }
  if (!density) return hist;
  const Value widths = sub(slice(edges, {1}, {k}, {1}), slice(edges, {0}, {bins}, {1}));
  return div(div(hist, broadcast_to(sum(hist, {}, false), {bins})), widths);
}

Value Builder::max_unpool(const Value& self, const Value& indices, const std::vector<int64_t>& output_size) {
  const size_t nd = output_size.size();
  if (self.rank() < static_cast<int>(nd) + 1) fail("max_unpool: input has too few dims");
  const std::vector<int64_t>& dims = self.dims();
  const size_t lead = dims.size() - nd;
  const int64_t planes = product(dims, 0, lead), in = product(dims, lead), out = product(output_size);
  std::vector<int64_t> out_dims(dims.begin(), dims.begin() + lead);
  out_dims.insert(out_dims.end(), output_size.begin(), output_size.end());
  if (planes * in == 0 || out == 0) return full(0, TensorType{self.element(), out_dims});
  const Value zeros = full(0, TensorType{self.element(), {planes, out}});
  const Value unpooled = scatter_along(zeros, 1, reshape(indices, {planes, in}), reshape(self, {planes, in}), "");
  return reshape(unpooled, out_dims);
}

Value Builder::im2col(const Value& self, const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& dilation,
                      const std::vector<int64_t>& padding, const std::vector<int64_t>& stride) {
  const bool batched = self.rank() == 4;
  const Value v = batched ? self : reshape(self, [&] { std::vector<int64_t> d{1}; d.insert(d.end(), self.dims().begin(), self.dims().end()); return d; }());
  const int64_t n = v.dims()[0], c = v.dims()[1], h = v.dims()[2], w = v.dims()[3];
  auto pick = [](const std::vector<int64_t>& p, int i) { return p.size() == 1 ? p[0] : p.at(i); };
  const int64_t ph = pick(padding, 0), pw = pick(padding, 1);
  const Columns cols = column_indices(*this, n, c, h, w, kernel_size, dilation, padding, stride);
  const Value padded = constant_pad(v, {pw, pw, ph, ph}, scalar_like(0, v));
  Value result = take(padded, cols.index);
  if (!batched) result = reshape(result, {result.dims()[1], result.dims()[2]});
  return result;
}

Value Builder::col2im(const Value& self, const std::vector<int64_t>& output_size, const std::vector<int64_t>& kernel_size,
                      const std::vector<int64_t>& dilation, const std::vector<int64_t>& padding,
                      const std::vector<int64_t>& stride) {
  const bool batched = self.rank() == 3;
  const Value v = batched ? self : reshape(self, {1, self.dims()[0], self.dims()[1]});
  auto pick = [](const std::vector<int64_t>& p, int i) { return p.size() == 1 ? p[0] : p.at(i); };
  const int64_t kh = pick(kernel_size, 0), kw = pick(kernel_size, 1), ph = pick(padding, 0), pw = pick(padding, 1);
  const int64_t n = v.dims()[0], c = v.dims()[1] / (kh * kw), h = output_size.at(0), w = output_size.at(1);
  const Columns cols = column_indices(*this, n, c, h, w, kernel_size, dilation, padding, stride);
  const int64_t total = n * c * cols.hp * cols.wp;
  const Value flat_index = reshape(cols.index, {cols.index.type.numel()});
  Value sums = index_put(full(0, TensorType{v.element(), {total}}), {flat_index}, reshape(v, {v.type.numel()}), true);
  sums = reshape(sums, {n, c, cols.hp, cols.wp});
  Value result = slice(sums, {0, 0, ph, pw}, {n, c, ph + h, pw + w}, {1, 1, 1, 1});
  if (!batched) result = reshape(result, {c, h, w});
  return result;
}

Value Builder::cdist(const Value& x1, const Value& x2, double p) {
  // x1 [..., P, M] and x2 [..., R, M]: the differences [..., P, R, M], normed over M.
  std::vector<int64_t> d1 = x1.dims(), d2 = x2.dims();
  d1.insert(d1.end() - 1, 1);  // [..., P, 1, M]
  d2.insert(d2.end() - 2, 1);  // [..., 1, R, M]
  const Value diff = sub(reshape(x1, d1), reshape(x2, d2));
  if (diff.dims().back() == 0) {
    std::vector<int64_t> out = diff.dims();
    out.pop_back();
    return full(0, TensorType{x1.element(), out});
  }
  return vector_norm(diff, p, {-1}, false);
}

Value Builder::cdist_backward(const Value& grad, const Value& x1, const Value& x2, double p, const Value& dist) {
  // Nothing to differentiate: zeros, which the kernel broadcasts to the gradient's (Meta's) shape.
  if (grad.type.numel() == 0 || x1.type.numel() == 0 || x2.type.numel() == 0) return scalar_like(0, x1);
  std::vector<int64_t> d1 = x1.dims(), d2 = x2.dims();
  d1.insert(d1.end() - 1, 1);
  d2.insert(d2.end() - 2, 1);
  const Value diff = sub(reshape(x1, d1), reshape(x2, d2));  // [..., P, R, M]
  std::vector<int64_t> kept = dist.dims();
  kept.push_back(1);
  const Value g = distance_gradient(*this, diff, reshape(dist, kept), p);
  const Value weighted = mul(g, reshape(grad, kept));
  return sum(weighted, {-2}, false);  // over R: x1's rows with the broadcast batch dims (as Meta sizes it)
}

namespace {

// The row pairs i < j of an n-row matrix, in pdist's order: two int64 [n (n - 1) / 2] constants.
std::pair<Value, Value> row_pairs(Builder& b, int64_t n) {
  std::string first, second;
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = i + 1; j < n; ++j, ++k) {
      first += (k ? ", " : "") + std::to_string(i);
      second += (k ? ", " : "") + std::to_string(j);
    }
  }
  const TensorType t{ElementType::S64, {k}};
  return {b.dense_constant("[" + first + "]", t), b.dense_constant("[" + second + "]", t)};
}

}  // namespace

Value Builder::pdist(const Value& v, double p) {
  const int64_t n = v.dims().at(0), pairs = n * (n - 1) / 2;
  if (pairs == 0) return full(0, TensorType{v.element(), {0}});
  if (v.dims().at(1) == 0) return full(0, TensorType{v.element(), {pairs}});
  const auto [first, second] = row_pairs(*this, n);
  return vector_norm(sub(index_select(v, 0, first), index_select(v, 0, second)), p, {1}, false);
}

Value Builder::pdist_backward(const Value& grad, const Value& v, double p, const Value& dist) {
  const int64_t n = v.dims().at(0), m = v.dims().at(1), pairs = n * (n - 1) / 2;
  if (pairs == 0 || m == 0) return full(0, v.type);
  const auto [first, second] = row_pairs(*this, n);
  const Value diff = sub(index_select(v, 0, first), index_select(v, 0, second));  // [pairs, M]
  const Value g = mul(distance_gradient(*this, diff, reshape(dist, {pairs, 1}), p), reshape(grad, {pairs, 1}));
  Value result = index_put(full(0, v.type), {first}, g, true);
  return index_put(result, {second}, neg(g), true);
}

Value Builder::nonzero_static(const Value& v, int64_t size, int64_t fill_value) {
  const int64_t n = v.type.numel(), r = v.rank();
  const TensorType out{ElementType::S64, {size, r}};
  if (size == 0 || r == 0) return full(0, out);
  const Value fill = full(static_cast<double>(fill_value), out);
  if (n == 0) return fill;
  Value rows = nonzero_padded(v);  // [n, r]
  if (n >= size) {
    rows = slice(rows, {0, 0}, {size, r}, {1, 1});
  } else {
    rows = concatenate({rows, full(0, TensorType{ElementType::S64, {size - n, r}})}, 0);
  }
  const Value count = nonzero_count(v, v);
  const Value real = lt(iota(out, 0), broadcast_to(count, {size, r}));
  return select(real, rows, fill);
}


namespace {

// Bicubic interpolation (A = -0.75) along one axis as an [out, in] matrix: row o holds the four
// weights of output o at their input positions (clamped to the edge, where weights add up), in T
// (float, or double for float64) as CPU's opmath computes them.
template <typename T>
std::vector<double> cubic_matrix(int64_t in, int64_t out, bool align_corners, std::optional<double> scale) {
  std::vector<double> m(static_cast<size_t>(out * in), 0.0);
  const T ratio = align_corners ? (out > 1 ? static_cast<T>(in - 1) / static_cast<T>(out - 1) : static_cast<T>(0))
                                : (scale && *scale > 0 ? static_cast<T>(1.0 / *scale)
                                                       : static_cast<T>(in) / static_cast<T>(out));
  const T a = static_cast<T>(-0.75), one = 1;
  auto near = [&](T x) { return ((a + 2) * x - (a + 3)) * x * x + one; };               // |x| <= 1
  auto far = [&](T x) { return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a; };           // 1 < |x| < 2
  for (int64_t o = 0; o < out; ++o) {
    const T real = align_corners ? ratio * static_cast<T>(o)
                                 : ratio * (static_cast<T>(o) + static_cast<T>(0.5)) - static_cast<T>(0.5);
    const T floor_real = std::floor(real);
    const T t = real - floor_real, rest = one - t;
    const T w[4] = {far(t + one), near(t), near(rest), far(rest + one)};
    const int64_t first = static_cast<int64_t>(floor_real) - 1;
    for (int k = 0; k < 4; ++k) {
      const int64_t i = std::min(std::max<int64_t>(first + k, 0), in - 1);
      m[static_cast<size_t>(o * in + i)] += static_cast<double>(w[k]);
    }
  }
  return m;
}

Value float_matrix(Builder& b, const std::vector<double>& m, int64_t rows, int64_t cols, ElementType element) {
  std::string s = "[";
  for (int64_t r = 0; r < rows; ++r) {
    s += r ? ", [" : "[";
    for (int64_t c = 0; c < cols; ++c) {
      s += (c ? ", " : "") + builder_internal::float_literal(m[static_cast<size_t>(r * cols + c)], element);
    }
    s += "]";
  }
  return b.dense_constant(s + "]", TensorType{element, {rows, cols}});
}

// v's `axis` contracted with matrix [new, old] (transposed: [old, new]), the result's new dim in
// the axis' place.
Value apply_along(Builder& b, const Value& v, int64_t axis, const Value& matrix, bool transposed) {
  Value r = b.dot_general(v, matrix, {}, {}, {axis}, {transposed ? 0 : 1});  // v's other dims, then the new one
  const int64_t rank = v.rank();
  if (axis == rank - 1) return r;
  std::vector<int64_t> permutation;
  for (int64_t d = 0; d < rank - 1; ++d) {
    if (d == axis) permutation.push_back(rank - 1);
    permutation.push_back(d);
  }
  return b.transpose(r, permutation);
}

// Anti-aliased resampling along one axis as an [out, in] matrix (the kernel of PIL's resize, which
// CPU's _upsample_*_aa follow): downscaling widens the triangle (bilinear) or Keys cubic (A = -0.5)
// filter by the scale, each row's weights normalized to sum to 1; computed in T as CPU's opmath does.
template <typename T>
std::vector<double> antialias_matrix(int64_t in, int64_t out, bool align_corners, std::optional<double> scale,
                                     bool bicubic) {
  std::vector<double> m(static_cast<size_t>(out * in), 0.0);
  const T ratio = align_corners ? (out > 1 ? static_cast<T>(in - 1) / static_cast<T>(out - 1) : static_cast<T>(0))
                                : (scale && *scale > 0 ? static_cast<T>(1.0 / *scale)
                                                       : static_cast<T>(in) / static_cast<T>(out));
  const T one = 1, half = static_cast<T>(0.5), radius = bicubic ? 2 : 1;
  const T support = ratio >= one ? radius * ratio : radius, stretch = ratio >= one ? one / ratio : one;
  auto filter = [&](T x) -> T {
    x = std::abs(x);
    if (!bicubic) return x < one ? one - x : T(0);
    const T a = static_cast<T>(-0.5);
    if (x < one) return ((a + 2) * x - (a + 3)) * x * x + one;
    if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
    return 0;
  };
  std::vector<T> w;
  for (int64_t o = 0; o < out; ++o) {
    const T center = ratio * (static_cast<T>(o) + half);
    const int64_t first = std::max<int64_t>(static_cast<int64_t>(center - support + half), 0);
    const int64_t count = std::min<int64_t>(static_cast<int64_t>(center + support + half), in) - first;
    w.assign(static_cast<size_t>(std::max<int64_t>(count, 0)), 0);
    T total = 0;
    for (int64_t j = 0; j < count; ++j) total += w[j] = filter((static_cast<T>(j + first) - center + half) * stretch);
    for (int64_t j = 0; j < count; ++j) {
      m[static_cast<size_t>(o * in + first + j)] = static_cast<double>(total != 0 ? w[j] / total : w[j]);
    }
  }
  return m;
}

// v's last two dims resampled by one [out, in] matrix each (`matrix(in, out, scale)` for T = float,
// or double for float64); backward applies the transposes, from out_sizes back to in_sizes.
template <typename MatrixOf>
Value separable_resample(Builder& b, const Value& v, const std::vector<int64_t>& in_sizes,
                         const std::vector<int64_t>& out_sizes, std::optional<double> s0, std::optional<double> s1,
                         bool backward, MatrixOf matrix) {
  const ElementType e = v.element() == ElementType::F64 ? ElementType::F64 : ElementType::F32;
  Value r = b.convert(v, e);
  const std::optional<double> scales[2] = {s0, s1};
  for (int i = 0; i < 2; ++i) {
    const int64_t axis = r.rank() - 2 + i, in = in_sizes[i], out = out_sizes[i];
    const std::vector<double> m = e == ElementType::F64 ? matrix(double{}, in, out, scales[i])
                                                        : matrix(float{}, in, out, scales[i]);
    r = apply_along(b, r, axis, float_matrix(b, m, out, in, e), backward);
  }
  return b.convert(r, v.element());
}

Value cubic_resample(Builder& b, const Value& v, const std::vector<int64_t>& in_sizes, const std::vector<int64_t>& out_sizes,
                     bool align_corners, std::optional<double> s0, std::optional<double> s1, bool backward) {
  return separable_resample(b, v, in_sizes, out_sizes, s0, s1, backward,
                            [&](auto t, int64_t in, int64_t out, std::optional<double> scale) {
                              return cubic_matrix<decltype(t)>(in, out, align_corners, scale);
                            });
}

Value antialias_resample(Builder& b, const Value& v, const std::vector<int64_t>& in_sizes,
                         const std::vector<int64_t>& out_sizes, bool align_corners, std::optional<double> s0,
                         std::optional<double> s1, bool bicubic, bool backward) {
  return separable_resample(b, v, in_sizes, out_sizes, s0, s1, backward,
                            [&](auto t, int64_t in, int64_t out, std::optional<double> scale) {
                              return antialias_matrix<decltype(t)>(in, out, align_corners, scale, bicubic);
                            });
}

}  // namespace

Value Builder::upsample_bicubic(const Value& self, const std::vector<int64_t>& output_size, bool align_corners,
                                std::optional<double> scales_h, std::optional<double> scales_w) {
  if (self.rank() != 4 || output_size.size() != 2) fail("upsample_bicubic: needs [N, C, H, W] and two output sizes");
  const std::vector<int64_t> in{self.dims()[2], self.dims()[3]};
  if (self.type.numel() == 0 || output_size[0] * output_size[1] == 0) {
    return full(0, TensorType{self.element(), {self.dims()[0], self.dims()[1], output_size[0], output_size[1]}});
  }
  return cubic_resample(*this, self, in, output_size, align_corners, scales_h, scales_w, false);
}

Value Builder::upsample_bicubic_backward(const Value& grad, const std::vector<int64_t>& input_size, bool align_corners,
                                         std::optional<double> scales_h, std::optional<double> scales_w) {
  if (input_size.size() != 4) fail("upsample_bicubic_backward: input_size needs four sizes");
  const std::vector<int64_t> in{input_size[2], input_size[3]}, out{grad.dims()[2], grad.dims()[3]};
  if (grad.type.numel() == 0 || in[0] * in[1] == 0) return full(0, TensorType{grad.element(), input_size});
  return cubic_resample(*this, grad, in, out, align_corners, scales_h, scales_w, true);
}

Value Builder::upsample_antialiased(const Value& self, const std::vector<int64_t>& output_size, bool align_corners,
                                    std::optional<double> scales_h, std::optional<double> scales_w, bool bicubic) {
  if (self.rank() != 4 || output_size.size() != 2) fail("upsample_antialiased: needs [N, C, H, W] and two output sizes");
  const std::vector<int64_t> in{self.dims()[2], self.dims()[3]};
  if (self.type.numel() == 0 || output_size[0] * output_size[1] == 0) {
    return full(0, TensorType{self.element(), {self.dims()[0], self.dims()[1], output_size[0], output_size[1]}});
  }
  return antialias_resample(*this, self, in, output_size, align_corners, scales_h, scales_w, bicubic, false);
}

Value Builder::upsample_antialiased_backward(const Value& grad, const std::vector<int64_t>& input_size,
                                             bool align_corners, std::optional<double> scales_h,
                                             std::optional<double> scales_w, bool bicubic) {
  if (input_size.size() != 4) fail("upsample_antialiased_backward: input_size needs four sizes");
  const std::vector<int64_t> in{input_size[2], input_size[3]}, out{grad.dims()[2], grad.dims()[3]};
  if (grad.type.numel() == 0 || in[0] * in[1] == 0) return full(0, TensorType{grad.element(), input_size});
  return antialias_resample(*this, grad, in, out, align_corners, scales_h, scales_w, bicubic, true);
}

}  // namespace torchtpu::rt
