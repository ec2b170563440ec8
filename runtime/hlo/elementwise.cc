// Builder elementwise family: binary/unary/compare/select and the unary and binary math primitives.
#include "hlo/hlo_builder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "hlo/builder_internal.h"

namespace torchtpu::rt {

using namespace builder_internal;

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

// 64-bit integer division as 64 steps of shift-and-subtract on the magnitudes. XLA's own 64-bit
// division takes libtpu 5-30 s to compile for each new shape on a TPU v5e (fmod of a 5x5 int64
// tensor: 32 s; a parity test of a few dozen shapes ran for minutes); this loop compiles at once on
// every platform and is exact. The truncating quotient, or C's remainder (the dividend's sign);
// x / 0 and x % 0 give XLA's answers (-1 and x).
Value Builder::divide_64(const Value& a_in, const Value& d_in, bool remainder) {
  Builder& b = *this;
  const std::vector<int64_t> dims = broadcast_shape({&a_in, &d_in}, remainder ? "remainder" : "divide");
  const Value a = b.broadcast_to(a_in, dims), d = b.broadcast_to(d_in, dims);
  const bool is_signed = a.element() == ElementType::S64;
  const TensorType magnitude{ElementType::U64, dims};
  const Value zero = b.full(0, a.type);
  const Value a_negative = b.lt(a, zero), d_negative = b.lt(d, zero);  // unsigned: never
  // |INT64_MIN| wraps to itself, whose bits read as unsigned are 2^63: right.
  const auto abs_bits = [&](const Value& v, const Value& negative) {
    return is_signed ? b.reinterpret(b.select(negative, b.neg(v), v), ElementType::U64) : v;
  };
  // Carried: step, quotient, remainder, and the magnitudes (a while region sees only what it carries).
  const std::vector<Value> out = b.while_loop(
      {b.constant_int(0, ElementType::U64), b.full(0, magnitude), b.full(0, magnitude), abs_bits(a, a_negative),
       abs_bits(d, d_negative)},
      [](Builder& r, const std::vector<Value>& s) { return r.lt(s[0], r.constant_int(64, ElementType::U64)); },
      [&](Builder& r, const std::vector<Value>& s) {
        const Value one = r.full(1, magnitude);
        const Value bit = r.broadcast_to(r.sub(r.constant_int(63, ElementType::U64), s[0]), dims);
        const Value next_digit = r.bitwise_and(r.binary("shift_right_logical", s[3], bit), one);
        Value rest = r.bitwise_or(r.binary("shift_left", s[2], one), next_digit);
        const Value fits = r.ge(rest, s[4]);
        rest = r.select(fits, r.sub(rest, s[4]), rest);
        const Value quotient = r.select(fits, r.bitwise_or(s[1], r.binary("shift_left", one, bit)), s[1]);
        return std::vector<Value>{r.add(s[0], r.constant_int(1, ElementType::U64)), quotient, rest, s[3], s[4]};
      });
  Value quotient = b.reinterpret(out[1], a.element()), rest = b.reinterpret(out[2], a.element());
  if (is_signed) {
    quotient = b.select(b.ne(a_negative, d_negative), b.neg(quotient), quotient);
    rest = b.select(a_negative, b.neg(rest), rest);
  }
  const Value by_zero = b.eq(d, zero);
  return remainder ? b.select(by_zero, a, rest) : b.select(by_zero, b.bitwise_not(zero), quotient);
}

Value Builder::binary(const char* op, const Value& a_in, const Value& b_in) {
  if (a_in.element() != b_in.element()) {
    fail(std::string(op) + " of " + a_in.type.mlir() + " and " + b_in.type.mlir() + ": element types differ");
  }
  if ((a_in.element() == ElementType::S64 || a_in.element() == ElementType::U64) &&
      (std::strcmp(op, "divide") == 0 || std::strcmp(op, "remainder") == 0)) {
    return divide_64(a_in, b_in, op[0] == 'r');
  }
  const auto dims = broadcast_shape({&a_in, &b_in}, op);
  Value a = broadcast_to(a_in, dims), b = broadcast_to(b_in, dims);
  TensorType t{a.element(), dims};
  return emit("stablehlo." + std::string(op) + " " + name(a) + ", " + name(b) + " : " + t.mlir(), t);
}

namespace {

// IEEE sqrt is correctly rounded (XLA's CPU one is); a v5e's float32 sqrt is up to two ulps off (of
// 100,000 values 1.7% two, 40% one; result_accuracy HIGHEST does not change it). One step of this moves
// y one ulp nearer: y's neighbour replaces it where x lies past the square of their midpoint,
// (y + u/2)^2 = y^2 + y u + u^2/4: the residual x - y^2 is exact from 12-bit halves of y (x - hi^2 and its
// difference with 2 hi lo cancel exactly, Sterbenz; lo^2 is smaller), and y u is exact (u, the
// neighbour's distance, is a power of two). Within 2^-78 <= x < inf, where every piece stays normal;
// elsewhere (zero, tiny, infinite, negative, NaN) y.
Value sqrt_one_ulp_nearer(Builder& b, const Value& x, const Value& y) {
  const Value bits = b.reinterpret(y, ElementType::S32);
  const Value one = b.constant_int(1, ElementType::S32);
  const Value up = b.reinterpret(b.add(bits, one), ElementType::F32);
  const Value down = b.reinterpret(b.sub(bits, one), ElementType::F32);
  const Value hi = high_half(b, y);
  const Value lo = b.sub(y, hi);
  const Value residual =
      b.sub(b.sub(b.sub(x, b.mul(hi, hi)), b.mul(b.scalar_like(2, y), b.mul(hi, lo))), b.mul(lo, lo));
  const Value above = b.gt(residual, b.mul(y, b.sub(up, y)));
  const Value below = b.lt(residual, b.neg(b.mul(y, b.sub(y, down))));
  const Value in_range = b.bitwise_and(b.ge(x, b.scalar_like(0x1p-78, x)), b.lt(x, b.scalar_like(INFINITY, x)));
  return b.select(in_range, b.select(above, up, b.select(below, down, y)), y);
}

}  // namespace

Value Builder::unary(const char* op, const Value& v) {
  if (std::strcmp(op, "sqrt") == 0 && accurate_f32(v)) {
    // The correctly rounded float32 sqrt from one up to two ulps off: two steps. Normal x below 2^-78
    // take them on x 2^64, the root scaled back by 2^-32 (both exact).
    const Value small = lt(v, scalar_like(0x1p-78, v));
    const Value scaled = select(small, mul(v, scalar_like(0x1p64, v)), v);
    const Value plain = emit("stablehlo.sqrt " + name(scaled) + " : " + scaled.type.mlir(), scaled.type);
    const Value root = sqrt_one_ulp_nearer(*this, scaled, sqrt_one_ulp_nearer(*this, scaled, plain));
    return select(small, mul(root, scalar_like(0x1p-32, root)), root);
  }
  return emit("stablehlo." + std::string(op) + " " + name(v) + " : " + v.type.mlir(), v.type);
}

Value Builder::transcendental(const char* op, const Value& v) {
  // A TPU's fast float32 exp/log/tanh are hundreds to thousands of ulps off (log1p 4e-4 relative);
  // with result_accuracy HIGHEST they are within a few ulps at no measured cost. bfloat16 math (which
  // computes in float32 here) keeps the fast path: its error stays well under a bfloat16 ulp. XLA's
  // CPU backend accepts the attribute and is accurate either way. (Not for cbrt: libtpu fails to
  // compile it with the attribute, and its cbrt is within 4 ulps.)
  if (v.element() == ElementType::C64 && numerics_.accurate_math && std::strcmp(op, "exponential") == 0) {
    // XLA's complex64 exp on a TPU takes the fast float32 exp (1.7e-6 relative at 8.4+4.3i on a v5e,
    // past PyTorch's tolerance): e^x (cos y + i sin y) from the accurate exp, and e^x + iy where y is 0.
    const Value x = real_part(v), y = imag_part(v);
    const Value magnitude = transcendental("exponential", x);
    const Value on_real_line = eq(y, full(0, y.type));
    return complex_from(select(on_real_line, magnitude, mul(magnitude, unary("cosine", y))),
                        select(on_real_line, y, mul(magnitude, unary("sine", y))));
  }
  if (!accurate_f32(v)) return unary(op, v);
  return emit("stablehlo." + std::string(op) + " " + name(v) +
                  " {result_accuracy = #stablehlo.result_accuracy<mode = #stablehlo.result_accuracy_mode<HIGHEST>>} : " +
                  v.type.mlir(),
              v.type);
}

bool Builder::accurate_f32(const Value& v) const {
  return v.element() == ElementType::F32 && numerics_.accurate_math && nominal_element_ != ElementType::BF16;
}

Value Builder::sigmoid(const Value& v) {
  // XLA's logistic on a TPU is ~85 ulps off with or without result_accuracy. With t = exp(-|x|) (no
  // overflow): 1 / (1 + t) for x >= 0, t / (1 + t) below, a few ulps from the exact value everywhere.
  if (!accurate_f32(v)) return unary("logistic", v);
  const Value t = exp(neg(abs(v)));
  const Value r = div(scalar_like(1, v), add(scalar_like(1, v), t));
  return select(ge(v, scalar_like(0, v)), r, mul(t, r));
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
  if (is_complex(v.element())) {  // the modulus, a real value
    TensorType t{component_type(v.element()), v.dims()};
    return emit("\"stablehlo.abs\"(" + name(v) + ") : (" + v.type.mlir() + ") -> " + t.mlir(), t);
  }
  return unary("abs", v);
}

Value Builder::sign(const Value& v) {
  if (v.element() == ElementType::Pred) return v;
  if (is_complex(v.element())) {  // torch.sgn: v / |v|, 0 at 0
    const Value modulus = abs(v), zero = scalar_like(0, modulus);
    const Value at_zero = eq(modulus, zero);
    const Value unit = div(v, complex_from(select(at_zero, scalar_like(1, modulus), modulus), zero));
    return select(at_zero, scalar_like(0, v), unit);
  }
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
  // reduce_precision, not a convert there and back: with its default excess-precision setting XLA on a
  // TPU deletes f32 -> bf16 -> f32 convert pairs (a v5e's bf16 histc and div(trunc) then missed CPU's
  // roundings), while reduce_precision is an op of its own that it keeps.
  int exponent_bits = 0, mantissa_bits = 0;
  switch (nominal_element_) {
    case ElementType::BF16: exponent_bits = 8, mantissa_bits = 7; break;
    case ElementType::F16: exponent_bits = 5, mantissa_bits = 10; break;
    case ElementType::F32: exponent_bits = 8, mantissa_bits = 23; break;
    default: return convert(convert(v, nominal_element_), v.element());  // float8: no IEEE-like format
  }
  return emit("\"stablehlo.reduce_precision\"(" + name(v) + ") {exponent_bits = " + std::to_string(exponent_bits) +
                  " : i32, mantissa_bits = " + std::to_string(mantissa_bits) + " : i32} : (" + v.type.mlir() + ") -> " +
                  v.type.mlir(),
              v.type);
}

Value Builder::power(const Value& a, const Value& b) {
  if (accurate_f32(a) && b.element() == ElementType::F32) return accurate_float_power(*this, a, b);
  if (!is_signed_int(a.element())) return binary("power", a, b);
  // CPU: x ** -n is 1 for x == 1, +-1 for x == -1 (by n's parity) and 0 otherwise.
  const ElementType e = a.element();
  Value zero = constant_int(0, e), one = constant_int(1, e), minus_one = constant_int(-1, e);
  Value positive = binary("power", a, maximum(b, zero));
  Value odd = ne(bitwise_and(b, one), zero);
  Value negative = select(eq(a, one), one, select(eq(a, minus_one), select(odd, minus_one, one), zero));
  return select(lt(b, zero), broadcast_like(negative, positive), positive);
}

Value Builder::pow_scalar(const Value& a, double exponent) {
  if (is_float(a.element())) {
    if (exponent == 1) return a;  // pow(x, 2)'s gradient asks for pow(x, 1)
    if (exponent == 0) return full(1, a.type);  // 1 even for NaN, as C's pow
    if (exponent == 2) return mul(a, a);
    if (exponent == 3) return mul(mul(a, a), a);
    if (exponent == 0.5) return sqrt(a);
    if (exponent == -0.5) return rsqrt(a);
    if (exponent == -1) return div(scalar_like(1, a), a);
    if (exponent == -2) return div(scalar_like(1, a), mul(a, a));
    return power(a, scalar_like(exponent, a));
  }
  return power(a, constant_int(static_cast<int64_t>(exponent), a.element()));
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
    // CPU truncates the correctly rounded quotient (a half-precision one rounded to its dtype, unless
    // the divisor is one element). A TPU's float32 division is not correctly rounded (a v5e's bfloat16
    // trunc was one off where the quotient sat on a rounding boundary): one Newton step restores it.
    Value q = div(a, b);
    q = add(q, div(sub(a, mul(q, b)), b));
    if (b.type.numel() != 1) q = nominal(q);
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

}  // namespace torchtpu::rt
