// linalg decompositions and solvers (specs/linalg.yaml): a general while loop, triangular solves,
// Cholesky, LU with partial pivoting, Householder QR, Jacobi eigh/SVD and matrix_exp. Everything is
// plain StableHLO (while, dot_general, triangular_solve, cholesky) that every XLA backend compiles.
//
// The factorizations work on a [B, m, n] view of their input (batch dims flattened) and loop over one
// column or one rotation per iteration; a step reads and writes its row/column through one-hot masks,
// so a loop body is a handful of elementwise ops and reductions on the whole matrix.
#include <cmath>

#include "hlo/builder_internal.h"
#include "hlo/hlo_builder.h"

namespace torchtpu::rt {

using namespace builder_internal;

std::vector<Value> Builder::while_loop(
    const std::vector<Value>& init, const std::function<Value(Builder&, const std::vector<Value>&)>& condition,
    const std::function<std::vector<Value>(Builder&, const std::vector<Value>&)>& body) {
  std::string types, operands;
  std::vector<TensorType> result_types;
  for (size_t i = 0; i < init.size(); ++i) {
    types += (i ? ", " : "") + init[i].type.mlir();
    operands += (i ? ", " : "") + name(init[i]);
    result_types.push_back(init[i].type);
  }
  // A region: its block arguments (fresh Values of the carried types), then what `fill` emits into it.
  auto region = [&](const std::function<std::vector<Value>(const std::vector<Value>&)>& fill) {
    std::string outer = std::move(body_);
    body_.clear();
    std::vector<Value> arguments;
    std::string header = "    ^bb0(";
    for (size_t i = 0; i < init.size(); ++i) {
      arguments.push_back(Value{next_id_++, init[i].type});
      header += (i ? ", " : "") + name(arguments.back()) + ": " + init[i].type.mlir();
    }
    std::vector<Value> results;
    try {
      results = fill(arguments);
    } catch (...) {
      body_ = std::move(outer);
      throw;
    }
    std::string names, result_mlir;
    for (size_t i = 0; i < results.size(); ++i) {
      names += (i ? ", " : "") + name(results[i]);
      result_mlir += (i ? ", " : "") + results[i].type.mlir();
    }
    std::string text = header + "):\n" + body_ + "      \"stablehlo.return\"(" + names + ") : (" + result_mlir + ") -> ()\n";
    body_ = std::move(outer);
    return text;
  };
  const std::string cond_text = region([&](const std::vector<Value>& args) {
    Value keep_going = condition(*this, args);
    if (keep_going.element() != ElementType::Pred || keep_going.rank() != 0) fail("while_loop: the condition must be a 0-d i1");
    return std::vector<Value>{keep_going};
  });
  const std::string body_text = region([&](const std::vector<Value>& args) {
    std::vector<Value> next = body(*this, args);
    if (next.size() != init.size()) fail("while_loop: the body must return one value per carried value");
    for (size_t i = 0; i < next.size(); ++i) {
      if (!(next[i].type == init[i].type)) fail("while_loop: the body changed the type of carried value " + std::to_string(i));
    }
    return next;
  });
  return emit_multi("\"stablehlo.while\"(" + operands + ") ({\n" + cond_text + "    }, {\n" + body_text + "    }) : (" +
                        types + ") -> (" + types + ")",
                    result_types);
}

namespace {

constexpr ElementType kIndex = ElementType::S64;

std::vector<int64_t> batch_of(const Value& v, int matrix_dims = 2) {
  if (v.rank() < matrix_dims) fail("linalg: expected a tensor with at least " + std::to_string(matrix_dims) + " dims");
  return std::vector<int64_t>(v.dims().begin(), v.dims().end() - matrix_dims);
}

std::vector<int64_t> with(std::vector<int64_t> dims, std::initializer_list<int64_t> tail) {
  dims.insert(dims.end(), tail.begin(), tail.end());
  return dims;
}

// numpy broadcasting of two batch shapes.
std::vector<int64_t> broadcast_batch(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::vector<int64_t> out(std::max(a.size(), b.size()), 1);
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1, y = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (x != y && x != 1 && y != 1) fail("linalg: batch dimensions do not broadcast");
    out[out.size() - 1 - i] = x == 1 ? y : x;
  }
  return out;
}

int64_t rows_of(const Value& v) { return v.dims()[v.rank() - 2]; }
int64_t cols_of(const Value& v) { return v.dims()[v.rank() - 1]; }

// [..., r, c] as [B, r, c].
Value flat3(Builder& b, const Value& v) { return b.reshape(v, {product(batch_of(v)), rows_of(v), cols_of(v)}); }
// [..., n] as [B, n].
Value flat2(Builder& b, const Value& v) { return b.reshape(v, {product(batch_of(v, 1)), cols_of(v)}); }

Value index_iota(Builder& b, int64_t n) { return b.iota(TensorType{kIndex, {n}}, 0); }
Value index(Builder& b, int64_t k) { return b.constant_int(k, kIndex); }
Value zero(Builder& b, const Value& like) { return b.scalar_like(0, like); }
Value one(Builder& b, const Value& like) { return b.scalar_like(1, like); }

// e_k: [n] of `element` with a 1 at k (a 0-d int64).
Value onehot(Builder& b, const Value& k, int64_t n, ElementType element) {
  return b.convert(b.eq(index_iota(b, n), k), element);
}

Value as_column(Builder& b, const Value& v) { return b.reshape(v, with(v.dims(), {1})); }  // [B, m] -> [B, m, 1]
Value as_row(Builder& b, const Value& v) {                                                  // [B, n] -> [B, 1, n]
  return b.reshape(v, {v.dims()[0], 1, v.dims()[1]});
}
Value per_matrix(Builder& b, const Value& s) { return b.reshape(s, {s.dims()[0], 1, 1}); }  // [B] -> [B, 1, 1]
Value per_row(Builder& b, const Value& s) { return b.reshape(s, {s.dims()[0], 1}); }        // [B] -> [B, 1]

// Column k of a [B, m, n] ([B, m]), row k ([B, n]), element k of a [B, n] ([B]).
Value column(Builder& b, const Value& a, const Value& k) {
  return b.reduce(b.mul(a, onehot(b, k, cols_of(a), a.element())), {2}, "add", 0);
}
Value row(Builder& b, const Value& a, const Value& k) {
  return b.reduce(b.mul(a, b.reshape(onehot(b, k, rows_of(a), a.element()), {rows_of(a), 1})), {1}, "add", 0);
}
Value entry(Builder& b, const Value& v, const Value& k) {
  return b.reduce(b.mul(v, onehot(b, k, v.dims()[1], v.element())), {1}, "add", 0);
}
Value outer(Builder& b, const Value& u, const Value& v) { return b.mul(as_column(b, u), as_row(b, v)); }

// An identity [B, m, n] of `element`.
Value eye3(Builder& b, int64_t batch, int64_t m, int64_t n, ElementType element) {
  const TensorType t{kIndex, {m, n}};
  return b.broadcast_to(b.convert(b.eq(b.iota(t, 0), b.iota(t, 1)), element), {batch, m, n});
}

Value empty(Builder& b, ElementType element) { return b.full(0, TensorType{element, {0}}); }

// Columns [from, to) of a [B, m, n]; rows [from, to).
Value columns(Builder& b, const Value& a, int64_t from, int64_t to) {
  return b.slice(a, {0, 0, from}, {a.dims()[0], rows_of(a), to}, {1, 1, 1});
}
Value rows(Builder& b, const Value& a, int64_t from, int64_t to) {
  return b.slice(a, {0, from, 0}, {a.dims()[0], to, cols_of(a)}, {1, 1, 1});
}

// The permutation matrix P [B, m, m] with P[r, c] = 1 where perm[c] == r (A = P L U for getrf's row order).
Value permutation_matrix(Builder& b, const Value& perm, ElementType element) {
  const int64_t m = perm.dims()[1];
  Value rows_iota = b.iota(TensorType{perm.element(), {m, 1}}, 0);
  return b.convert(b.eq(as_row(b, perm), rows_iota), element);
}

// Swaps entries k and p ([B] int64) of every row of v [B, n] (the rows of v's matrix where v is [B, m, n]).
Value swap_rows(Builder& b, const Value& v, const Value& k, const Value& p) {
  const int64_t m = v.dims()[1];
  const bool matrix = v.rank() == 3;
  Value iota = index_iota(b, m);
  Value is_k = b.eq(iota, k);                                  // [m]
  Value is_p = b.eq(b.reshape(iota, {1, m}), per_row(b, p));  // [B, m]
  Value mask_k = matrix ? b.reshape(is_k, {m, 1}) : is_k;
  Value mask_p = matrix ? as_column(b, is_p) : is_p;
  const std::vector<int64_t> reduced = {1};
  Value row_k = b.reduce(b.mul(v, b.convert(mask_k, v.element())), reduced, "add", 0);
  Value row_p = b.reduce(b.mul(v, b.convert(mask_p, v.element())), reduced, "add", 0);
  Value at_k = matrix ? as_row(b, row_p) : per_row(b, row_p);
  Value at_p = matrix ? as_row(b, row_k) : per_row(b, row_k);
  return b.select(mask_k, at_k, b.select(mask_p, at_p, v));
}

struct LU {
  Value lu, pivots, perm, info;  // [B, m, n]; int32 [B, k] 1-based; int32 [B, m] row order; int32 [B]
};

// getrf: right-looking LU with partial pivoting (the first row of largest magnitude), one column a step;
// without `pivot`, plain Gaussian elimination.
LU lu_steps(Builder& b, const Value& a, bool pivot = true) {
  const int64_t batch = a.dims()[0], m = rows_of(a), n = cols_of(a), k = std::min(m, n);
  const ElementType e = a.element();
  Value perm = b.broadcast_to(b.iota(TensorType{ElementType::S32, {m}}, 0), {batch, m});
  std::vector<Value> state{a, b.full(0, TensorType{ElementType::S32, {batch, k}}), perm,
                           b.full(0, TensorType{ElementType::S32, {batch}})};
  auto out = for_loop(b, k, state, [=](Builder& r, const Value& j, const std::vector<Value>& s) {
    Value lu = s[0], pivots = s[1], perm = s[2], info = s[3];
    Value row_iota = index_iota(r, m), col_iota = index_iota(r, n);
    Value c = column(r, lu, j);  // [B, m]
    Value candidates = r.select(r.ge(row_iota, j), r.abs(c), r.scalar_like(-1, c));
    Value best = r.reduce(candidates, {1}, "maximum", -HUGE_VAL);
    Value first = r.select(r.eq(candidates, per_row(r, best)), r.broadcast_to(row_iota, {batch, m}), r.full(m, TensorType{kIndex, {batch, m}}));
    Value p = r.reduce_from(first, {1}, "minimum", index(r, m));
    p = r.select(r.ge(p, index(r, m)), r.broadcast_to(j, {batch}), p);  // NaN column: no swap
    if (!pivot) p = r.broadcast_to(j, {batch});
    lu = swap_rows(r, lu, j, p);
    perm = swap_rows(r, perm, j, p);
    pivots = r.select(r.eq(index_iota(r, k), j), per_row(r, r.convert(r.add(p, index(r, 1)), ElementType::S32)), pivots);
    Value pivot_row = row(r, lu, j);         // [B, n]
    Value d = entry(r, pivot_row, j);        // [B]
    Value singular = r.eq(d, zero(r, d));
    info = r.select(r.bitwise_and(r.eq(info, r.constant_int(0, ElementType::S32)), singular),
                    r.broadcast_to(r.convert(r.add(j, index(r, 1)), ElementType::S32), {batch}), info);
    // LAPACK scales the column by the pivot's reciprocal.
    Value reciprocal = r.div(one(r, d), r.select(singular, one(r, d), d));
    Value below = r.gt(row_iota, j);
    Value l = r.select(below, r.mul(column(r, lu, j), per_row(r, reciprocal)), r.scalar_like(0, d));
    Value u = r.select(r.gt(col_iota, j), pivot_row, r.scalar_like(0, d));
    lu = r.sub(lu, outer(r, l, u));
    Value column_j = r.bitwise_and(r.reshape(below, {m, 1}), r.eq(col_iota, j));  // [m, n]
    lu = r.select(column_j, as_column(r, l), lu);
    return std::vector<Value>{lu, pivots, perm, info};
  });
  (void)e;
  return LU{out[0], out[1], out[2], out[3]};
}

// The row order getrf's 1-based pivots [B, k] make of m rows (int32 [B, m]).
Value perm_from_pivots(Builder& b, const Value& pivots, int64_t m) {
  const int64_t batch = pivots.dims()[0], k = pivots.dims()[1];
  Value perm = b.broadcast_to(b.iota(TensorType{ElementType::S32, {m}}, 0), {batch, m});
  auto out = for_loop(b, k, {perm, b.convert(pivots, ElementType::S32)}, [=](Builder& r, const Value& j, const std::vector<Value>& s) {
    Value p = r.sub(r.convert(entry(r, s[1], j), kIndex), index(r, 1));
    return std::vector<Value>{swap_rows(r, s[0], j, p), s[1]};
  });
  return out[0];
}

// The triangular solve of [B, n, n] and [B, ., .] (matching batch dims).
Value triangular(Builder& b, const Value& a, const Value& rhs, bool left, bool lower, bool transpose_a, bool unit) {
  return b.triangular_solve(a, rhs, left, lower, transpose_a, unit);
}

// X with A X = B (adjoint: A^T X = B) from A's LU, for [B, n, n] / [B, n, k].
Value lu_solve_left(Builder& b, const Value& lu, const Value& perm, const Value& rhs, bool adjoint) {
  Value p = permutation_matrix(b, perm, lu.element());
  if (!adjoint) {
    Value y = b.bmm(b.transpose(p, {0, 2, 1}), rhs);
    y = triangular(b, lu, y, true, true, false, true);
    return triangular(b, lu, y, true, false, false, false);
  }
  Value z = triangular(b, lu, rhs, true, false, true, false);
  z = triangular(b, lu, z, true, true, true, true);
  return b.bmm(p, z);
}

struct QR {
  Value a, tau;  // [B, m, n] reflectors below the diagonal and R on and above it; [B, min(m, n)]
};

// geqrf (unblocked geqr2 with larfg's reflectors): H_k = I - tau v v^T, v[k] = 1, zero above k.
QR geqrf_steps(Builder& b, const Value& a) {
  const int64_t batch = a.dims()[0], m = rows_of(a), n = cols_of(a), k = std::min(m, n);
  auto out = for_loop(b, k, {a, b.full(0, TensorType{a.element(), {batch, k}})},
                      [=](Builder& r, const Value& j, const std::vector<Value>& s) {
    Value a = s[0], tau = s[1];
    Value row_iota = index_iota(r, m), col_iota = index_iota(r, n);
    Value c = column(r, a, j);
    Value alpha = entry(r, c, j);
    Value below = r.gt(row_iota, j), at_j = r.eq(row_iota, j);
    Value x = r.select(below, c, zero(r, c));
    Value xnorm = r.sqrt(r.reduce(r.mul(x, x), {1}, "add", 0));
    Value norm = r.hypot(alpha, xnorm);
    Value beta = r.select(r.ge(alpha, zero(r, alpha)), r.neg(norm), norm);
    Value trivial = r.eq(xnorm, zero(r, xnorm));  // H = I
    Value tau_j = r.select(trivial, zero(r, alpha), r.div(r.sub(beta, alpha), beta));
    Value scale = r.div(one(r, alpha), r.sub(alpha, beta));
    Value v = r.select(below, r.mul(c, per_row(r, scale)), r.convert(at_j, a.element()));
    v = r.select(per_row(r, trivial), r.convert(at_j, a.element()), v);
    // The columns right of j: A -= tau v (v^T A).
    Value w = r.reduce(r.mul(a, as_column(r, v)), {1}, "add", 0);
    w = r.select(r.gt(col_iota, j), w, zero(r, w));
    a = r.sub(a, r.mul(per_matrix(r, tau_j), outer(r, v, w)));
    Value new_column = r.select(below, r.select(per_row(r, trivial), c, v), r.select(at_j, per_row(r, r.select(trivial, alpha, beta)), c));
    a = r.select(r.eq(col_iota, j), as_column(r, new_column), a);
    tau = r.select(r.eq(index_iota(r, k), j), per_row(r, tau_j), tau);
    return std::vector<Value>{a, tau};
  });
  return QR{out[0], out[1]};
}

// C [B, ., .] times Q = H_0 ... H_{k-1} (k = tau's size) from the left or the right, Q or Q^T.
Value apply_reflectors(Builder& b, const Value& reflectors, const Value& tau, const Value& c, bool left, bool transpose) {
  const int64_t k = tau.dims()[1], m = rows_of(reflectors), n = cols_of(reflectors);
  const bool ascending = left == transpose;
  auto out = for_loop(b, k, {c, reflectors, tau}, [=](Builder& r, const Value& t, const std::vector<Value>& s) {
    Value c = s[0];
    Value i = ascending ? t : r.sub(index(r, k - 1), t);
    Value row_iota = index_iota(r, m);
    Value col = r.reduce(r.mul(s[1], onehot(r, i, n, c.element())), {2}, "add", 0);  // column i: [B, m]
    Value v = r.select(r.gt(row_iota, i), col, r.convert(r.eq(row_iota, i), c.element()));
    Value tau_i = per_matrix(r, entry(r, s[2], i));
    if (left) {
      Value w = r.reduce(r.mul(c, as_column(r, v)), {1}, "add", 0);  // v^T C
      c = r.sub(c, r.mul(tau_i, outer(r, v, w)));
    } else {
      Value w = r.reduce(r.mul(c, as_row(r, v)), {2}, "add", 0);  // C v
      c = r.sub(c, r.mul(tau_i, outer(r, w, v)));
    }
    return std::vector<Value>{c, s[1], s[2]};
  });
  return out[0];
}

// Cyclic Jacobi rotations over every pair (p < q) of columns, `sweeps` times. Two-sided (symmetric m):
// m' = J^T m J zeroes m[p, q]; one-sided: m' = m J makes columns p and q orthogonal. v' = v J.
std::pair<Value, Value> jacobi(Builder& b, const Value& m, bool one_sided) {
  const int64_t batch = m.dims()[0], n = cols_of(m);
  const ElementType e = m.element();
  const int64_t sweeps = e == ElementType::F64 ? 14 : 10;
  Value v = eye3(b, batch, n, n, e);
  auto out = for_loop(b, sweeps, {m, v}, [=](Builder& r, const Value&, const std::vector<Value>& s) {
    return for_loop(r, n * n, s, [=](Builder& r, const Value& t, const std::vector<Value>& s) {
      Value m = s[0], v = s[1];
      Value p = r.div(t, index(r, n)), q = r.sub(t, r.mul(p, index(r, n)));
      Value cp = column(r, m, p), cq = column(r, m, q);
      Value app, aqq, apq;
      if (one_sided) {
        app = r.reduce(r.mul(cp, cp), {1}, "add", 0);
        aqq = r.reduce(r.mul(cq, cq), {1}, "add", 0);
        apq = r.reduce(r.mul(cp, cq), {1}, "add", 0);
      } else {
        app = entry(r, cp, p);
        aqq = entry(r, cq, q);
        apq = entry(r, cp, q);
      }
      Value rotate = r.bitwise_and(r.broadcast_to(r.lt(p, q), {batch}), r.ne(apq, zero(r, apq)));
      // t = sign(theta) / (|theta| + sqrt(theta^2 + 1)) for theta = d / h, multiplied through by |h|: no
      // theta^2 to overflow when apq is tiny (a TPU's float64 is two float32s, whose inf becomes NaN).
      Value d = r.sub(aqq, app), h = r.mul(r.scalar_like(2, apq), apq);
      Value tangent = r.div(r.mul(r.select(r.ge(d, zero(r, d)), one(r, d), r.scalar_like(-1, d)), h),
                            r.add(r.abs(d), r.sqrt(r.add(r.mul(d, d), r.mul(h, h)))));
      Value cosine = r.rsqrt(r.add(r.mul(tangent, tangent), one(r, tangent)));
      Value sine = r.mul(tangent, cosine);
      cosine = r.select(rotate, cosine, one(r, cosine));
      sine = r.select(rotate, sine, zero(r, sine));
      Value ep = onehot(r, p, n, e), eq = onehot(r, q, n, e);
      auto outer2 = [&](const Value& x, const Value& y) { return r.mul(r.reshape(x, {n, 1}), r.reshape(y, {1, n})); };
      Value diagonal = r.add(outer2(ep, ep), outer2(eq, eq));
      Value skew = r.sub(outer2(ep, eq), outer2(eq, ep));
      Value j = r.add(eye3(r, batch, n, n, e), r.add(r.mul(per_matrix(r, r.sub(cosine, one(r, cosine))), diagonal),
                                                     r.mul(per_matrix(r, sine), skew)));
      m = one_sided ? r.bmm(m, j) : r.bmm(r.bmm(r.transpose(j, {0, 2, 1}), m), j);
      v = r.bmm(v, j);
      return std::vector<Value>{m, v};
    });
  });
  return {out[0], out[1]};
}

// [B, n, n] that takes column order[i] to column i (x . P).
Value order_matrix(Builder& b, const Value& order, ElementType element) {
  const int64_t n = order.dims()[1];
  return b.convert(b.eq(as_row(b, order), b.iota(TensorType{order.element(), {n, 1}}, 0)), element);
}

struct SVD {
  Value u, s, vh;
};

// Thin SVD of a tall [B, m, n] (m >= n) by one-sided Jacobi; full: U completed to [B, m, m].
SVD svd_tall(Builder& b, const Value& a, bool full) {
  const int64_t m = rows_of(a), n = cols_of(a);
  auto [w, v] = jacobi(b, a, true);
  Value norms = b.sqrt(b.reduce(b.mul(w, w), {1}, "add", 0));  // [B, n]
  Value order = b.sort_along(norms, 1, true, true);
  Value s = b.sort_along(norms, 1, true, false);
  Value p = order_matrix(b, order, a.element());
  w = b.bmm(w, p);
  v = b.bmm(v, p);
  Value u = b.select(b.gt(as_row(b, s), zero(b, s)), b.div(w, as_row(b, s)), zero(b, w));
  if (full && m > n) {
    QR qr = geqrf_steps(b, u);
    Value q = apply_reflectors(b, qr.a, qr.tau, eye3(b, a.dims()[0], m, m, a.element()), true, false);
    u = b.concatenate({u, columns(b, q, n, m)}, 2);
  }
  return SVD{u, s, b.transpose(v, {0, 2, 1})};
}

Value unflatten(Builder& b, const Value& v, const std::vector<int64_t>& batch) {
  std::vector<int64_t> dims = batch;
  dims.insert(dims.end(), v.dims().begin() + 1, v.dims().end());
  return b.reshape(v, dims);
}

}  // namespace

