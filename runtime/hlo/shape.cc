// Builder shape family: flip, roll, repeat, tril/triu, pads and their gradients, sort/topk, arange/linspace/eye.
#include "hlo/hlo_builder.h"

#include <algorithm>
#include <cmath>

#include "hlo/builder_internal.h"

namespace torchtpu::rt {

using namespace builder_internal;

namespace {

int64_t shape_dim(int64_t dim, int rank, const char* op) {
  const int64_t wrapped = dim < 0 ? dim + rank : dim;
  if (wrapped < 0 || wrapped >= rank) fail(std::string(op) + ": dimension out of range");
  return wrapped;
}

// [lo, hi) of v along dim.
Value slice_dim(Builder& b, const Value& v, int64_t dim, int64_t lo, int64_t hi) {
  std::vector<int64_t> start(v.rank(), 0), limit = v.dims(), strides(v.rank(), 1);
  start[dim] = lo;
  limit[dim] = hi;
  return b.slice(v, start, limit, strides);
}

// For each padded dim (the last first), the source position of every output position (int64 [out]):
// reflect or clamp (i - before) into [0, n).
Value pad_source(Builder& b, int64_t n, int64_t before, int64_t after, bool reflect) {
  const int64_t out = n + before + after;
  Value i = b.sub(b.iota(TensorType{ElementType::S64, {out}}, 0), b.constant_int(before, ElementType::S64));
  const Value last = b.constant_int(n - 1, ElementType::S64);
  if (reflect) return b.sub(last, b.unary("abs", b.sub(last, b.unary("abs", i))));
  return b.binary("minimum", b.binary("maximum", i, b.constant_int(0, ElementType::S64)), last);
}

Value pad_gather(Builder& b, const Value& v, const std::vector<int64_t>& padding, bool reflect) {
  if (padding.size() % 2 || static_cast<int>(padding.size() / 2) > v.rank()) fail("pad: bad padding length");
  Value x = v;
  for (size_t i = 0; i < padding.size() / 2; ++i) {
    const int64_t dim = v.rank() - 1 - static_cast<int64_t>(i);
    x = b.index_select(x, dim, pad_source(b, v.dims()[dim], padding[2 * i], padding[2 * i + 1], reflect));
  }
  return x;
}

// The transpose of pad_gather: grad's elements added back to their source positions, dim by dim.
Value pad_scatter(Builder& b, const Value& grad, const Value& self, const std::vector<int64_t>& padding, bool reflect) {
  if (padding.size() % 2 || static_cast<int>(padding.size() / 2) > self.rank()) fail("pad: bad padding length");
  Value g = grad;
  for (size_t k = padding.size() / 2; k-- > 0;) {
    const int64_t dim = self.rank() - 1 - static_cast<int64_t>(k);
    std::vector<int64_t> target = g.dims();
    target[dim] = self.dims()[dim];
    Value source = pad_source(b, self.dims()[dim], padding[2 * k], padding[2 * k + 1], reflect);
    Value index = b.broadcast_in_dim(source, g.dims(), {dim});
    g = b.scatter_along(b.full(0, TensorType{g.element(), target}), dim, index, g, "add");
  }
  return g;
}

}  // namespace

Value Builder::flip(const Value& v, const std::vector<int64_t>& dims_in) {
  std::vector<int64_t> dims;
  for (int64_t d : dims_in) {
    if (v.rank() == 0) continue;
    const int64_t w = shape_dim(d, v.rank(), "flip");
    if (!std::count(dims.begin(), dims.end(), w)) dims.push_back(w);
  }
  if (dims.empty() || v.type.numel() == 0) return v;
  std::sort(dims.begin(), dims.end());
  return emit("\"stablehlo.reverse\"(" + name(v) + ") {dimensions = " + i64_array(dims) + "} : (" + v.type.mlir() +
                  ") -> " + v.type.mlir(),
              v.type);
}

Value Builder::roll(const Value& v, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims) {
  if (dims.empty()) {
    if (v.rank() == 0) return v;
    return reshape(roll(reshape(v, {v.type.numel()}), shifts, {0}), v.dims());
  }
  if (shifts.size() != dims.size()) fail("roll: shifts and dims differ in length");
  Value x = v;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (v.rank() == 0) continue;
    const int64_t dim = shape_dim(dims[i], v.rank(), "roll");
    const int64_t n = v.dims()[dim];
    if (n == 0) continue;
    const int64_t s = ((shifts[i] % n) + n) % n;
    if (s == 0) continue;
    x = concatenate({slice_dim(*this, x, dim, n - s, n), slice_dim(*this, x, dim, 0, n - s)}, dim);
  }
  return x;
}

