// Builder indexing family: gather/scatter along a dim, index/index_put, nonzero, masked ops, isin, embeddings, nll_loss.
#include "hlo/hlo_builder.h"

#include <algorithm>
#include <numeric>

#include "hlo/builder_internal.h"

namespace torchtpu::rt {

using namespace builder_internal;

namespace {

// The full coordinates of every element of `index` into a rank-`index.rank()` operand: the element
// itself along `dim`, its own position along every other dim; shape index.dims + [rank], int64.
Value full_coordinates(Builder& b, const Value& index, int64_t dim) {
  std::vector<int64_t> one = index.dims();
  one.push_back(1);
  std::vector<Value> parts;
  for (int d = 0; d < index.rank(); ++d) {
    Value c = d == dim ? b.convert(index, ElementType::S64) : b.iota(TensorType{ElementType::S64, index.dims()}, d);
    parts.push_back(b.reshape(c, one));
  }
  return b.concatenate(parts, index.rank());
}

std::string dims_field(const char* name, const std::vector<int64_t>& dims) {
  return dims.empty() ? "" : std::string(name) + " = " + list(dims) + ", ";
}

std::vector<int64_t> iota_list(int64_t n) {
  std::vector<int64_t> out(n);
  std::iota(out.begin(), out.end(), 0);
  return out;
}

}  // namespace

Value Builder::index_select(const Value& v, int64_t dim_in, const Value& index) {
  if (v.rank() == 0) return v;  // a 0-d self: its one element (index 0)
  const int64_t dim = wrap_dim(dim_in, v.rank(), "index_select");
  std::vector<int64_t> out_dims = v.dims();
  out_dims[dim] = index.type.numel();
  TensorType t{v.element(), out_dims};
  if (t.numel() == 0) return full(0, t);
  Value starts = reshape(convert(index, ElementType::S64), {index.type.numel(), 1});
  std::vector<int64_t> offset_dims, slice_sizes = v.dims();
  slice_sizes[dim] = 1;
  for (int d = 0; d < v.rank(); ++d) {
    if (d != dim) offset_dims.push_back(d);
  }
  return emit("\"stablehlo.gather\"(" + name(v) + ", " + name(starts) + ") {dimension_numbers = #stablehlo.gather<" +
                  dims_field("offset_dims", offset_dims) + "collapsed_slice_dims = [" + std::to_string(dim) +
                  "], start_index_map = [" + std::to_string(dim) + "], index_vector_dim = 1>, slice_sizes = " +
                  i64_array(slice_sizes) + ", indices_are_sorted = false} : (" + v.type.mlir() + ", " +
                  starts.type.mlir() + ") -> " + t.mlir(),
              t);
}

Value Builder::take_along(const Value& v, int64_t dim_in, const Value& index) {
  TensorType t{v.element(), index.dims()};
  if (t.numel() == 0) return full(0, t);
  if (v.rank() == 0 || index.rank() == 0) {  // 0-d operands act as 1-element 1-D ones
    Value r = take_along(reshape(v, {v.type.numel()}), 0, reshape(index, {index.type.numel()}));
    return reshape(r, index.dims());
  }
  const int64_t dim = wrap_dim(dim_in, v.rank(), "gather");
  if (index.rank() != v.rank()) fail("gather: index and self differ in rank");
  Value coords = full_coordinates(*this, index, dim);
  const std::vector<int64_t> all = iota_list(v.rank());
  return emit("\"stablehlo.gather\"(" + name(v) + ", " + name(coords) +
                  ") {dimension_numbers = #stablehlo.gather<collapsed_slice_dims = " + list(all) +
                  ", start_index_map = " + list(all) + ", index_vector_dim = " + std::to_string(index.rank()) +
                  ">, slice_sizes = " + i64_array(std::vector<int64_t>(v.rank(), 1)) +
                  ", indices_are_sorted = false} : (" + v.type.mlir() + ", " + coords.type.mlir() + ") -> " +
                  t.mlir(),
              t);
}

Value Builder::scatter_along(const Value& v, int64_t dim_in, const Value& index, const Value& src_in,
                             const std::string& reduce) {
  if (index.type.numel() == 0) return v;
  if (v.rank() == 0 || index.rank() == 0) {
    Value src = src_in.rank() == 0 ? src_in : reshape(src_in, {src_in.type.numel()});
    Value r = scatter_along(reshape(v, {v.type.numel()}), 0, reshape(index, {index.type.numel()}), src, reduce);
    return reshape(r, v.dims());
  }
  const int64_t dim = wrap_dim(dim_in, v.rank(), "scatter");
  if (index.rank() != v.rank()) fail("scatter: index and self differ in rank");
  Value src = convert(src_in, v.element());
  if (src.rank() == 0) {
    src = broadcast_to(src, index.dims());
  } else if (src.dims() != index.dims()) {
    if (src.rank() != index.rank()) fail("scatter: index and src differ in rank");
    src = slice(src, std::vector<int64_t>(src.rank(), 0), index.dims(), std::vector<int64_t>(src.rank(), 1));
  }
  Value coords = full_coordinates(*this, index, dim);

  // The combiner region: (old, new) -> stored value.
  const TensorType s{v.element(), {}};
  const std::string st = s.mlir(), r = "%r" + std::to_string(next_id_);
  const std::string a = r + "a", n = r + "b";
  std::string body;
  std::string result = n;
  const bool pred = v.element() == ElementType::Pred;
  if (reduce == "add" || reduce == "sum" || reduce == "multiply" || reduce == "prod") {
    const bool add = reduce == "add" || reduce == "sum";
    const char* op = pred ? (add ? "or" : "and") : (add ? "add" : "multiply");
    body = "      " + r + "c = stablehlo." + op + " " + a + ", " + n + " : " + st + "\n";
    result = r + "c";
  } else if (reduce == "amax" || reduce == "amin") {
    const char* op = reduce == "amax" ? "maximum" : "minimum";
    body = "      " + r + "c = stablehlo." + op + " " + a + ", " + n + " : " + st + "\n";
    result = r + "c";
    if (is_float(v.element())) {  // NaN propagates from either side, as on CPU
      const std::string cmp = std::string(compare_type(v.element()));
      const std::string pt = TensorType{ElementType::Pred, {}}.mlir();
      body += "      " + r + "d = stablehlo.compare NE, " + a + ", " + a + ", " + cmp + " : (" + st + ", " + st +
              ") -> " + pt + "\n";
      body += "      " + r + "e = stablehlo.select " + r + "d, " + a + ", " + r + "c : " + pt + ", " + st + "\n";
      body += "      " + r + "f = stablehlo.compare NE, " + n + ", " + n + ", " + cmp + " : (" + st + ", " + st +
              ") -> " + pt + "\n";
      body += "      " + r + "g = stablehlo.select " + r + "f, " + n + ", " + r + "e : " + pt + ", " + st + "\n";
      result = r + "g";
    }
  } else if (!reduce.empty()) {
    fail("scatter: unknown reduce '" + reduce + "'");
  }
  const std::vector<int64_t> all = iota_list(v.rank());
  return emit("\"stablehlo.scatter\"(" + name(v) + ", " + name(coords) + ", " + name(src) + ") ({\n    ^bb0(" + a +
                  ": " + st + ", " + n + ": " + st + "):\n" + body + "      stablehlo.return " + result + " : " + st +
                  "\n    }) {scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = " + list(all) +
                  ", scatter_dims_to_operand_dims = " + list(all) + ", index_vector_dim = " +
                  std::to_string(index.rank()) + ">, indices_are_sorted = false, unique_indices = false} : (" +
                  v.type.mlir() + ", " + coords.type.mlir() + ", " + src.type.mlir() + ") -> " + v.type.mlir(),
              v.type);
}

Value Builder::scatter_reduce_along(const Value& v, int64_t dim, const Value& index, const Value& src,
                                    const std::string& reduce, bool include_self) {
  if (reduce != "sum" && reduce != "prod" && reduce != "mean" && reduce != "amax" && reduce != "amin") {
    fail("scatter_reduce: reduce must be sum, prod, mean, amax or amin, not '" + reduce + "'");
  }
  Value base = v;
  if (!include_self) {  // where an index points, start from the reduction's identity
    Value hit = scatter_along(full(0, TensorType{ElementType::Pred, v.dims()}), dim, index,
                              constant_int(1, ElementType::Pred), "");
    Value identity = reduce == "prod" ? scalar_like(1, v)
                     : reduce == "amax" ? extreme_constant(*this, v.element(), true)
                     : reduce == "amin" ? extreme_constant(*this, v.element(), false)
                                        : scalar_like(0, v);
    base = select(hit, broadcast_like(identity, v), v);
  }
  Value combined = scatter_along(base, dim, index, src, reduce == "mean" ? "sum" : reduce);
  if (reduce != "mean") return combined;
  // mean: the sum over (self and) the scattered elements, divided by their count (at least 1).
  Value count = scatter_along(full(include_self ? 1 : 0, v.type), dim, index, scalar_like(1, v), "sum");
  count = select(eq(count, scalar_like(0, v)), broadcast_like(scalar_like(1, v), count), count);
  return is_float(v.element()) ? div(combined, count) : div_rounded(combined, count, "floor");
}

Value Builder::embedding_backward(const Value& grad, const Value& indices, int64_t num_weights, int64_t padding_idx,
                                  bool scale_grad_by_freq) {
  const int64_t n = indices.type.numel();
  const int64_t width = grad.rank() == 0 ? 1 : grad.dims().back();
  TensorType t{grad.element(), {num_weights, width}};
  if (n == 0 || t.numel() == 0) return full(0, t);
  Value rows = reshape(grad, {n, width});
  Value idx = reshape(convert(indices, ElementType::S64), {n});
  if (scale_grad_by_freq) {  // each row times 1 / (how often its index occurs), as CPU does
    Value ones = full(1, TensorType{grad.element(), {n}});
    Value counts = scatter_along(full(0, TensorType{grad.element(), {num_weights}}), 0, idx, ones, "add");
    Value scale = div(scalar_like(1, grad), take_along(counts, 0, idx));
    rows = mul(rows, broadcast_in_dim(scale, {n, width}, {0}));
  }
  Value keep = ne(idx, constant_int(padding_idx, ElementType::S64));
  rows = select(broadcast_in_dim(keep, {n, width}, {0}), rows, broadcast_like(scalar_like(0, rows), rows));
  // Whole rows scattered at once (a [1, width] window per index): an element-wise scatter of [n, width]
  // made a TPU sort and scatter n * width indices (the 110M Llama's embedding: 40 of a 74 ms step).
  return index_put(full(0, t), {idx}, rows, true);
}

Value Builder::embedding_renorm(const Value& v, const Value& indices, double max_norm, double norm_type) {
  if (v.rank() != 2) fail("embedding_renorm: self must be 2-D");
  const int64_t rows = v.dims()[0], n = indices.type.numel();
  if (n == 0 || v.type.numel() == 0) return v;
  const TensorType per_row{v.element(), {rows}};
  const Value named = scatter_along(full(0, per_row), 0, reshape(convert(indices, ElementType::S64), {n}),
                                    full(1, TensorType{v.element(), {n}}), "");
  const Value norms = vector_norm(v, norm_type, {1}, false);
  const Value over = bitwise_and(ne(named, full(0, per_row)), gt(norms, full(max_norm, per_row)));
  const Value scale = select(over, div(full(max_norm, per_row), add(norms, full(1e-7, per_row))), full(1, per_row));
  return mul(v, broadcast_in_dim(scale, v.dims(), {0}));
}

namespace {

struct NllParts {
  int64_t class_dim;
  Value target;  // int64, self's dims without the class dim
  Value keep;    // target != ignore_index
  Value weight;  // weight[target] (1 without weights), 0 where ignored
};

NllParts nll_parts(Builder& b, const Value& self, const Value& target, const std::optional<Value>& weight,
                   int64_t ignore_index) {
  NllParts p;
  p.class_dim = self.rank() >= 2 ? 1 : 0;
  p.target = b.convert(target, ElementType::S64);
  p.keep = b.ne(p.target, b.constant_int(ignore_index, ElementType::S64));
  Value w = weight ? b.reshape(b.take_along(*weight, 0, b.reshape(p.target, {p.target.type.numel()})), p.target.dims())
                   : b.full(1, TensorType{self.element(), p.target.dims()});
  p.weight = b.select(p.keep, w, b.broadcast_like(b.scalar_like(0, w), w));
  return p;
}

// `per_target` (target's shape) laid out along self's dims (the class dim broadcast).
Value along_classes(Builder& b, const Value& per_target, const Value& self, int64_t class_dim) {
  std::vector<int64_t> mapping;
  for (int d = 0; d < self.rank(); ++d) {
    if (d != class_dim) mapping.push_back(d);
  }
  return b.broadcast_in_dim(per_target, self.dims(), mapping);
}

}  // namespace

Value Builder::nll_loss(const Value& self, const Value& target, const std::optional<Value>& weight, int64_t reduction,
                        int64_t ignore_index) {
  NllParts p = nll_parts(*this, self, target, weight, ignore_index);
  std::vector<int64_t> index_dims = p.target.dims();
  index_dims.insert(index_dims.begin() + p.class_dim, 1);
  Value picked = reshape(take_along(self, p.class_dim, reshape(p.target, index_dims)), p.target.dims());
  // -self[target] * weight[target]; exactly 0 where ignored (whatever self holds there).
  Value loss = select(p.keep, mul(neg(picked), p.weight), broadcast_like(scalar_like(0, picked), picked));
  switch (reduction) {
    case 0: return loss;
    case 1: return div(sum(loss, {}, false), sum(p.weight, {}, false));  // all ignored: 0/0 = NaN, as on CPU
    case 2: return sum(loss, {}, false);
  }
  fail("nll_loss: reduction must be 0 (none), 1 (mean) or 2 (sum), not " + std::to_string(reduction));
}

Value Builder::nll_loss_total_weight(const Value& self, const Value& target, const std::optional<Value>& weight,
                                     int64_t reduction, int64_t ignore_index) {
  if (reduction == 0 && self.rank() >= 2) return scalar_like(0, self);  // CPU leaves it 0 for batched 'none'
  return sum(nll_parts(*this, self, target, weight, ignore_index).weight, {}, false);
}

Value Builder::nll_loss_backward(const Value& grad_output, const Value& self, const Value& target,
                                 const std::optional<Value>& weight, int64_t reduction, int64_t ignore_index,
                                 const Value& total_weight) {
  NllParts p = nll_parts(*this, self, target, weight, ignore_index);
  // CPU: weight[target] * -(grad_output / total_weight) (mean) or * -grad_output.
  Value g = reduction == 1 ? div(grad_output, total_weight) : grad_output;
  Value per_target = mul(p.weight, neg(g));
  per_target = select(p.keep, per_target, broadcast_like(scalar_like(0, per_target), per_target));
  Value classes = iota(TensorType{ElementType::S64, self.dims()}, p.class_dim);
  Value hit = eq(classes, along_classes(*this, p.target, self, p.class_dim));
  return select(hit, along_classes(*this, per_target, self, p.class_dim), full(0, self.type));
}

// ---------------------------------------------------------------------------------------------
// advanced indexing primitives (index / index_put, nonzero, masked_select, isin, embedding_bag)

namespace {

// numpy broadcasting of several shapes.
std::vector<int64_t> broadcast_dims(const std::vector<std::vector<int64_t>>& shapes, const char* op) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  std::vector<int64_t> out(rank, 1);
  for (const auto& s : shapes) {
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[rank - s.size() + i];
      const int64_t d = s[i];
      if (d == o || d == 1) continue;
      if (o != 1) fail(std::string(op) + ": shape mismatch: indexing tensors could not be broadcast together");
      o = d;
    }
  }
  return out;
}