Value Builder::identity_like(const Value& a) {
  const TensorType t{kIndex, a.dims()};
  return convert(eq(iota(t, a.rank() - 2), iota(t, a.rank() - 1)), a.element());
}

Value Builder::matrix_transpose(const Value& a) {
  std::vector<int64_t> permutation(a.rank());
  for (int i = 0; i < a.rank(); ++i) permutation[i] = i;
  std::swap(permutation[a.rank() - 1], permutation[a.rank() - 2]);
  return transpose(a, permutation);
}

Value Builder::triangular_solve(const Value& a, const Value& b, bool left, bool lower, bool transpose_a, bool unit_diagonal) {
  const auto batch = broadcast_batch(batch_of(a), batch_of(b));
  Value a3 = flat3(*this, broadcast_to(a, with(batch, {rows_of(a), cols_of(a)})));
  Value b3 = flat3(*this, broadcast_to(b, with(batch, {rows_of(b), cols_of(b)})));
  // Only the named triangle is read (and not the diagonal where it is taken as ones).
  a3 = lower ? tril(a3, unit_diagonal ? -1 : 0) : triu(a3, unit_diagonal ? 1 : 0);
  if (unit_diagonal) a3 = add(a3, eye3(*this, a3.dims()[0], rows_of(a3), cols_of(a3), a3.element()));
  Value x = emit(std::string("\"stablehlo.triangular_solve\"(") + name(a3) + ", " + name(b3) + ") {left_side = " +
                     (left ? "true" : "false") + ", lower = " + (lower ? "true" : "false") + ", unit_diagonal = " +
                     (unit_diagonal ? "true" : "false") + ", transpose_a = #stablehlo<transpose " +
                     (transpose_a ? "TRANSPOSE" : "NO_TRANSPOSE") + ">} : (" + a3.type.mlir() + ", " + b3.type.mlir() +
                     ") -> " + b3.type.mlir(),
                 b3.type);
  return unflatten(*this, x, batch);
}