Value Builder::repeat(const Value& v, const std::vector<int64_t>& repeats) {
  const int r = static_cast<int>(repeats.size());
  if (r < v.rank()) fail("repeat: fewer repeats than dims");
  std::vector<int64_t> padded(r - v.rank(), 1);
  padded.insert(padded.end(), v.dims().begin(), v.dims().end());
  std::vector<int64_t> interleaved, mapping, out;
  for (int i = 0; i < r; ++i) {
    interleaved.push_back(repeats[i]);
    interleaved.push_back(padded[i]);
    mapping.push_back(2 * i + 1);
    out.push_back(repeats[i] * padded[i]);
  }
  return reshape(broadcast_in_dim(reshape(v, padded), interleaved, mapping), out);
}

namespace {

// True where col - row <= diagonal (lower) or >= diagonal (upper), over v's last two dims.
Value triangle(Builder& b, const Value& v, int64_t diagonal, bool lower) {
  if (v.rank() < 2) fail("tril/triu: the input has fewer than 2 dims");
  const int64_t rows = v.dims()[v.rank() - 2], cols = v.dims()[v.rank() - 1];
  const TensorType t{ElementType::S64, {rows, cols}};
  Value offset = b.sub(b.iota(t, 1), b.iota(t, 0));
  Value keep = lower ? b.le(offset, b.constant_int(diagonal, ElementType::S64))
                     : b.ge(offset, b.constant_int(diagonal, ElementType::S64));
  return b.select(keep, v, b.scalar_like(0, v));
}

}  // namespace

Value Builder::tril(const Value& v, int64_t diagonal) { return triangle(*this, v, diagonal, true); }
Value Builder::triu(const Value& v, int64_t diagonal) { return triangle(*this, v, diagonal, false); }

Value Builder::constant_pad(const Value& v, const std::vector<int64_t>& pad, const Value& value) {
  if (pad.size() % 2 || static_cast<int>(pad.size() / 2) > v.rank()) fail("constant_pad: bad padding length");
  std::vector<int64_t> low(v.rank(), 0), high(v.rank(), 0), interior(v.rank(), 0);
  std::vector<int64_t> dims = v.dims();
  for (size_t i = 0; i < pad.size() / 2; ++i) {
    const int64_t d = v.rank() - 1 - static_cast<int64_t>(i);
    low[d] = pad[2 * i];
    high[d] = pad[2 * i + 1];
    dims[d] += low[d] + high[d];
  }
  Value fill = convert(value, v.element());
  TensorType t{v.element(), dims};
  if (t.numel() == 0) return full(0, t);
  if (v.type.numel() == 0) return broadcast_to(fill, dims);
  return emit("stablehlo.pad " + name(v) + ", " + name(fill) + ", low = " + list(low) + ", high = " + list(high) +
                  ", interior = " + list(interior) + " : (" + v.type.mlir() + ", " + fill.type.mlir() + ") -> " +
                  t.mlir(),
              t);
}

