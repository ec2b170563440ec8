// Builder complex family: real/imaginary parts, conjugates, and PyTorch's FFT ops on stablehlo.fft.
#include "hlo/hlo_builder.h"

#include <cmath>
#include <numeric>

#include "hlo/builder_internal.h"

namespace torchtpu::rt {

using namespace builder_internal;

Value Builder::real_part(const Value& v) {
  if (!is_complex(v.element())) return v;
  TensorType t{component_type(v.element()), v.dims()};
  return emit("\"stablehlo.real\"(" + name(v) + ") : (" + v.type.mlir() + ") -> " + t.mlir(), t);
}

Value Builder::imag_part(const Value& v) {
  if (!is_complex(v.element())) return full(0, v.type);
  TensorType t{component_type(v.element()), v.dims()};
  return emit("\"stablehlo.imag\"(" + name(v) + ") : (" + v.type.mlir() + ") -> " + t.mlir(), t);
}

Value Builder::complex_from(const Value& re_in, const Value& im_in) {
  if (re_in.element() != im_in.element()) fail("complex: parts of different element types");
  // XLA's complex types have F32 or F64 parts: narrower floats and integers go through F32.
  const ElementType part = re_in.element() == ElementType::F64 ? ElementType::F64 : ElementType::F32;
  const auto dims = broadcast_shape({&re_in, &im_in}, "complex");
  const Value re = broadcast_to(convert(re_in, part), dims), im = broadcast_to(convert(im_in, part), dims);
  TensorType t{complex_type_of(part), dims};
  return emit("\"stablehlo.complex\"(" + name(re) + ", " + name(im) + ") : (" + re.type.mlir() + ", " + im.type.mlir() +
                  ") -> " + t.mlir(),
              t);
}

Value Builder::conj_of(const Value& v) {
  if (!is_complex(v.element())) return v;
  return complex_from(real_part(v), neg(imag_part(v)));
}

Value Builder::angle(const Value& v) {
  if (is_complex(v.element())) return atan2(imag_part(v), real_part(v));
  // Real: pi where negative, else 0; NaN stays NaN (CPU's angle).
  const Value zero = scalar_like(0, v);
  const Value turned = select(lt(v, zero), scalar_like(M_PI, v), zero);
  return is_float(v.element()) ? select(isnan(v), v, turned) : turned;
}

Value Builder::fft_last(const Value& v, const char* type, int64_t length) {
  TensorType t = v.type;
  const std::string kind = type;
  if (kind == "RFFT") {
    t = TensorType{complex_type_of(v.element()), v.dims()};
    t.dims.back() = length / 2 + 1;
  } else if (kind == "IRFFT") {
    t = TensorType{component_type(v.element()), v.dims()};
    t.dims.back() = length;
  }
  return emit("\"stablehlo.fft\"(" + name(v) + ") {fft_type = #stablehlo<fft_type " + kind +
                  ">, fft_length = array<i64: " + std::to_string(length) + ">} : (" + v.type.mlir() + ") -> " +
                  t.mlir(),
              t);
}

namespace {

// The permutation that swaps dim d with the last one (its own inverse).
std::vector<int64_t> swap_with_last(int rank, int64_t d) {
  std::vector<int64_t> p(rank);
  std::iota(p.begin(), p.end(), 0);
  std::swap(p[d], p[rank - 1]);
  return p;
}

// The factor PyTorch's normalization mode applies for a signal of n elements.
double norm_factor(int64_t normalization, double n) {
  if (normalization == 1) return 1 / std::sqrt(n);
  if (normalization == 2) return 1 / n;
  return 1;
}

std::vector<int64_t> wrapped_dims(const std::vector<int64_t>& dims, int rank, const char* op) {
  std::vector<int64_t> out;
  for (int64_t d : dims) out.push_back(wrap_dim(d, rank, op));
  return out;
}

}  // namespace

Value Builder::fft_c2c(const Value& v_in, const std::vector<int64_t>& dims_in, int64_t normalization, bool forward) {
  Value v = is_complex(v_in.element()) ? v_in : convert(v_in, complex_type_of(v_in.element()));
  const std::vector<int64_t> dims = wrapped_dims(dims_in, v.rank(), "fft");
  double n = 1;
  for (int64_t d : dims) {
    const int64_t size = v.dims()[d];
    n *= static_cast<double>(size);
    if (size == 0) continue;
    const auto p = swap_with_last(v.rank(), d);
    v = transpose(fft_last(transpose(v, p), forward ? "FFT" : "IFFT", size), p);
  }
  // stablehlo's IFFT divides by n; PyTorch's normalization alone decides the scale.
  const double scale = (forward ? 1 : n) * norm_factor(normalization, n);
  return scale == 1 ? v : mul(v, scalar_like(scale, v));
}

Value Builder::fft_r2c(const Value& v, const std::vector<int64_t>& dims_in, int64_t normalization, bool onesided) {
  const std::vector<int64_t> dims = wrapped_dims(dims_in, v.rank(), "fft_r2c");
  Value out = fft_c2c(v, dims, normalization, /*forward=*/true);
  if (!onesided || dims.empty()) return out;
  // The last transformed dim keeps its first n/2 + 1 entries (the rest are their conjugates).
  const int64_t last = dims.back();
  std::vector<int64_t> start(out.rank(), 0), limit = out.dims(), steps(out.rank(), 1);
  limit[last] = out.dims()[last] / 2 + 1;
  return slice(out, start, limit, steps);
}

Value Builder::fft_c2r(const Value& v_in, const std::vector<int64_t>& dims_in, int64_t normalization,
                       int64_t last_dim_size) {
  Value v = is_complex(v_in.element()) ? v_in : convert(v_in, complex_type_of(v_in.element()));
  const std::vector<int64_t> dims = wrapped_dims(dims_in, v.rank(), "fft_c2r");
  if (dims.empty()) fail("fft_c2r: no dims to transform");
  // Every dim but the last as a complex inverse transform (unnormalized), then a real inverse
  // transform of the last one from its n/2 + 1 leading entries.
  const std::vector<int64_t> leading(dims.begin(), dims.end() - 1);
  v = fft_c2c(v, leading, 0, /*forward=*/false);
  double n = 1;
  for (int64_t d : leading) n *= static_cast<double>(v.dims()[d]);
  const int64_t last = dims.back();
  const int64_t half = last_dim_size / 2 + 1;
  if (v.dims()[last] > half) {
    std::vector<int64_t> start(v.rank(), 0), limit = v.dims(), steps(v.rank(), 1);
    limit[last] = half;
    v = slice(v, start, limit, steps);
  } else if (v.dims()[last] < half) {  // missing entries are zeros
    TensorType pad = v.type;
    pad.dims[last] = half - v.dims()[last];
    v = concatenate({v, full(0, pad)}, last);
  }
  const auto p = swap_with_last(v.rank(), last);
  Value out = transpose(fft_last(transpose(v, p), "IRFFT", last_dim_size), p);
  n *= static_cast<double>(last_dim_size);
  // stablehlo's IRFFT divides by the last dim's length; undo it and apply PyTorch's normalization.
  const double scale = static_cast<double>(last_dim_size) * norm_factor(normalization, n);
  return scale == 1 ? out : mul(out, scalar_like(scale, out));
}

}  // namespace torchtpu::rt