Value Builder::cholesky(const Value& a, bool upper, int64_t which) {
  const auto batch = batch_of(a);
  const int64_t n = cols_of(a);
  Value a3 = flat3(*this, a);
  if (upper) a3 = transpose(a3, {0, 2, 1});  // the upper triangle, as the lower one of A^T
  Value l = tril(emit("\"stablehlo.cholesky\"(" + name(a3) + ") {lower = true} : (" + a3.type.mlir() + ") -> " + a3.type.mlir(),
                      a3.type),
                 0);
  if (which == 0) return unflatten(*this, upper ? transpose(l, {0, 2, 1}) : l, batch);
  // info: the first leading minor that is not positive definite, counted from 1. XLA's factor of such a
  // matrix is all NaN, so it comes from Gaussian elimination's pivots (the squares of L's diagonal) over
  // the symmetric matrix the triangle describes.
  Value symmetric = upper ? add(triu(flat3(*this, a), 0), transpose(triu(flat3(*this, a), 1), {0, 2, 1}))
                          : add(tril(flat3(*this, a), 0), transpose(tril(flat3(*this, a), -1), {0, 2, 1}));
  Value pivots = lu_steps(*this, symmetric, false).lu;
  Value d = reduce(mul(pivots, eye3(*this, 1, n, n, l.element())), {2}, "add", 0);  // [B, n]
  Value bad = unary("not", gt(d, zero(*this, d)));
  Value order = add(iota(TensorType{ElementType::S32, {n}}, 0), constant_int(1, ElementType::S32));
  Value first = reduce_from(select(bad, broadcast_to(order, d.dims()), full(n + 1, TensorType{ElementType::S32, d.dims()})),
                            {1}, "minimum", constant_int(n + 1, ElementType::S32));
  first = select(eq(first, constant_int(n + 1, ElementType::S32)), constant_int(0, ElementType::S32), first);
  return reshape(first, batch);
}

