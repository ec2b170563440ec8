// Builder random family: uniform/normal/bernoulli draws from rng bits, multinomial, random integers and permutations.
#include "hlo/hlo_builder.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "hlo/builder_internal.h"

namespace torchtpu::rt {

using namespace builder_internal;

Value Builder::uniform01(const Value& state, const std::vector<int64_t>& dims, ElementType element) {
  const bool wide = element == ElementType::F64;
  const ElementType bits_type = wide ? ElementType::U64 : ElementType::U32;
  const ElementType float_type = wide ? ElementType::F64 : ElementType::F32;
  const TensorType bits_tensor{bits_type, dims};
  // Counter values this draw consumes (64 random bits each); every draw starts from `state`.
  random_counters_ = std::max(random_counters_, wide ? bits_tensor.numel() : (bits_tensor.numel() + 1) / 2);
  auto drawn = emit_multi("\"stablehlo.rng_bit_generator\"(" + name(state) +
                              ") {rng_algorithm = #stablehlo<rng_algorithm THREE_FRY>} : (" + state.type.mlir() +
                              ") -> (" + state.type.mlir() + ", " + bits_tensor.mlir() + ")",
                          {state.type, bits_tensor});
  // Keep the top mantissa bits under the exponent of 1.0: a float in [1, 2), then subtract 1.
  const int shift = wide ? 12 : 9;
  const int64_t one_bits = wide ? 0x3FF0000000000000LL : 0x3F800000LL;
  Value mantissa = binary("shift_right_logical", drawn[1], constant_int(shift, bits_type));
  Value in_one_two = binary("or", mantissa, constant_int(one_bits, bits_type));
  return sub(reinterpret(in_one_two, float_type), constant(1.0, float_type));
}

Value Builder::uniform(const Value& state, const Value& like, double low, double high) {
  Value u = uniform01(state, like.dims(), like.element());
  Value scaled = add(mul(u, constant(high - low, u.element())), constant(low, u.element()));
  return convert(scaled, like.element());
}

Value Builder::normal(const Value& state, const Value& like, double mean, double std) {
  // Box-Muller over two independent uniform draws (one rng call of twice the elements).
  std::vector<int64_t> twice = like.dims();
  twice.insert(twice.begin(), 2);
  Value u = uniform01(state, twice, like.element());
  std::vector<int64_t> start(twice.size(), 0), limit = twice, strides(twice.size(), 1);
  limit[0] = 1;
  Value u1 = reshape(slice(u, start, limit, strides), like.dims());
  start[0] = 1;
  limit[0] = 2;
  Value u2 = reshape(slice(u, start, limit, strides), like.dims());
  const ElementType e = u.element();
  // 1 - u1 lies in (0, 1], so the logarithm is finite.
  Value radius = sqrt(mul(constant(-2.0, e), log(sub(constant(1.0, e), u1))));
  Value z = mul(radius, unary("cosine", mul(u2, constant(6.283185307179586, e))));
  return convert(add(mul(z, constant(std, e)), constant(mean, e)), like.element());
}

Value Builder::bernoulli(const Value& state, const Value& like, double p) {
  Value u = uniform01(state, like.dims(), ElementType::F32);
  return convert(lt(u, constant(p, ElementType::F32)), like.element());
}

Value Builder::multinomial(const Value& state, const Value& probs, int64_t num_samples, bool replacement) {
  if (probs.rank() < 1 || probs.rank() > 2) fail("multinomial: probs must be 1-D or 2-D");
  const int64_t n = probs.dims().back();
  const int64_t rows = probs.rank() == 2 ? probs.dims()[0] : 1;
  const ElementType e = probs.element() == ElementType::F64 ? ElementType::F64 : ElementType::F32;
  Value log_p = log(convert(reshape(probs, {rows, n}), e));  // zero weights: -inf, never drawn
  Value indices;
  if (replacement) {
    Value u = uniform01(state, {rows, num_samples, n}, e);
    Value gumbel = neg(log(neg(log(u))));
    Value keys = add(broadcast_to(reshape(log_p, {rows, 1, n}), {rows, num_samples, n}), gumbel);
    indices = argmax(keys, {2}, false);
  } else {
    Value u = uniform01(state, {rows, n}, e);
    indices = topk(add(log_p, neg(log(neg(log(u))))), num_samples, 1, true, true);
  }
  indices = convert(indices, ElementType::S64);
  return probs.rank() == 1 ? reshape(indices, {num_samples}) : indices;
}

Value Builder::random_integers(const Value& state, const Value& like, int64_t low, int64_t high) {
  if (high <= low) fail("random_: expects 'from' to be less than 'to'");
  Value u = uniform01(state, like.dims(), ElementType::F64);
  const double span = static_cast<double>(high - low);
  // floor(low + u * span), kept below high where rounding reaches it.
  Value drawn = convert(floor(mul(u, constant(span, ElementType::F64))), ElementType::S64);
  drawn = minimum(drawn, constant_int(high - low - 1, ElementType::S64));
  return convert(add(drawn, constant_int(low, ElementType::S64)), like.element());
}

Value Builder::random_full_range(const Value& state, const Value& like) {
  int64_t inclusive_max = 0;
  switch (like.element()) {
    case ElementType::Pred: inclusive_max = 1; break;
    case ElementType::S8: inclusive_max = INT8_MAX; break;
    case ElementType::U8: inclusive_max = UINT8_MAX; break;
    case ElementType::S16: inclusive_max = INT16_MAX; break;
    case ElementType::S32: inclusive_max = INT32_MAX; break;
    case ElementType::S64: inclusive_max = INT64_MAX - 1; break;  // high = max + 1 must fit
    case ElementType::F16: inclusive_max = int64_t{1} << 11; break;
    case ElementType::BF16: inclusive_max = int64_t{1} << 8; break;
    case ElementType::F32: inclusive_max = int64_t{1} << 24; break;
    case ElementType::F64: inclusive_max = int64_t{1} << 53; break;
    default: fail("random_: not implemented for " + std::string(mlir_name(like.element())));
  }
  return random_integers(state, like, 0, inclusive_max + 1);
}

Value Builder::random_permutation(const Value& state, int64_t n) {
  return convert(sort_along(uniform01(state, {n}, ElementType::F64), 0, false, true), ElementType::S64);
}

}  // namespace torchtpu::rt