Value Builder::slice_scatter(const Value& self, const Value& src, int64_t dim, int64_t start, int64_t end,
                             int64_t step) {
  dim = normalize_dims({dim}, self.rank()).at(0);
  if (step <= 0) fail("slice_scatter: step must be positive");
  const int64_t size = self.dims()[dim];
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
  const int64_t count = (end - start + step - 1) / step;
  std::vector<int64_t> expected = self.dims();
  expected[dim] = count;
  if (src.dims() != expected) fail("slice_scatter: src has the wrong shape for the slice");
  if (count == 0) return self;
  // src placed on the slice's positions by padding (interior padding spaces it by step); a mask
  // padded the same way picks it over self.
  std::vector<int64_t> low(self.rank(), 0), high(self.rank(), 0), interior(self.rank(), 0);
  low[dim] = start;
  interior[dim] = step - 1;
  high[dim] = size - (start + (count - 1) * step + 1);
  auto pad = [&](const Value& v, const Value& fill) {
    const TensorType t{v.element(), self.dims()};
    return emit("stablehlo.pad " + name(v) + ", " + name(fill) + ", low = " + list(low) + ", high = " + list(high) +
                    ", interior = " + list(interior) + " : (" + v.type.mlir() + ", " + fill.type.mlir() + ") -> " +
                    t.mlir(),
                t);
  };
  const Value placed = pad(convert(src, self.element()), constant(0, self.element()));
  const Value where = pad(full(1, TensorType{ElementType::Pred, expected}), constant_int(0, ElementType::Pred));
  return select(where, placed, self);
}

Value Builder::select_scatter(const Value& self, const Value& src, int64_t dim, int64_t index) {
  dim = normalize_dims({dim}, self.rank()).at(0);
  const int64_t size = self.dims()[dim];
  if (index < -size || index >= size) fail("select_scatter: index out of range");
  if (index < 0) index += size;
  std::vector<int64_t> dims = src.dims();
  dims.insert(dims.begin() + dim, 1);
  return slice_scatter(self, reshape(src, dims), dim, index, index + 1, 1);
}

Value Builder::slice_backward(const Value& grad, const std::vector<int64_t>& input_sizes, int64_t dim, int64_t start,
                              int64_t end, int64_t step) {
  return slice_scatter(full(0, TensorType{grad.element(), input_sizes}), grad, dim, start, end, step);
}

Value Builder::select_backward(const Value& grad, const std::vector<int64_t>& input_sizes, int64_t dim, int64_t index) {
  return select_scatter(full(0, TensorType{grad.element(), input_sizes}), grad, dim, index);
}

Value Builder::reflection_pad(const Value& v, const std::vector<int64_t>& padding) {
  return pad_gather(*this, v, padding, true);
}

Value Builder::replication_pad(const Value& v, const std::vector<int64_t>& padding) {
  return pad_gather(*this, v, padding, false);
}

Value Builder::reflection_pad_backward(const Value& grad, const Value& self, const std::vector<int64_t>& padding) {
  return pad_scatter(*this, grad, self, padding, true);
}

Value Builder::replication_pad_backward(const Value& grad, const Value& self, const std::vector<int64_t>& padding) {
  return pad_scatter(*this, grad, self, padding, false);
}

Value Builder::sort_along(const Value& v, int64_t dim_in, bool descending, bool indices) {
  const TensorType index_type{ElementType::S64, v.dims()};
  if (v.rank() == 0) {
    shape_dim(dim_in, 1, "sort");
    return indices ? constant_int(0, ElementType::S64) : v;
  }
  const int64_t dim = shape_dim(dim_in, v.rank(), "sort");
  if (v.type.numel() == 0) return indices ? full(0, index_type) : v;
  Value iota_v = iota(index_type, dim);
  // The comparator: does a go before b? Ascending: a < b, or b is NaN and a is not; descending: a > b,
  // or a is NaN and b is not. Equal keys keep their order (is_stable).
  const TensorType s{v.element(), {}}, si{ElementType::S64, {}}, p{ElementType::Pred, {}};
  const std::string r = "%s" + std::to_string(next_id_) + "_";
  const std::string a = r + "a", c = r + "b";
  const std::string st = s.mlir(), pt = p.mlir();
  const char* ct = compare_type(v.element());
  auto cmp = [&](const std::string& out, const char* dir, const std::string& x, const std::string& y) {
    return "      " + out + " = stablehlo.compare " + dir + ", " + x + ", " + y + ", " + ct + " : (" + st + ", " + st +
           ") -> " + pt + "\n";
  };
  std::string body = cmp(r + "0", descending ? "GT" : "LT", a, c);
  std::string result = r + "0";
  if (is_float(v.element())) {
    const std::string& nan_side = descending ? a : c;
    const std::string& other = descending ? c : a;
    body += cmp(r + "1", "NE", nan_side, nan_side);
    body += cmp(r + "2", "EQ", other, other);
    body += "      " + r + "3 = stablehlo.and " + r + "1, " + r + "2 : " + pt + "\n";
    body += "      " + r + "4 = stablehlo.or " + r + "0, " + r + "3 : " + pt + "\n";
    result = r + "4";
  }
  auto sorted = emit_multi("\"stablehlo.sort\"(" + name(v) + ", " + name(iota_v) + ") ({\n    ^bb0(" + a + ": " + st +
                               ", " + c + ": " + st + ", " + r + "c: " + si.mlir() + ", " + r + "d: " + si.mlir() +
                               "):\n" + body + "      stablehlo.return " + result + " : " + pt +
                               "\n    }) {dimension = " + std::to_string(dim) + " : i64, is_stable = true} : (" +
                               v.type.mlir() + ", " + index_type.mlir() + ") -> (" + v.type.mlir() + ", " +
                               index_type.mlir() + ")",
                           {v.type, index_type});
  return sorted[indices ? 1 : 0];
}

