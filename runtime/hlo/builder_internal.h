// Helpers shared by the builder's op families (hlo/*.cc); internal to the builder, not part of its interface.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
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

}  // namespace torchtpu::rt::builder_internal