Value Builder::lu_factor(const Value& a, bool pivot, int64_t which) {
  const auto batch = batch_of(a);
  LU lu = lu_steps(*this, flat3(*this, a), pivot);
  if (which == 0) return unflatten(*this, lu.lu, batch);
  if (which == 1) return unflatten(*this, lu.pivots, batch);
  return reshape(lu.info, batch);
}

Value Builder::lu_unpack(const Value& lu, const Value& pivots, bool unpack_data, bool unpack_pivots, int64_t which) {
  const auto batch = batch_of(lu);
  const int64_t m = rows_of(lu), n = cols_of(lu), k = std::min(m, n);
  if (which == 0) {
    if (!unpack_pivots) return empty(*this, lu.element());
    Value piv = flat2(*this, broadcast_to(pivots, with(batch, {k})));
    return unflatten(*this, permutation_matrix(*this, perm_from_pivots(*this, piv, m), lu.element()), batch);
  }
  if (!unpack_data) return empty(*this, lu.element());
  Value lu3 = flat3(*this, lu);
  if (which == 1) {
    Value l = columns(*this, tril(lu3, -1), 0, k);
    return unflatten(*this, add(l, eye3(*this, lu3.dims()[0], m, k, lu.element())), batch);
  }
  return unflatten(*this, rows(*this, triu(lu3, 0), 0, k), batch);
}