// Where an advanced index reads: the indexed dims of v, the index tensors' broadcast shape, the
// coordinates [batch..., k] (int64, negatives wrapped) and the result's layout.
struct AdvancedIndex {
  std::vector<int64_t> dims, batch, out_dims, offset_dims, slice_sizes;
  Value coords;
};

AdvancedIndex advanced_index(Builder& b, const Value& v, const std::vector<Value>& indices) {
  AdvancedIndex ai;
  if (static_cast<int>(indices.size()) > v.rank()) fail("index: too many indices for tensor of dimension " + std::to_string(v.rank()));
  std::vector<std::vector<int64_t>> shapes;
  for (size_t d = 0; d < indices.size(); ++d) {
    if (indices[d].id < 0) continue;
    if (is_float(indices[d].element()) || indices[d].element() == ElementType::Pred) fail("index: tensors used as indices must be long, int, byte or bool tensors");
    ai.dims.push_back(static_cast<int64_t>(d));
    shapes.push_back(indices[d].dims());
  }
  if (ai.dims.empty()) fail("index: no index tensors");
  ai.batch = broadcast_dims(shapes, "index");
  const int64_t nb = static_cast<int64_t>(ai.batch.size());
  const bool adjacent = ai.dims.back() - ai.dims.front() + 1 == static_cast<int64_t>(ai.dims.size());
  std::vector<int64_t> rest_before, rest_after;
  ai.slice_sizes = v.dims();
  for (int64_t d : ai.dims) ai.slice_sizes[d] = 1;
  for (int d = 0; d < v.rank(); ++d) {
    if (std::find(ai.dims.begin(), ai.dims.end(), d) != ai.dims.end()) continue;
    (adjacent && d < ai.dims.front() ? rest_before : rest_after).push_back(v.dims()[d]);
  }
  ai.out_dims = rest_before;
  ai.out_dims.insert(ai.out_dims.end(), ai.batch.begin(), ai.batch.end());
  ai.out_dims.insert(ai.out_dims.end(), rest_after.begin(), rest_after.end());
  for (int64_t i = 0; i < static_cast<int64_t>(rest_before.size()); ++i) ai.offset_dims.push_back(i);
  for (int64_t i = 0; i < static_cast<int64_t>(rest_after.size()); ++i) {
    ai.offset_dims.push_back(static_cast<int64_t>(rest_before.size()) + nb + i);
  }
  std::vector<int64_t> one = ai.batch;
  one.push_back(1);
  std::vector<Value> parts;
  for (int64_t d : ai.dims) {
    Value idx = b.broadcast_to(b.convert(indices[d], ElementType::S64), ai.batch);
    Value size = b.constant_int(v.dims()[d], ElementType::S64);
    idx = b.select(b.lt(idx, b.scalar_like(0, idx)), b.add(idx, b.broadcast_like(size, idx)), idx);
    parts.push_back(b.reshape(idx, one));
  }
  ai.coords = parts.size() == 1 ? parts[0] : b.concatenate(parts, nb);
  return ai;
}

}  // namespace

