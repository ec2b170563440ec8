// Helpers shared by the builder's op families (hlo/*.cc); internal to the builder, not part of its interface.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "hlo/hlo_builder.h"
#include "pjrt/element_type.h"

namespace torchtpu::rt::builder_internal {

inline std::string join(const std::vector<int64_t>& values) {
  std::string s;
  for (size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + std::to_string(values[i]);
  return s;
}

inline std::string i64_array(const std::vector<int64_t>& values) {
  return values.empty() ? "array<i64>" : "array<i64: " + join(values) + ">";
}

inline std::string list(const std::vector<int64_t>& values) { return "[" + join(values) + "]"; }

// How a float literal is spelled exactly: its bit pattern in hex.
inline std::string float_literal(double value, ElementType element) {
  char buf[32];
  if (element == ElementType::F64) {
    uint64_t bits;
    std::memcpy(&bits, &value, 8);
    std::snprintf(buf, sizeof buf, "0x%016llX", static_cast<unsigned long long>(bits));
  } else {
    const float f = static_cast<float>(value);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    std::snprintf(buf, sizeof buf, "0x%08X", bits);
  }
  return buf;
}

inline const char* compare_type(ElementType e) {
  if (is_float(e)) return "FLOAT";
  if (e == ElementType::Pred || is_unsigned(e)) return "UNSIGNED";
  return "SIGNED";
}

// x ** y for float32 operands in accurate mode (special.cc): y log2|x| carried in two floats, so the
// result is within ~2 ulps where XLA's pow, exp(y log x), is off by |y log x| ulps (and a TPU's log is
// its fast one).
Value accurate_float_power(Builder& b, const Value& x, const Value& y);

[[noreturn]] inline void fail(const std::string& message) { throw std::invalid_argument("torchtpu builder: " + message); }

// `dim` (negative: from the end) as an index into a rank-`rank` shape; a 0-d value, as in PyTorch,
// takes dim 0 or -1.
inline int64_t wrap_dim(int64_t dim, int rank, const char* op) {
  const int64_t wrapped = dim < 0 ? dim + std::max(rank, 1) : dim;
  if (wrapped < 0 || wrapped >= std::max(rank, 1)) fail(std::string(op) + ": dimension out of range");
  return wrapped;
}

inline int bits_of(ElementType e) { return element_size(e) * 8; }

// The smallest (lowest = true) or largest value of an element type, exactly.
inline Value extreme_constant(Builder& b, ElementType e, bool lowest) {
  if (is_float(e)) return b.constant(lowest ? -HUGE_VAL : HUGE_VAL, e);
  if (e == ElementType::Pred) return b.constant_int(lowest ? 0 : 1, e);
  if (is_unsigned(e)) return b.constant_int(lowest ? 0 : static_cast<int64_t>((uint64_t{1} << bits_of(e)) - 1), e);
  const int64_t max = bits_of(e) == 64 ? INT64_MAX : (int64_t{1} << (bits_of(e) - 1)) - 1;
  return b.constant_int(lowest ? -max - 1 : max, e);
}

// The product of dims[from, to): an element count.
inline int64_t product(const std::vector<int64_t>& dims, size_t from = 0, size_t to = SIZE_MAX) {
  int64_t n = 1;
  for (size_t i = from; i < std::min(to, dims.size()); ++i) n *= dims[i];
  return n;
}

// A 1-D int64 constant of `values`.
inline Value i64_vector(Builder& b, const std::vector<int64_t>& values) {
  return b.dense_constant("[" + join(values) + "]", TensorType{ElementType::S64, {static_cast<int64_t>(values.size())}});
}

// body(i, state) for i = 0 .. count-1 (count: a 0-d int64), as a stablehlo.while. The body sees only
// its arguments: anything it needs from outside travels in `state` (unchanged where it only reads it).
using LoopBody = std::function<std::vector<Value>(Builder&, const Value&, const std::vector<Value>&)>;

inline std::vector<Value> for_loop(Builder& b, const Value& count, const std::vector<Value>& state, const LoopBody& body) {
  std::vector<Value> init{b.constant_int(0, ElementType::S64), count};
  init.insert(init.end(), state.begin(), state.end());
  auto out = b.while_loop(
      init, [](Builder& r, const std::vector<Value>& s) { return r.lt(s[0], s[1]); },
      [&](Builder& r, const std::vector<Value>& s) {
        std::vector<Value> next = body(r, s[0], std::vector<Value>(s.begin() + 2, s.end()));
        std::vector<Value> all{r.add(s[0], r.constant_int(1, ElementType::S64)), s[1]};
        all.insert(all.end(), next.begin(), next.end());
        return all;
      });
  return std::vector<Value>(out.begin() + 2, out.end());
}

inline std::vector<Value> for_loop(Builder& b, int64_t count, const std::vector<Value>& state, const LoopBody& body) {
  return for_loop(b, b.constant_int(count, ElementType::S64), state, body);
}

// A float32 v with its low 12 mantissa bits cleared: 12 significant bits, so a product of two such
// halves (or of one and v - it) is exact in float32. (Veltkamp's c - (c - v), c = 4097 v, is another
// split if a backend contracts it into a multiply-add.)
inline Value high_half(Builder& b, const Value& v) {
  const Value bits = b.reinterpret(v, ElementType::S32);
  return b.reinterpret(b.bitwise_and(bits, b.constant_int(~int64_t{0xFFF}, ElementType::S32)), ElementType::F32);
}

}  // namespace torchtpu::rt::builder_internal
