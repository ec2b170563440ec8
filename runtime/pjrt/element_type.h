// Element types and tensor types as the runtime and the StableHLO builder see them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torchtpu::rt {

// New types go at the end: the numbering is part of cache keys.
enum class ElementType : int8_t {
  Pred, S8, S16, S32, S64, U8, U16, U32, U64, F16, BF16, F32, F64,
  C64, C128,                                          // complex: (real, imaginary) pairs of F32 / F64
  F8E4M3FN, F8E5M2, F8E4M3FNUZ, F8E5M2FNUZ,           // float8 storage formats
};

inline int element_size(ElementType t) {
  switch (t) {
    case ElementType::Pred: case ElementType::S8: case ElementType::U8: return 1;
    case ElementType::F8E4M3FN: case ElementType::F8E5M2: case ElementType::F8E4M3FNUZ: case ElementType::F8E5M2FNUZ:
      return 1;
    case ElementType::C64: return 8;
    case ElementType::C128: return 16;
    case ElementType::S16: case ElementType::U16: case ElementType::F16: case ElementType::BF16: return 2;
    case ElementType::S32: case ElementType::U32: case ElementType::F32: return 4;
    case ElementType::S64: case ElementType::U64: case ElementType::F64: return 8;
  }
  return 0;
}

// The element type's spelling in StableHLO text (`tensor<4xf32>`).
inline const char* mlir_name(ElementType t) {
  switch (t) {
    case ElementType::Pred: return "i1";
    case ElementType::S8: return "i8";
    case ElementType::S16: return "i16";
    case ElementType::S32: return "i32";
    case ElementType::S64: return "i64";
    case ElementType::U8: return "ui8";
    case ElementType::U16: return "ui16";
    case ElementType::U32: return "ui32";
    case ElementType::U64: return "ui64";
    case ElementType::F16: return "f16";
    case ElementType::BF16: return "bf16";
    case ElementType::F32: return "f32";
    case ElementType::F64: return "f64";
    case ElementType::C64: return "complex<f32>";
    case ElementType::C128: return "complex<f64>";
    case ElementType::F8E4M3FN: return "f8E4M3FN";
    case ElementType::F8E5M2: return "f8E5M2";
    case ElementType::F8E4M3FNUZ: return "f8E4M3FNUZ";
    case ElementType::F8E5M2FNUZ: return "f8E5M2FNUZ";
  }
  return "?";
}

inline bool is_float8(ElementType t) {
  return t == ElementType::F8E4M3FN || t == ElementType::F8E5M2 || t == ElementType::F8E4M3FNUZ ||
         t == ElementType::F8E5M2FNUZ;
}
// Real floating-point types (complex ones are not).
inline bool is_float(ElementType t) {
  return t == ElementType::F16 || t == ElementType::BF16 || t == ElementType::F32 || t == ElementType::F64 ||
         is_float8(t);
}
inline bool is_complex(ElementType t) { return t == ElementType::C64 || t == ElementType::C128; }
// The element type of a complex type's real and imaginary parts (a real type itself).
inline ElementType component_type(ElementType t) {
  return t == ElementType::C64 ? ElementType::F32 : t == ElementType::C128 ? ElementType::F64 : t;
}
inline ElementType complex_type_of(ElementType real) {
  return real == ElementType::F64 ? ElementType::C128 : ElementType::C64;
}
inline bool is_unsigned(ElementType t) {
  return t == ElementType::U8 || t == ElementType::U16 || t == ElementType::U32 || t == ElementType::U64;
}

struct TensorType {
  ElementType element = ElementType::F32;
  std::vector<int64_t> dims;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
  int rank() const { return static_cast<int>(dims.size()); }
  std::string mlir() const {
    std::string s = "tensor<";
    for (int64_t d : dims) s += std::to_string(d) + "x";
    return s + mlir_name(element) + ">";
  }
  bool operator==(const TensorType& o) const { return element == o.element && dims == o.dims; }
  bool operator!=(const TensorType& o) const { return !(*this == o); }
};

}  // namespace torchtpu::rt