Value Builder::index_tensor(const Value& v, const std::vector<Value>& indices) {
  AdvancedIndex ai = advanced_index(*this, v, indices);
  TensorType t{v.element(), ai.out_dims};
  if (t.numel() == 0) return full(0, t);
  return emit("\"stablehlo.gather\"(" + name(v) + ", " + name(ai.coords) + ") {dimension_numbers = #stablehlo.gather<" +
                  dims_field("offset_dims", ai.offset_dims) + "collapsed_slice_dims = " + list(ai.dims) +
                  ", start_index_map = " + list(ai.dims) + ", index_vector_dim = " + std::to_string(ai.batch.size()) +
                  ">, slice_sizes = " + i64_array(ai.slice_sizes) + ", indices_are_sorted = false} : (" +
                  v.type.mlir() + ", " + ai.coords.type.mlir() + ") -> " + t.mlir(),
              t);
}

Value Builder::index_put(const Value& v, const std::vector<Value>& indices, const Value& values, bool accumulate) {
  AdvancedIndex ai = advanced_index(*this, v, indices);
  if (TensorType{v.element(), ai.out_dims}.numel() == 0 || v.type.numel() == 0) return v;
  Value updates = broadcast_to(convert(values, v.element()), ai.out_dims);
  const TensorType s{v.element(), {}};
  const std::string st = s.mlir(), r = "%r" + std::to_string(next_id_);
  const std::string a = r + "a", n = r + "b";
  std::string body, result = n;
  if (accumulate) {
    body = "      " + r + "c = stablehlo." + (v.element() == ElementType::Pred ? "or" : "add") + " " + a + ", " + n +
           " : " + st + "\n";
    result = r + "c";
  }
  return emit("\"stablehlo.scatter\"(" + name(v) + ", " + name(ai.coords) + ", " + name(updates) + ") ({\n    ^bb0(" + a +
                  ": " + st + ", " + n + ": " + st + "):\n" + body + "      stablehlo.return " + result + " : " + st +
                  "\n    }) {scatter_dimension_numbers = #stablehlo.scatter<" +
                  dims_field("update_window_dims", ai.offset_dims) + "inserted_window_dims = " + list(ai.dims) +
                  ", scatter_dims_to_operand_dims = " + list(ai.dims) + ", index_vector_dim = " +
                  std::to_string(ai.batch.size()) + ">, indices_are_sorted = false, unique_indices = false} : (" +
                  v.type.mlir() + ", " + ai.coords.type.mlir() + ", " + updates.type.mlir() + ") -> " + v.type.mlir(),
              v.type);
}

