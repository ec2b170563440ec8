// Builder op_db-gap family (specs/special.yaml, indexing.yaml, reduction.yaml): index_add-style index
// expansion, take/put, unfold_backward, gcd/lcm, diagonal, cumulative max/min, logcumsumexp, kthvalue and median.
#include "hlo/hlo_builder.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "hlo/builder_internal.h"

namespace torchtpu::rt {

using namespace builder_internal;

Value Builder::count_nonzero(const Value& v, const std::vector<int64_t>& dims) {
  const Value set = v.element() == ElementType::Pred ? v : ne(v, full(0, v.type));
  return sum(convert(set, ElementType::S64), dims, false);
}

namespace {

// v * 2^n for integral float n in [-252, 254], as two exact powers of two built from their bits (one
// alone stops at 2^127).
Value times_power_of_two(Builder& b, const Value& v, const Value& n) {
  const Value half = b.floor(b.mul(n, b.scalar_like(0.5, n)));
  auto two_to = [&](const Value& k) {  // 2^k for integral k in [-126, 127]: exponent bits k + 127
    const Value bits = b.binary("shift_left", b.add(b.convert(k, ElementType::S32), b.constant_int(127, ElementType::S32)),
                                b.constant_int(23, ElementType::S32));
    return b.reinterpret(bits, ElementType::F32);
  };
  return b.mul(b.mul(v, two_to(half)), two_to(b.sub(n, half)));
}

// 2^t for t = n + f, n = round(t) (clamped to where the result is 0 or infinite anyway), |f| <= 1/2:
// 2^f = exp(f ln 2) within an ulp, times 2^n exactly. `t_lo` is a small correction carried beside t.
Value power_of_two(Builder& b, const Value& t, const Value& t_lo) {
  const Value n = b.maximum(b.minimum(b.round(t), b.scalar_like(254, t)), b.scalar_like(-252, t));
  const Value fraction = b.exp(b.mul(b.add(b.sub(t, n), t_lo), b.scalar_like(M_LN2, t)));
  return times_power_of_two(b, fraction, n);
}

// An unevaluated sum hi + lo of two floats (about 48 bits).
struct TwoFloat {
  Value hi, lo;
};

// x * y as hi + lo to about 2^-36 of it, from 12-bit halves of each factor (high_half: their products
// are exact), and hi is a sum, not a product: a rounded product contracted into the addition that
// consumes it would be seen exact there while lo still carries its rounding, counted twice.
// (Defensive: not seen to happen on either plugin.)
TwoFloat two_product(Builder& b, const Value& x, const Value& y) {
  auto split = [&](const Value& v) {
    const Value hi = high_half(b, v);
    return TwoFloat{hi, b.sub(v, hi)};
  };
  const TwoFloat xs = split(x), ys = split(y);
  const Value leading = b.mul(xs.hi, ys.hi);  // exact
  const Value rest = b.add(b.add(b.mul(xs.hi, ys.lo), b.mul(xs.lo, ys.hi)), b.mul(xs.lo, ys.lo));
  const Value product = b.add(leading, rest);
  return {product, b.add(b.sub(leading, product), rest)};  // leading dominates: its difference is exact
}

// x + y exactly as hi + lo (Knuth's two-sum).
TwoFloat two_sum(Builder& b, const Value& x, const Value& y) {
  const Value sum = b.add(x, y);
  const Value y_part = b.sub(sum, x);
  return {sum, b.add(b.sub(x, b.sub(sum, y_part)), b.sub(y, y_part))};
}

}  // namespace

Value Builder::power_of(double base, const Value& exponent) {
  const ElementType e = exponent.element();
  if (!accurate_f32(exponent) || !(base > 0) || base == 1 || !std::isfinite(base)) {
    return power(is_float(e) || is_complex(e) ? scalar_like(base, exponent) : constant_int(static_cast<int64_t>(base), e),
                 exponent);
  }
  // The base as CPU takes it: a Scalar in a float32 op is a float32 (0.9 ** 41 from 0.9f is 1.2e-6 off 0.9's).
  const double rounded = static_cast<float>(base);
  const Value t = rounded == 2 ? exponent : mul(exponent, scalar_like(std::log2(rounded), exponent));
  return power_of_two(*this, t, scalar_like(0, t));
}

namespace builder_internal {

Value accurate_float_power(Builder& b, const Value& x, const Value& y) {  // binary ops broadcast x and y
  auto c = [&](double value) { return b.scalar_like(value, x); };
  auto i32 = [&](int64_t value) { return b.constant_int(value, ElementType::S32); };
  // |x| = 2^e m with m in [sqrt(1/2), sqrt(2)], from the bits (normal |x|; the rest takes XLA's pow).
  const Value magnitude = b.abs(x);
  const Value bits = b.reinterpret(magnitude, ElementType::S32);
  const Value mantissa = b.reinterpret(b.bitwise_or(b.bitwise_and(bits, i32(0x7FFFFF)), i32(0x3F800000)), ElementType::F32);
  const Value halve = b.gt(mantissa, c(M_SQRT2));
  const Value m = b.select(halve, b.mul(mantissa, c(0.5)), mantissa);
  const Value e = b.add(b.convert(b.sub(b.binary("shift_right_logical", bits, i32(23)), i32(127)), ElementType::F32),
                        b.select(halve, c(1), c(0)));
  // ln m = 2 atanh(s), s = (m - 1) / (m + 1) as s_hi + s_lo. m - 1 is exact; the quotient's remainder
  // (m - 1) - s_hi m - s_hi is formed exactly, its first difference exact by Sterbenz's lemma in the
  // order m picks. (Not m + 1 = u + (m - (u - 1)): XLA folds (m + 1) - 1 into m.)
  const Value numerator = b.sub(m, c(1)), denominator = b.add(m, c(1));
  const Value s_hi = b.div(numerator, denominator);
  const TwoFloat s_m = two_product(b, s_hi, m);
  const Value remainder = b.select(b.le(m, c(1)), b.sub(b.sub(numerator, s_hi), s_m.hi),
                                   b.sub(b.sub(numerator, s_m.hi), s_hi));
  const Value s_lo = b.div(b.sub(remainder, s_m.lo), denominator);
  // 2 atanh(s) - 2s = s^3 (2/3 + 2/5 s^2 + ...): |s| <= 0.172, seven terms reach 1e-10 of ln m.
  const Value s2 = b.mul(s_hi, s_hi);
  Value series = c(0);
  for (int k = 15; k >= 3; k -= 2) series = b.add(b.mul(series, s2), c(2.0 / k));
  const Value ln_hi = b.mul(c(2), s_hi);
  const Value ln_lo = b.add(b.mul(c(2), s_lo), b.mul(b.mul(s2, s_hi), series));
  // log2 |x| = e + ln m / ln 2, with 1 / ln 2 = k_hi + k_lo.
  const double k_hi = static_cast<float>(1 / M_LN2), k_lo = 1 / M_LN2 - k_hi;
  const TwoFloat log2_m = two_product(b, ln_hi, c(k_hi));
  const Value log2_m_lo = b.add(log2_m.lo, b.add(b.mul(ln_hi, c(k_lo)), b.mul(ln_lo, c(k_hi))));
  const TwoFloat log2_x = two_sum(b, e, log2_m.hi);
  // t = y log2|x| as t_hi + t_lo, then 2^t.
  const TwoFloat t = two_product(b, y, log2_x.hi);
  const Value t_lo = b.add(t.lo, b.mul(y, b.add(log2_x.lo, log2_m_lo)));
  const Value unsigned_power = power_of_two(b, t.hi, t_lo);
  // A negative base: an odd integral exponent gives a negative power, a non-integral one NaN (XLA's).
  const Value integral = b.eq(b.floor(y), y);
  const Value half_y = b.mul(y, c(0.5));
  const Value odd = b.bitwise_and(integral, b.ne(b.floor(half_y), half_y));
  const Value power = b.select(b.bitwise_and(b.lt(x, c(0)), odd), b.neg(unsigned_power), unsigned_power);
  const Value ordinary = b.bitwise_and(
      b.bitwise_and(b.ge(magnitude, c(std::ldexp(1.0, -126))), b.le(magnitude, c(3.4028234663852886e38))),
      b.bitwise_and(b.lt(b.abs(y), c(std::ldexp(1.0, 100))), b.bitwise_or(b.gt(x, c(0)), integral)));
  return b.select(ordinary, power, b.binary("power", x, y));
}

}  // namespace builder_internal

Value Builder::expand_index(const Value& index, int64_t dim_in, const Value& like) {
  if (like.rank() == 0) return reshape(index, {});
  const int64_t dim = wrap_dim(dim_in, like.rank(), "index_add");
  std::vector<int64_t> shape(like.rank(), 1);
  shape[dim] = index.type.numel();
  std::vector<int64_t> target = like.dims();
  target[dim] = index.type.numel();
  const Value size = constant_int(like.dims()[dim], index.element());
  const Value wrapped = select(lt(index, constant_int(0, index.element())), add(index, size), index);
  return broadcast_to(reshape(wrapped, shape), target);
}

Value Builder::take(const Value& v, const Value& index) {
  const int64_t n = v.type.numel();
  Value flat_v = reshape(v, {n});
  Value i = convert(reshape(index, {index.type.numel()}), ElementType::S64);
  i = select(lt(i, constant_int(0, ElementType::S64)), add(i, constant_int(n, ElementType::S64)), i);
  if (index.type.numel() == 0 || n == 0) return full(0, TensorType{v.element(), index.dims()});
  return reshape(gather_flat(flat_v, i), index.dims());
}

Value Builder::put(const Value& v, const Value& index, const Value& source, bool accumulate) {
  const int64_t n = v.type.numel(), k = index.type.numel();
  if (k == 0 || n == 0) return v;
  Value i = convert(reshape(index, {k}), ElementType::S64);
  i = select(lt(i, constant_int(0, ElementType::S64)), add(i, constant_int(n, ElementType::S64)), i);
  Value src = reshape(convert(source, v.element()), {source.type.numel()});
  if (src.type.numel() != k) src = slice(src, {0}, {k}, {1});
  Value flat_v = reshape(v, {n});
  if (accumulate) return reshape(scatter_along(flat_v, 0, i, src, "add"), v.dims());
  return reshape(scatter_along(flat_v, 0, i, src, ""), v.dims());
}

Value Builder::unfold_backward(const Value& grad, const std::vector<int64_t>& input_sizes, int64_t dim_in,
                               int64_t size, int64_t step) {
  const int64_t rank = static_cast<int64_t>(input_sizes.size());
  if (rank == 0) return reshape(grad, {});  // a 0-d input unfolds to one window of one element
  const int64_t dim = wrap_dim(dim_in, rank, "unfold_backward");
  Value zeros = full(0, TensorType{grad.element(), input_sizes});
  if (grad.type.numel() == 0) return zeros;
  // Windows [.., w, .., k] -> [.., w, k, ..]: flattening w and k lists the elements at w * step + k.
  std::vector<int64_t> permutation;
  for (int64_t d = 0; d <= dim; ++d) permutation.push_back(d);
  permutation.push_back(rank);
  for (int64_t d = dim + 1; d < rank; ++d) permutation.push_back(d);
  const Value windows = transpose(grad, permutation);
  const TensorType positions_type{ElementType::S64, windows.dims()};
  const Value positions = add(mul(iota(positions_type, dim), full(static_cast<double>(step), positions_type)),
                              iota(positions_type, dim + 1));
  std::vector<int64_t> merged = windows.dims();
  merged[dim] *= merged[dim + 1];
  merged.erase(merged.begin() + dim + 1);
  return scatter_along(zeros, dim, reshape(positions, merged), reshape(windows, merged), "add");
}

Value Builder::gcd(const Value& a, const Value& b) {
  const Value zeros = add(mul(a, scalar_like(0, a)), mul(b, scalar_like(0, b)));  // the broadcast shape
  const std::vector<Value> out = while_loop(
      {abs(add(a, zeros)), abs(add(b, zeros))},
      [](Builder& r, const std::vector<Value>& s) { return r.any(r.ne(s[0], r.full(0, s[0].type)), {}, false, true); },
      [](Builder& r, const std::vector<Value>& s) {
        const Value zero = r.full(0, s[0].type);
        const Value live = r.ne(s[0], zero);  // finished elements keep their gcd in s[1]
        const Value divisor = r.select(live, s[0], r.full(1, s[0].type));
        return std::vector<Value>{r.select(live, r.fmod(s[1], divisor), zero), r.select(live, s[0], s[1])};
      });
  return out[1];
}

Value Builder::lcm(const Value& a, const Value& b) {
  const Value divisor = gcd(a, b);
  const Value zero = full(0, divisor.type);
  const Value none = eq(divisor, zero);
  return select(none, zero, abs(mul(div(a, select(none, full(1, divisor.type), divisor)), b)));
}

Value Builder::diagonal(const Value& v, int64_t offset, int64_t dim1_in, int64_t dim2_in) {
  const int64_t dim1 = wrap_dim(dim1_in, v.rank(), "diagonal"), dim2 = wrap_dim(dim2_in, v.rank(), "diagonal");
  if (dim1 == dim2) fail("diagonal: dimensions cannot be identical");
  std::vector<int64_t> perm, batch;
  for (int d = 0; d < v.rank(); ++d) {
    if (d != dim1 && d != dim2) {
      perm.push_back(d);
      batch.push_back(v.dims()[d]);
    }
  }
  perm.push_back(dim1);
  perm.push_back(dim2);
  const int64_t rows = v.dims()[dim1], cols = v.dims()[dim2];
  const int64_t length = std::max<int64_t>(0, offset >= 0 ? std::min(rows, cols - offset) : std::min(rows + offset, cols));
  std::vector<int64_t> out = batch;
  out.push_back(length);
  if (length == 0) return full(0, TensorType{v.element(), out});
  Value t = transpose(v, perm);
  std::vector<int64_t> flat_dims = batch;
  flat_dims.push_back(rows * cols);
  t = reshape(t, flat_dims);
  const int64_t start = offset >= 0 ? offset : -offset * cols;
  std::vector<int64_t> s(batch.size() + 1, 0), l = flat_dims, st(batch.size() + 1, 1);
  s.back() = start;
  l.back() = start + (length - 1) * (cols + 1) + 1;
  st.back() = cols + 1;
  return slice(t, s, l, st);
}

Value Builder::cumulative_extreme(const Value& v, int64_t dim_in, bool max, bool indices) {
  const TensorType index_type{ElementType::S64, v.dims()};
  if (v.rank() == 0) return indices ? constant_int(0, ElementType::S64) : v;
  const int64_t dim = wrap_dim(dim_in, v.rank(), "cummax");
  const int64_t n = v.dims()[dim];
  Value x = v, idx = iota(index_type, dim);
  if (v.type.numel() == 0) return indices ? full(0, index_type) : v;
  const bool floating = is_float(v.element());
  // Combining an earlier segment (a) with a later one (b): b wins where it is NaN, or where neither is
  // NaN and it is >= (cummax) / <= (cummin) a: CPU keeps the last extreme and the last NaN.
  for (int64_t k = 1; k < n; k *= 2) {
    std::vector<int64_t> pad = v.dims(), start(v.rank(), 0), limit = v.dims(), strides(v.rank(), 1);
    pad[dim] = k;
    limit[dim] = n - k;
    Value a = concatenate({broadcast_to(extreme_constant(*this, v.element(), max), pad), slice(x, start, limit, strides)},
                          dim);
    Value ai = concatenate({full(-1, TensorType{ElementType::S64, pad}), slice(idx, start, limit, strides)}, dim);
    Value b_wins = max ? ge(x, a) : le(x, a);
    if (floating) b_wins = bitwise_or(isnan(x), bitwise_and(bitwise_not(isnan(a)), b_wins));
    x = select(b_wins, x, a);
    idx = select(b_wins, idx, ai);
  }
  return indices ? idx : x;
}

Value Builder::logcumsumexp(const Value& v, int64_t dim_in) {
  if (v.rank() == 0) return v;
  const int64_t dim = wrap_dim(dim_in, v.rank(), "logcumsumexp");
  const int64_t n = v.dims()[dim];
  Value x = v;
  for (int64_t k = 1; k < n; k *= 2) {
    std::vector<int64_t> pad = v.dims(), start(v.rank(), 0), limit = v.dims(), strides(v.rank(), 1);
    pad[dim] = k;
    limit[dim] = n - k;
    Value a = concatenate({full(-HUGE_VAL, TensorType{v.element(), pad}), slice(x, start, limit, strides)}, dim);
    x = logaddexp(a, x);
  }
  return x;
}

Value Builder::logaddexp(const Value& a, const Value& b) {
  // max + log1p(exp(-|a - b|)); equal operands (both infinite included) give a + log 2.
  const Value m = maximum(a, b);
  const Value spread = log1p(exp(neg(abs(sub(a, b)))));
  return select(eq(a, b), add(a, scalar_like(M_LN2, a)), add(m, spread));
}

Value Builder::kth_along(const Value& v, const Value& k, int64_t dim_in, bool keepdim, bool indices) {
  // The sorted position `k` (a 0-d or a keepdim-shaped int64 tensor) of each row along dim.
  if (v.rank() == 0) return indices ? constant_int(0, ElementType::S64) : v;
  const int64_t dim = wrap_dim(dim_in, v.rank(), "kthvalue");
  Value sorted = sort_along(v, dim, false, indices);
  std::vector<int64_t> one = v.dims();
  one[dim] = 1;
  Value position = broadcast_to(convert(k, ElementType::S64), one);
  Value picked = take_along(sorted, dim, position);
  if (keepdim) return picked;
  std::vector<int64_t> out;
  for (int d = 0; d < v.rank(); ++d) {
    if (d != dim) out.push_back(v.dims()[d]);
  }
  return reshape(picked, out);
}

Value Builder::kthvalue(const Value& v, int64_t k, int64_t dim, bool keepdim, bool indices) {
  return kth_along(v, constant_int(k - 1, ElementType::S64), dim, keepdim, indices);
}

Value Builder::mode(const Value& v_in, int64_t dim_in, bool keepdim, bool indices) {
  const Value v = v_in.rank() == 0 ? reshape(v_in, {1}) : v_in;
  const int64_t dim = wrap_dim(dim_in, v.rank(), "mode"), n = v.dims()[dim], r = v.rank();
  if (n == 0) fail("mode(): Expected reduction dim " + std::to_string(dim) + " to have non-zero size.");
  // Counting by pairwise equality along `dim` (moved last): n^2 compares a row, no sort. CPU's choice
  // among equally frequent values is the smallest; its index, the value's last position.
  std::vector<int64_t> permutation;
  for (int64_t d = 0; d < r; ++d) {
    if (d != dim) permutation.push_back(d);
  }
  permutation.push_back(dim);
  const Value x = transpose(v, permutation);
  std::vector<int64_t> pairs = x.dims(), rows = x.dims(), cols = x.dims();
  pairs.push_back(n);
  rows.push_back(1);
  cols.insert(cols.end() - 1, 1);
  const Value equal = eq(broadcast_to(reshape(x, rows), pairs), broadcast_to(reshape(x, cols), pairs));
  const Value count = reduce(convert(equal, ElementType::S64), {r}, "add", 0);  // x.dims()
  std::vector<int64_t> one_per_row = x.dims();
  one_per_row.back() = 1;
  const Value most = broadcast_to(reshape(reduce(count, {r - 1}, "maximum", 0), one_per_row), x.dims());
  const bool boolean = x.element() == ElementType::Pred;
  const Value candidates = select(eq(count, most), x, broadcast_to(extreme_constant(*this, x.element(), false), x.dims()));
  const Value smallest = boolean ? reduce(candidates, {r - 1}, "and", 1)
                                 : reduce_from(candidates, {r - 1}, "minimum", extreme_constant(*this, x.element(), false));
  const Value positions = iota(TensorType{ElementType::S64, x.dims()}, r - 1);
  const Value at_mode = eq(x, broadcast_to(reshape(smallest, one_per_row), x.dims()));
  Value index = reshape(reduce_from(select(at_mode, positions, broadcast_to(constant_int(0, ElementType::S64), x.dims())),
                                    {r - 1}, "maximum", constant_int(0, ElementType::S64)), one_per_row);
  Value result = indices ? index : take_along(x, r - 1, index);  // the element itself (its -0.0 or 0.0)
  // Back to v's layout, `dim` kept as 1 or dropped.
  std::vector<int64_t> kept = v.dims();
  kept[dim] = 1;
  std::vector<int64_t> inverse(r);
  for (int64_t d = 0; d < r; ++d) inverse[permutation[d]] = d;
  result = transpose(result, inverse);
  if (v_in.rank() == 0) return reshape(result, {});
  if (keepdim) return result;
  kept.erase(kept.begin() + dim);
  return reshape(result, kept);
}

Value Builder::median(const Value& v_in, int64_t dim_in, bool all_dims, bool keepdim, bool ignore_nan, bool indices) {
  Value v = all_dims ? reshape(v_in, {v_in.type.numel()}) : v_in;
  if (v.rank() == 0) return indices ? constant_int(0, ElementType::S64) : v;
  const int64_t dim = all_dims ? 0 : wrap_dim(dim_in, v.rank(), "median");
  const int64_t n = v.dims()[dim];
  // Sorted ascending, NaNs last: the lower median of the non-NaN values is position (count - 1) / 2.
  // median: a row with a NaN gives its first NaN (position count); nanmedian ignores NaNs (an all-NaN
  // row gives position 0: NaN).
  Value position;
  if (is_float(v.element())) {
    Value count = sum(convert(bitwise_not(isnan(v)), ElementType::S64), {dim}, true);
    Value lower = div(sub(count, constant_int(1, ElementType::S64)), constant_int(2, ElementType::S64));
    lower = maximum(lower, constant_int(0, ElementType::S64));
    position = ignore_nan ? lower : select(lt(count, constant_int(n, ElementType::S64)), count, lower);
  } else {
    position = constant_int((n - 1) / 2, ElementType::S64);
  }
  Value r = kth_along(v, position, dim, true, indices);
  if (all_dims) return reshape(r, {});
  if (keepdim) return r;
  std::vector<int64_t> out;
  for (int d = 0; d < v.rank(); ++d) {
    if (d != dim) out.push_back(v.dims()[d]);
  }
  return reshape(r, out);
}

}  // namespace torchtpu::rt