Value Builder::lu_solve(const Value& lu, const Value& pivots, const Value& b, bool left, bool adjoint) {
  const int64_t n = cols_of(lu);
  const auto batch = broadcast_batch(batch_of(lu), batch_of(b));
  Value lu3 = flat3(*this, broadcast_to(lu, with(batch, {n, n})));
  Value piv = flat2(*this, broadcast_to(pivots, with(batch, {n})));
  Value rhs = flat3(*this, broadcast_to(b, with(batch, {rows_of(b), cols_of(b)})));
  Value perm = perm_from_pivots(*this, piv, n);
  if (left) return unflatten(*this, lu_solve_left(*this, lu3, perm, rhs, adjoint), batch);
  // X A = B is A^T X^T = B^T.
  Value x = lu_solve_left(*this, lu3, perm, transpose(rhs, {0, 2, 1}), !adjoint);
  return unflatten(*this, transpose(x, {0, 2, 1}), batch);
}

Value Builder::lu_det(const Value& lu, const Value& pivots, int64_t which) {
  const auto batch = batch_of(lu);
  const int64_t n = cols_of(lu);
  Value lu3 = flat3(*this, lu);
  Value d = reduce(mul(lu3, eye3(*this, 1, n, n, lu.element())), {2}, "add", 0);  // [B, n]
  Value piv = convert(flat2(*this, pivots), ElementType::S32);
  Value order = add(iota(TensorType{ElementType::S32, {n}}, 0), constant_int(1, ElementType::S32));
  Value swaps = reduce(convert(ne(piv, order), ElementType::S32), {1}, "add", 0);
  Value odd = eq(binary("and", swaps, constant_int(1, ElementType::S32)), constant_int(1, ElementType::S32));
  Value parity = select(odd, scalar_like(-1, d), scalar_like(1, d));  // [B]
  Value result;
  if (which == 0) {
    result = mul(reduce(d, {1}, "multiply", 1), parity);
  } else if (which == 1) {
    result = mul(reduce(sign(d), {1}, "multiply", 1), parity);
  } else {
    result = reduce(log(abs(d)), {1}, "add", 0);
  }
  return reshape(result, batch);
}