namespace {

// For each element of the flat mask m [N]: the row it lands in (its rank among the set elements),
// or N (out of range: dropped by a scatter) where it is not set.
Value packed_rows(Builder& b, const Value& m) {
  const int64_t n = m.type.numel();
  Value pos = b.sub(b.cumsum(b.convert(m, ElementType::S64), 0), b.constant_int(1, ElementType::S64));
  return b.select(m, pos, b.broadcast_like(b.constant_int(n, ElementType::S64), pos));
}

Value is_set(Builder& b, const Value& v) {
  return v.element() == ElementType::Pred ? v : b.ne(v, b.scalar_like(0, v));
}

}  // namespace

Value Builder::nonzero_padded(const Value& v) {
  const int64_t n = v.type.numel(), r = v.rank();
  TensorType t{ElementType::S64, {n, r}};
  if (n == 0 || r == 0) return full(0, t);
  Value m = reshape(is_set(*this, v), {n});
  std::vector<Value> cols;
  for (int d = 0; d < r; ++d) cols.push_back(reshape(iota(TensorType{ElementType::S64, v.dims()}, d), {n, 1}));
  Value coords = r == 1 ? cols[0] : concatenate(cols, 1);
  return index_put(full(0, t), {packed_rows(*this, m)}, coords, false);
}