Value Builder::topk(const Value& v, int64_t k, int64_t dim_in, bool largest, bool indices) {
  Value sorted = sort_along(v, dim_in, largest, indices);
  if (v.rank() == 0) return sorted;
  return slice_dim(*this, sorted, shape_dim(dim_in, v.rank(), "topk"), 0, k);
}

Value Builder::arange(double start, double end, double step) {
  // The length as CPU's Meta pass computes it: from the scalars in the accumulation type (int64 for
  // integers, float for half precision, double otherwise).
  double size;
  if (!is_float(nominal_element_)) {
    size = std::ceil(static_cast<double>(static_cast<int64_t>(end) - static_cast<int64_t>(start)) /
                     static_cast<double>(static_cast<int64_t>(step)));
  } else if (element_size(nominal_element_) == 2) {
    size = std::ceil(static_cast<double>(static_cast<float>(end) - static_cast<float>(start)) /
                     static_cast<double>(static_cast<float>(step)));
  } else {
    size = std::ceil((end - start) / step);
  }
  const int64_t n = size > 0 ? static_cast<int64_t>(size) : 0;
  if (!is_float(nominal_element_)) {
    // CPU's integer arange: int64 start + i * step, from the truncated scalars.
    const TensorType t{ElementType::S64, {n}};
    return add(mul(iota(t, 0), constant_int(static_cast<int64_t>(step), ElementType::S64)),
               constant_int(static_cast<int64_t>(start), ElementType::S64));
  }
  const ElementType e = nominal_element_ == ElementType::F64 ? ElementType::F64 : ElementType::F32;
  const TensorType t{e, {n}};
  return add(mul(iota(t, 0), constant(step, e)), constant(start, e));
}

Value Builder::linspace(const Value& start_in, const Value& end_in, int64_t steps) {
  // Integer outputs compute in double and truncate, as on CPU; floats in their own type.
  const ElementType e = is_float(start_in.element()) ? start_in.element() : ElementType::F64;
  const Value start = convert(start_in, e), end = convert(end_in, e);
  const TensorType t{e, {steps}};
  if (steps <= 1) return broadcast_to(start, {steps});
  // Half precision rounds each step through its own type (CPU computes in BFloat16/Half there).
  // XLA may divide by a constant through its reciprocal: one Newton step restores the correctly
  // rounded quotient CPU has (integer outputs truncate it, so 0.99999... must not stand for 1).
  const Value span = nominal(sub(end, start)), divisor = constant(static_cast<double>(steps - 1), e);
  const Value q = div(span, divisor);
  Value step = nominal(add(q, div(sub(span, mul(q, divisor)), divisor)));
  Value i = iota(t, 0);
  Value from_start = add(start, nominal(mul(step, nominal(i))));
  Value from_end = sub(end, nominal(mul(step, nominal(sub(constant(static_cast<double>(steps - 1), e), i)))));
  return select(lt(i, constant(static_cast<double>(steps / 2), e)), from_start, from_end);
}

Value Builder::eye(int64_t n, int64_t m) {
  const TensorType t{ElementType::S64, {n, m}};
  return eq(iota(t, 0), iota(t, 1));
}

}  // namespace torchtpu::rt