namespace {
bool vector_rhs(const Value& a, const Value& b) {
  if (b.rank() == 1) return true;
  return a.rank() - 1 == b.rank() && std::vector<int64_t>(a.dims().begin(), a.dims().end() - 1) == b.dims();
}
}  // namespace

Value Builder::solve_rhs(const Value& a, const Value& b, bool left) {
  if (!vector_rhs(a, b)) return b;
  std::vector<int64_t> dims = b.dims();
  dims.insert(left ? dims.end() : dims.end() - 1, 1);
  return reshape(b, dims);
}

Value Builder::solve_result(const Value& a, const Value& b, const Value& x, bool left) {
  if (!vector_rhs(a, b)) return x;
  std::vector<int64_t> dims = x.dims();
  dims.erase(left ? dims.end() - 1 : dims.end() - 2);
  return reshape(x, dims);
}

Value Builder::geqrf(const Value& a, int64_t which) {
  const auto batch = batch_of(a);
  QR qr = geqrf_steps(*this, flat3(*this, a));
  return unflatten(*this, which == 0 ? qr.a : qr.tau, batch);
}

Value Builder::ormqr(const Value& reflectors, const Value& tau, const Value& c, bool left, bool transpose) {
  const auto batch = broadcast_batch(batch_of(reflectors), batch_of(c));
  Value v = flat3(*this, broadcast_to(reflectors, with(batch, {rows_of(reflectors), cols_of(reflectors)})));
  Value t = flat2(*this, broadcast_to(tau, with(batch, {cols_of(tau)})));
  Value c3 = flat3(*this, broadcast_to(c, with(batch, {rows_of(c), cols_of(c)})));
  return unflatten(*this, apply_reflectors(*this, v, t, c3, left, transpose), batch);
}