Value Builder::masked_select_padded(const Value& v, const Value& mask) {
  const std::vector<int64_t> dims = broadcast_dims({v.dims(), mask.dims()}, "masked_select");
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  TensorType t{v.element(), {n}};
  if (n == 0) return full(0, t);
  Value m = reshape(broadcast_to(is_set(*this, mask), dims), {n});
  return index_put(full(0, t), {packed_rows(*this, m)}, reshape(broadcast_to(v, dims), {n}), false);
}

Value Builder::nonzero_count(const Value& v, const Value& like) {
  const std::vector<int64_t> dims = broadcast_dims({v.dims(), like.dims()}, "nonzero");
  Value m = convert(broadcast_to(is_set(*this, v), dims), ElementType::S64);
  return reduce(m, iota_list(static_cast<int64_t>(dims.size())), "add", 0);
}

Value Builder::unique_sorted(const Value& self, int64_t which) {
  const int64_t n = self.type.numel();
  const TensorType padded{self.element(), {n}}, counts{ElementType::S64, {n}};
  if (n == 0) {
    const Value none[] = {full(0, padded), full(0, TensorType{ElementType::S64, self.dims()}), full(0, counts),
                          constant_int(0, ElementType::S64)};
    return none[which];
  }
  // Sorted (NaN last), a value starts a group where it differs from the one before (so each NaN is
  // its own group, as CPU's == finds); group g of sorted element i is the count of starts up to i, - 1.
  const Value flat = reshape(self, {n});
  const Value sorted = sort_along(flat, 0, false, false), order = sort_along(flat, 0, false, true);
  const Value previous = concatenate({slice(sorted, {0}, {1}, {1}), slice(sorted, {0}, {n - 1}, {1})}, 0);
  const Value first = eq(iota(counts, 0), full(0, counts));
  const Value starts = convert(binary("or", first, ne(sorted, previous)), ElementType::S64);
  if (which == 3) return reduce(starts, {0}, "add", 0);
  const Value group = sub(cumsum(starts, 0), full(1, counts));
  if (which == 0) return scatter_along(full(0, padded), 0, group, sorted, "");
  if (which == 2) return scatter_along(full(0, counts), 0, group, full(1, counts), "add");
  return reshape(scatter_along(full(0, counts), 0, order, group, ""), self.dims());
}

