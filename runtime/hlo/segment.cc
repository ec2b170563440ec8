// torch.segment_reduce and its gradient: data viewed as [B, n, K] (B: the dims before axis, K: those
// after); each element's segment comes from comparing its position with the segments' starts, and
// the reductions are scatters into one extra segment that collects the elements outside every one.
#include <cmath>
#include <limits>

#include "hlo/builder_internal.h"
#include "hlo/hlo_builder.h"

namespace torchtpu::rt {

using namespace builder_internal;

namespace {

constexpr ElementType kIndex = ElementType::S64;

struct Segments {
  int64_t batch = 0, n = 0, inner = 0, count = 0;  // B, n, K and S
  std::vector<int64_t> out_dims;                    // data's dims with axis' size S
  Value index;    // [B, n, K] int64: each element's segment, S outside every segment
  Value lengths;  // [B, S] int64
};

Segments segments_of(Builder& b, const Value& data, const std::optional<Value>& lengths,
                     const std::optional<Value>& offsets, int64_t axis_in) {
  const int64_t axis = wrap_dim(axis_in, data.rank(), "segment_reduce");
  Segments g;
  g.batch = product(data.dims(), 0, axis), g.n = data.dims()[axis];
  g.inner = product(data.dims(), axis + 1);
  Value starts, first, end;  // [B, S]; [B, 1] where the first segment starts and the last ends
  if (offsets) {
    g.count = offsets->rank() == 0 ? 0 : offsets->dims().back() - 1;
    const Value o = b.convert(b.reshape(*offsets, {g.batch, g.count + 1}), kIndex);
    starts = b.slice(o, {0, 0}, {g.batch, g.count}, {1, 1});
    g.lengths = b.sub(b.slice(o, {0, 1}, {g.batch, g.count + 1}, {1, 1}), starts);
    first = b.slice(o, {0, 0}, {g.batch, 1}, {1, 1});
    end = b.slice(o, {0, g.count}, {g.batch, g.count + 1}, {1, 1});
  } else if (lengths) {
    g.count = lengths->rank() == 0 ? 1 : lengths->dims().back();
    g.lengths = b.convert(b.reshape(*lengths, {g.batch, g.count}), kIndex);
    const Value ends = b.cumsum(g.lengths, 1);
    starts = b.sub(ends, g.lengths);
    first = b.full(0, TensorType{kIndex, {g.batch, 1}});
    end = g.count == 0 ? first : b.slice(ends, {0, g.count - 1}, {g.batch, g.count}, {1, 1});
  } else {
    fail("segment_reduce: lengths or offsets is required");
  }
  // Position p lies in the last segment starting at or before it (empty ones start there too).
  const Value position = b.iota(TensorType{kIndex, {g.batch, g.n}}, 1);
  Value segment = b.full(0, TensorType{kIndex, {g.batch, g.n}});
  if (g.count > 0) {
    const Value started = b.le(b.broadcast_in_dim(starts, {g.batch, g.n, g.count}, {0, 2}),
                               b.broadcast_in_dim(position, {g.batch, g.n, g.count}, {0, 1}));
    segment = b.sub(b.reduce(b.convert(started, kIndex), {2}, "add", 0), b.full(1, segment.type));
  }
  const Value inside = b.binary("and", b.ge(position, b.broadcast_in_dim(b.reshape(first, {g.batch}), segment.dims(), {0})),
                                b.lt(position, b.broadcast_in_dim(b.reshape(end, {g.batch}), segment.dims(), {0})));
  segment = b.select(inside, segment, b.full(static_cast<double>(g.count), segment.type));
  g.index = b.broadcast_in_dim(segment, {g.batch, g.n, g.inner}, {0, 1});
  g.out_dims = data.dims();
  g.out_dims[axis] = g.count;
  return g;
}

// Per segment [B, S, K] -> per element [B, n, K] (0 outside every segment).
Value each_element(Builder& b, const Segments& g, const Value& per_segment) {
  const Value padded = b.concatenate({per_segment, b.full(0, TensorType{per_segment.element(), {g.batch, 1, g.inner}})}, 1);
  return b.take_along(padded, 1, g.index);
}

// Per element [B, n, K] reduced into each segment [B, S, K], starting from `start`.
Value into_segments(Builder& b, const Segments& g, const Value& values, const char* combiner, double start) {
  const Value acc = b.scatter_along(b.full(start, TensorType{values.element(), {g.batch, g.count + 1, g.inner}}), 1,
                                    g.index, values, combiner);
  return b.slice(acc, {0, 0, 0}, {g.batch, g.count, g.inner}, {1, 1, 1});
}

}  // namespace

Value Builder::segment_reduce(const Value& data, const std::string& reduce, const std::optional<Value>& lengths,
                              const std::optional<Value>& offsets, int64_t axis, std::optional<double> initial) {
  const Segments g = segments_of(*this, data, lengths, offsets, axis);
  const Value x = reshape(data, {g.batch, g.n, g.inner});
  const double inf = std::numeric_limits<double>::infinity();
  Value acc;
  if (reduce == "sum" || reduce == "mean") {
    acc = into_segments(*this, g, x, "add", initial.value_or(0));
  } else if (reduce == "max" || reduce == "min") {
    acc = into_segments(*this, g, x, reduce == "max" ? "amax" : "amin", initial.value_or(reduce == "max" ? -inf : inf));
  } else if (reduce == "prod") {
    acc = into_segments(*this, g, x, "multiply", initial.value_or(1));
  } else {
    fail("segment_reduce: reduce must be sum, mean, max, min or prod, not '" + reduce + "'");
  }
  if (reduce == "mean") {  // (initial + sum) / length; an empty segment keeps initial, else is NaN
    const Value length = broadcast_in_dim(convert(g.lengths, data.element()), acc.dims(), {0, 1});
    const Value empty = initial ? acc : full(std::nan(""), acc.type);
    acc = select(gt(length, full(0, length.type)), div(acc, length), empty);
  }
  return reshape(acc, g.out_dims);
}

Value Builder::segment_reduce_backward(const Value& grad, const Value& output, const Value& data,
                                       const std::string& reduce, const std::optional<Value>& lengths,
                                       const std::optional<Value>& offsets, int64_t axis,
                                       std::optional<double> initial) {
  const Segments g = segments_of(*this, data, lengths, offsets, axis);
  const ElementType e = data.element();
  const Value x = reshape(data, {g.batch, g.n, g.inner});
  const std::vector<int64_t> segment_dims{g.batch, g.count, g.inner};
  const Value grad_of = each_element(*this, g, reshape(convert(grad, e), segment_dims));
  const Value zeros = full(0, x.type);
  const Value inside = lt(g.index, full(static_cast<double>(g.count), g.index.type));
  Value r;
  if (reduce == "sum") {
    r = grad_of;
  } else if (reduce == "mean") {
    r = div(grad_of, each_element(*this, g, broadcast_in_dim(convert(g.lengths, e), segment_dims, {0, 1})));
  } else if (reduce == "max" || reduce == "min") {
    // Shared evenly among the elements equal to the result (NaN where it is NaN).
    const Value result = each_element(*this, g, reshape(convert(output, e), segment_dims));
    const Value hit = binary("and", inside, binary("or", eq(x, result), binary("and", isnan(x), isnan(result))));
    const Value hits = each_element(*this, g, into_segments(*this, g, convert(hit, e), "add", 0));
    r = select(hit, div(grad_of, hits), zeros);
  } else if (reduce == "prod") {
    // grad * output / x, except where x is 0 or NaN: there the product of initial and the segment's
    // other elements, from counts of the zeros and NaNs and the product of the rest.
    const Value zero = eq(x, zeros), nan = isnan(x), special = binary("or", zero, nan);
    const Value zeros_else = sub(each_element(*this, g, into_segments(*this, g, convert(zero, e), "add", 0)), convert(zero, e));
    const Value nans_else = sub(each_element(*this, g, into_segments(*this, g, convert(nan, e), "add", 0)), convert(nan, e));
    const Value rest = each_element(*this, g, into_segments(*this, g, select(special, full(1, x.type), x), "multiply",
                                                            initial.value_or(1)));
    const Value nan_value = full(std::nan(""), x.type);
    const Value others = select(gt(nans_else, zeros), nan_value,
                                select(gt(zeros_else, zeros), select(isinf(rest), nan_value, zeros), rest));
    const Value result = each_element(*this, g, reshape(convert(output, e), segment_dims));
    r = select(special, mul(grad_of, others), div(mul(grad_of, result), x));
  } else {
    fail("segment_reduce: reduce must be sum, mean, max, min or prod, not '" + reduce + "'");
  }
  return reshape(select(inside, r, zeros), data.dims());
}

}  // namespace torchtpu::rt