Value Builder::householder_product(const Value& reflectors, const Value& tau) {
  const auto batch = batch_of(reflectors);
  Value v = flat3(*this, reflectors);
  Value eye = eye3(*this, v.dims()[0], rows_of(v), cols_of(v), v.element());
  return unflatten(*this, apply_reflectors(*this, v, flat2(*this, tau), eye, true, false), batch);
}

Value Builder::qr(const Value& a, const std::string& mode, int64_t which) {
  const auto batch = batch_of(a);
  const int64_t m = rows_of(a), n = cols_of(a), k = std::min(m, n);
  if (mode != "reduced" && mode != "complete" && mode != "r") fail("qr: mode must be 'reduced', 'complete' or 'r'");
  QR f = geqrf_steps(*this, flat3(*this, a));
  if (which == 1) return unflatten(*this, triu(mode == "complete" ? f.a : rows(*this, f.a, 0, k), 0), batch);
  if (mode == "r") return empty(*this, a.element());
  const int64_t q_cols = mode == "complete" ? m : k;
  Value eye = eye3(*this, f.a.dims()[0], m, q_cols, a.element());
  return unflatten(*this, apply_reflectors(*this, f.a, f.tau, eye, true, false), batch);
}

Value Builder::eigh(const Value& a, const std::string& uplo, bool compute_v, int64_t which) {
  if (uplo != "L" && uplo != "U" && uplo != "l" && uplo != "u") fail("eigh: UPLO must be 'L' or 'U'");
  if (which == 1 && !compute_v) return empty(*this, a.element());
  const auto batch = batch_of(a);
  Value a3 = flat3(*this, a);
  const bool lower = uplo == "L" || uplo == "l";
  Value symmetric = lower ? add(tril(a3, 0), transpose(tril(a3, -1), {0, 2, 1}))
                          : add(triu(a3, 0), transpose(triu(a3, 1), {0, 2, 1}));
  auto [m, v] = jacobi(*this, symmetric, false);
  const int64_t n = cols_of(a);
  Value w = reduce(mul(m, eye3(*this, 1, n, n, a.element())), {2}, "add", 0);
  if (which == 0) return unflatten(*this, sort_along(w, 1, false, false), batch);
  Value order = sort_along(w, 1, false, true);
  return unflatten(*this, bmm(v, order_matrix(*this, order, a.element())), batch);
}