Value Builder::isin(const Value& elements, const Value& test_elements, bool invert) {
  TensorType t{ElementType::Pred, elements.dims()};
  const int64_t m = test_elements.type.numel();
  if (m == 0 || t.numel() == 0) return full(invert ? 1 : 0, t);
  std::vector<int64_t> e_dims = elements.dims();
  e_dims.push_back(1);
  Value hit = eq(reshape(elements, e_dims), reshape(test_elements, {m}));
  Value found = reduce(hit, {static_cast<int64_t>(elements.rank())}, "or", 0);
  return invert ? bitwise_not(found) : found;
}

namespace {

// Each index's bag: how many bag starts (offsets[:B]) lie at or before it, minus one; int64 [N].
Value bag_of(Builder& b, const Value& indices, const Value& offsets, bool include_last_offset) {
  const int64_t n = indices.type.numel();
  const int64_t bags = offsets.type.numel() - (include_last_offset ? 1 : 0);
  if (bags <= 0) return b.full(0, TensorType{ElementType::S64, {n}});
  Value starts = b.convert(b.slice(b.reshape(offsets, {offsets.type.numel()}), {0}, {bags}, {1}), ElementType::S64);
  Value pos = b.iota(TensorType{ElementType::S64, {n, bags}}, 0);
  Value started = b.convert(b.ge(pos, b.broadcast_in_dim(starts, {n, bags}, {1})), ElementType::S64);
  return b.sub(b.reduce(started, {1}, "add", 0), b.constant_int(1, ElementType::S64));
}

Value not_padding(Builder& b, const Value& idx, int64_t padding_idx) {
  return b.ne(idx, b.broadcast_like(b.constant_int(padding_idx, ElementType::S64), idx));
}

int64_t bag_count(const Value& offsets, bool include_last_offset) {
  return std::max<int64_t>(offsets.type.numel() - (include_last_offset ? 1 : 0), 0);
}

}  // namespace

Value Builder::embedding_bag_offset2bag(const Value& indices, const Value& offsets, bool include_last_offset) {
  return bag_of(*this, indices, offsets, include_last_offset);
}

Value Builder::embedding_bag_size(const Value& indices, const Value& offsets, bool include_last_offset,
                                  int64_t padding_idx) {
  const int64_t n = indices.type.numel(), slots = offsets.type.numel();
  TensorType t{ElementType::S64, {slots}};
  if (n == 0 || bag_count(offsets, include_last_offset) == 0) return full(0, t);
  Value idx = reshape(convert(indices, ElementType::S64), {n});
  Value ones = convert(not_padding(*this, idx, padding_idx), ElementType::S64);
  return scatter_along(full(0, t), 0, bag_of(*this, indices, offsets, include_last_offset), ones, "add");
}

Value Builder::embedding_bag(const Value& weight, const Value& indices, const Value& offsets, int64_t mode,
                             const std::optional<Value>& per_sample_weights, bool include_last_offset,
                             int64_t padding_idx) {
  const int64_t n = indices.type.numel(), bags = bag_count(offsets, include_last_offset);
  const int64_t width = weight.dims().at(1);
  TensorType t{weight.element(), {bags, width}};
  if (n == 0 || t.numel() == 0) return full(0, t);
  Value idx = reshape(convert(indices, ElementType::S64), {n});
  Value bag = bag_of(*this, indices, offsets, include_last_offset);
  Value keep = broadcast_in_dim(not_padding(*this, idx, padding_idx), {n, width}, {0});
  Value rows = index_select(weight, 0, idx);
  Value bag2 = broadcast_in_dim(bag, {n, width}, {0});
  if (mode == 2) {  // max; bags with no (non-padding) index stay 0
    Value low = broadcast_like(extreme_constant(*this, weight.element(), true), rows);
    Value best = scatter_along(broadcast_to(extreme_constant(*this, weight.element(), true), t.dims), 0, bag2,
                               select(keep, rows, low), "amax");
    Value size = embedding_bag_size(indices, offsets, include_last_offset, padding_idx);
    Value empty = eq(slice(size, {0}, {bags}, {1}), constant_int(0, ElementType::S64));
    return select(broadcast_in_dim(empty, t.dims, {0}), full(0, t), best);
  }
  if (per_sample_weights) rows = mul(rows, broadcast_in_dim(convert(*per_sample_weights, rows.element()), {n, width}, {0}));
  rows = select(keep, rows, broadcast_like(scalar_like(0, rows), rows));
  Value total = scatter_along(full(0, t), 0, bag2, rows, "add");
  if (mode != 1) return total;
  Value size = convert(slice(embedding_bag_size(indices, offsets, include_last_offset, padding_idx), {0}, {bags}, {1}),
                       weight.element());
  size = maximum(size, scalar_like(1, size));
  return div(total, broadcast_in_dim(size, t.dims, {0}));
}

Value Builder::embedding_bag_max_indices(const Value& weight, const Value& indices, const Value& offsets, int64_t mode,
                                         bool include_last_offset, int64_t padding_idx) {
  if (mode != 2) return full(0, TensorType{ElementType::S64, {0}});
  const int64_t n = indices.type.numel(), bags = bag_count(offsets, include_last_offset);
  const int64_t width = weight.dims().at(1);
  TensorType t{ElementType::S64, {bags, width}};
  if (n == 0 || t.numel() == 0) return full(-1, t);
  Value best = embedding_bag(weight, indices, offsets, 2, std::nullopt, include_last_offset, padding_idx);
  Value idx = reshape(convert(indices, ElementType::S64), {n});
  Value bag2 = broadcast_in_dim(bag_of(*this, indices, offsets, include_last_offset), {n, width}, {0});
  Value rows = index_select(weight, 0, idx);
  Value keep = broadcast_in_dim(not_padding(*this, idx, padding_idx), {n, width}, {0});
  // The first position in the bag whose row holds the max, then the index at that position.
  Value hit = bitwise_and(keep, eq(rows, take_along(best, 0, bag2)));
  Value pos = iota(TensorType{ElementType::S64, {n, width}}, 0);
  Value none = broadcast_like(constant_int(n, ElementType::S64), pos);
  Value first = scatter_along(full(n, t), 0, bag2, select(hit, pos, none), "amin");
  Value picked = take_along(broadcast_in_dim(idx, {n, width}, {0}), 0, minimum(first, full(n - 1, t)));
  return select(eq(first, full(n, t)), full(-1, t), picked);
}