Value Builder::svd(const Value& a, bool full_matrices, bool compute_uv, int64_t which) {
  if (which != 1 && !compute_uv) return empty(*this, a.element());
  const auto batch = batch_of(a);
  const int64_t m = rows_of(a), n = cols_of(a);
  Value a3 = flat3(*this, a);
  if (m >= n) {
    SVD r = svd_tall(*this, a3, full_matrices);
    return unflatten(*this, which == 0 ? r.u : which == 1 ? r.s : r.vh, batch);
  }
  // A^T = U' S V'^T, so A = V' S U'^T.
  SVD r = svd_tall(*this, transpose(a3, {0, 2, 1}), full_matrices);
  if (which == 1) return unflatten(*this, r.s, batch);
  return unflatten(*this, transpose(which == 0 ? r.vh : r.u, {0, 2, 1}), batch);
}

Value Builder::matrix_exp(const Value& a) {
  const auto batch = batch_of(a);
  const int64_t n = cols_of(a);
  Value a3 = flat3(*this, a);
  const int64_t count = a3.dims()[0];
  const ElementType e = a.element();
  // Scale by 2^-s so that the 1-norm is at most theta_13 (Higham 2005), square s times after.
  Value norm = reduce(reduce(abs(a3), {1}, "add", 0), {1}, "maximum", 0);  // [B]
  Value s = unary("ceil", div(log(div(norm, scalar_like(5.371920351148152, norm))), scalar_like(std::log(2.0), norm)));
  s = select(unary("not", gt(s, zero(*this, s))), zero(*this, s), select(gt(s, scalar_like(64, s)), scalar_like(64, s), s));
  Value steps = convert(s, kIndex);                                  // [B]; NaN norms: 0 (NaN fails every compare)
  Value most = reduce_from(steps, {0}, "maximum", index(*this, 0));  // 0-d
  auto halve = for_loop(*this, most, {a3, steps}, [](Builder& r, const Value& i, const std::vector<Value>& st) {
    Value x = st[0];
    return std::vector<Value>{r.select(per_matrix(r, r.lt(r.broadcast_to(i, st[1].dims()), st[1])), r.mul(x, r.scalar_like(0.5, x)), x), st[1]};
  });
  Value x = halve[0];
  static const double c[] = {64764752532480000.0, 32382376266240000.0, 7771770303897600.0, 1187353796428800.0,
                             129060195264000.0, 10559470521600.0, 670442572800.0, 33522128640.0, 1323241920.0,
                             40840800.0, 960960.0, 16380.0, 182.0, 1.0};
  Value eye = eye3(*this, count, n, n, e);
  auto scaled = [&](double k, const Value& m) { return mul(m, scalar_like(k, m)); };
  Value x2 = bmm(x, x), x4 = bmm(x2, x2), x6 = bmm(x4, x2);
  Value u_inner = add(add(scaled(c[13], x6), scaled(c[11], x4)), scaled(c[9], x2));
  Value u = bmm(x, add(add(add(add(bmm(x6, u_inner), scaled(c[7], x6)), scaled(c[5], x4)), scaled(c[3], x2)), scaled(c[1], eye)));
  Value v_inner = add(add(scaled(c[12], x6), scaled(c[10], x4)), scaled(c[8], x2));
  Value v = add(add(add(add(bmm(x6, v_inner), scaled(c[6], x6)), scaled(c[4], x4)), scaled(c[2], x2)), scaled(c[0], eye));
  LU lu = lu_steps(*this, sub(v, u));
  Value r = lu_solve_left(*this, lu.lu, lu.perm, add(v, u), false);
  auto square = for_loop(*this, most, {r, steps}, [](Builder& b, const Value& i, const std::vector<Value>& st) {
    Value y = st[0];
    return std::vector<Value>{b.select(per_matrix(b, b.lt(b.broadcast_to(i, st[1].dims()), st[1])), b.bmm(y, y), y), st[1]};
  });
  return unflatten(*this, square[0], batch);
}

Value Builder::cross(const Value& a, const Value& b, int64_t dim_in) {
  std::vector<int64_t> dims = broadcast_batch(a.dims(), b.dims());
  const int64_t dim = wrap_dim(dim_in, static_cast<int>(dims.size()), "linalg.cross");
  Value x = broadcast_to(a, dims), y = broadcast_to(b, dims);
  auto part = [&](const Value& v, int64_t i) {
    std::vector<int64_t> start(dims.size(), 0), limit = dims, strides(dims.size(), 1);
    start[dim] = i;
    limit[dim] = i + 1;
    return slice(v, start, limit, strides);
  };
  Value x0 = part(x, 0), x1 = part(x, 1), x2 = part(x, 2), y0 = part(y, 0), y1 = part(y, 1), y2 = part(y, 2);
  // Each product rounds to the nominal dtype before the difference, as CPU's half-precision arithmetic does.
  auto term = [&](const Value& a, const Value& b, const Value& c, const Value& d) {
    return nominal(sub(nominal(mul(a, b)), nominal(mul(c, d))));
  };
  return concatenate({term(x1, y2, x2, y1), term(x2, y0, x0, y2), term(x0, y1, x1, y0)}, dim);
}

}  // namespace torchtpu::rt