Value Builder::embedding_bag_dense_backward(const Value& grad, const Value& indices, const Value& offset2bag,
                                            const Value& bag_size, const Value& max_indices, int64_t num_weights,
                                            bool scale_grad_by_freq, int64_t mode,
                                            const std::optional<Value>& per_sample_weights, int64_t padding_idx) {
  const int64_t width = grad.dims().at(1), n = indices.type.numel();
  TensorType t{grad.element(), {num_weights, width}};
  if (t.numel() == 0) return full(0, t);
  if (mode == 2) {  // each bag's max row gets the bag's grad; empty bags (-1) give nothing
    const int64_t bags = grad.dims().at(0);
    if (bags == 0) return full(0, t);
    Value mi = convert(max_indices, ElementType::S64);
    Value keep = bitwise_and(ge(mi, scalar_like(0, mi)), not_padding(*this, mi, padding_idx));
    Value rows = select(keep, grad, broadcast_like(scalar_like(0, grad), grad));
    Value target = select(keep, mi, broadcast_like(constant_int(0, ElementType::S64), mi));
    return scatter_along(full(0, t), 0, target, rows, "add");
  }
  if (n == 0) return full(0, t);
  Value idx = reshape(convert(indices, ElementType::S64), {n});
  Value bag = reshape(convert(offset2bag, ElementType::S64), {n});
  Value rows = index_select(grad, 0, bag);
  if (mode == 1) {
    Value size = convert(take_along(reshape(bag_size, {bag_size.type.numel()}), 0, bag), grad.element());
    rows = div(rows, broadcast_in_dim(maximum(size, scalar_like(1, size)), {n, width}, {0}));
  }
  if (per_sample_weights) rows = mul(rows, broadcast_in_dim(convert(*per_sample_weights, grad.element()), {n, width}, {0}));
  return embedding_backward(rows, idx, num_weights, padding_idx, scale_grad_by_freq);
}

Value Builder::embedding_bag_backward(const Value& grad, const Value& indices, const Value& offset2bag,
                                      const Value& bag_size, const Value& max_indices, int64_t num_weights,
                                      bool scale_grad_by_freq, int64_t mode, bool sparse,
                                      const std::optional<Value>& per_sample_weights, int64_t padding_idx) {
  if (sparse) fail("embedding_bag: sparse gradients are not supported on tpu");
  return embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, max_indices, num_weights, scale_grad_by_freq,
                                      mode, per_sample_weights, padding_idx);
}

Value Builder::masked_scatter(const Value& v, const Value& mask, const Value& source) {
  const std::vector<int64_t> dims = broadcast_dims({v.dims(), mask.dims()}, "masked_scatter");
  Value base = broadcast_to(v, dims);
  const int64_t n = base.type.numel(), m = source.type.numel();
  if (n == 0 || m == 0) return base;  // nothing set can take a value (CPU checks source is large enough)
  Value set = reshape(broadcast_to(is_set(*this, mask), dims), {n});
  Value pos = sub(cumsum(convert(set, ElementType::S64), 0), constant_int(1, ElementType::S64));
  pos = minimum(pos, broadcast_like(constant_int(m - 1, ElementType::S64), pos));
  Value picked = take_along(reshape(convert(source, v.element()), {m}), 0, pos);
  return reshape(select(set, picked, reshape(base, {n})), dims);
}

Value Builder::embedding_bag_psw_backward(const Value& grad, const Value& weight, const Value& indices,
                                          const Value& offset2bag, int64_t padding_idx) {
  const int64_t n = indices.type.numel();
  TensorType t{grad.element(), {n}};
  if (n == 0) return full(0, t);
  Value idx = reshape(convert(indices, ElementType::S64), {n});
  Value bag = reshape(convert(offset2bag, ElementType::S64), {n});
  Value dot = reduce(mul(index_select(grad, 0, bag), convert(index_select(weight, 0, idx), grad.element())), {1}, "add", 0);
  return select(not_padding(*this, idx, padding_idx), dot, full(0, t));
}

}  // namespace torchtpu::rt
