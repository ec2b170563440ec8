// Builder contraction family: dot_general, matmul/bmm/mv/dot/addbmm, convolution and its gradients.
#include "hlo/hlo_builder.h"

#include <algorithm>
#include <tuple>

#include "hlo/builder_internal.h"

namespace torchtpu::rt {

using namespace builder_internal;

namespace {

// dot_general as broadcast products reduced over the contracting dims: both operands are broadcast to
// [batch..., a's free..., b's free..., contracting...] (`result`'s dims, then the contracting sizes).
Value integer_dot(Builder& b, const Value& lhs, const Value& rhs, const std::vector<int64_t>& lhs_batch,
                  const std::vector<int64_t>& rhs_batch, const std::vector<int64_t>& lhs_contract,
                  const std::vector<int64_t>& rhs_contract, const TensorType& result) {
  const int64_t batch = static_cast<int64_t>(lhs_batch.size());
  const int64_t lhs_free = lhs.rank() - batch - static_cast<int64_t>(lhs_contract.size());
  const int64_t contract_start = static_cast<int64_t>(result.dims.size());
  auto mapping = [&](const Value& v, const std::vector<int64_t>& batch_dims, const std::vector<int64_t>& contract,
                     int64_t free_start) {
    std::vector<int64_t> to(v.rank());
    int64_t free = free_start;
    for (int64_t i = 0; i < v.rank(); ++i) {
      const auto in_batch = std::find(batch_dims.begin(), batch_dims.end(), i);
      const auto in_contract = std::find(contract.begin(), contract.end(), i);
      to[i] = in_batch != batch_dims.end()       ? in_batch - batch_dims.begin()
              : in_contract != contract.end() ? contract_start + (in_contract - contract.begin())
                                              : free++;
    }
    return to;
  };
  std::vector<int64_t> dims = result.dims, reduced;
  for (size_t j = 0; j < lhs_contract.size(); ++j) {
    dims.push_back(lhs.dims()[lhs_contract[j]]);
    reduced.push_back(contract_start + static_cast<int64_t>(j));
  }
  const Value products = b.mul(b.broadcast_in_dim(lhs, dims, mapping(lhs, lhs_batch, lhs_contract, batch)),
                               b.broadcast_in_dim(rhs, dims, mapping(rhs, rhs_batch, rhs_contract, batch + lhs_free)));
  return reduced.empty() ? products : b.reduce(products, reduced, "add", 0);
}

}  // namespace

Value Builder::dot_general(const Value& a, const Value& b, const std::vector<int64_t>& lhs_batch,
                           const std::vector<int64_t>& rhs_batch, const std::vector<int64_t>& lhs_contract,
                           const std::vector<int64_t>& rhs_contract) {
  std::vector<int64_t> dims;
  for (int64_t d : lhs_batch) dims.push_back(a.dims()[d]);
  for (int i = 0; i < a.rank(); ++i) {
    if (std::count(lhs_batch.begin(), lhs_batch.end(), i) || std::count(lhs_contract.begin(), lhs_contract.end(), i)) continue;
    dims.push_back(a.dims()[i]);
  }
  for (int i = 0; i < b.rank(); ++i) {
    if (std::count(rhs_batch.begin(), rhs_batch.end(), i) || std::count(rhs_contract.begin(), rhs_contract.end(), i)) continue;
    dims.push_back(b.dims()[i]);
  }
  TensorType t{a.element(), dims};
  // [M, K] rows merged from [..., K] (merged_rows_ says why): the contraction of the unmerged value.
  if (const auto rows = merged_rows_.find(a.id);
      rows != merged_rows_.end() && lhs_batch.empty() && lhs_contract == std::vector<int64_t>{1} && a.result < 0 &&
      is_float(a.element())) {
    const Value unmerged = rows->second;
    return reshape(dot_general(unmerged, b, {}, rhs_batch, {unmerged.rank() - 1}, rhs_contract), dims);
  }
  if (a.element() == ElementType::S64 || a.element() == ElementType::U64) {
    // libtpu has no 64-bit integer dot ("rewriting computation to not contain X64 ... not implemented"):
    // products and sums, which wrap like PyTorch's, on operands laid out as [batch, a's free, b's free, k].
    return integer_dot(*this, a, b, lhs_batch, rhs_batch, lhs_contract, rhs_contract, t);
  }
  // Both operands widened from one half type. bfloat16: the bfloat16 ones, with the float32 result
  // (exact products, float32 sums: the widened dot's values, without the widened operands). float16:
  // products of 11-bit significands are exact in float32, as CPU computes them, only at HIGHEST (a
  // TPU's DEFAULT is one bfloat16 pass), and a barrier keeps XLA on a TPU from folding the converts
  // into a float16-operand dot, which rounded (a v5e's bmm: 4 float16 ulps off).
  const auto narrow_a = widened_.find(a.id), narrow_b = widened_.find(b.id);
  const bool widened = a.result < 0 && b.result < 0 && narrow_a != widened_.end() && narrow_b != widened_.end() &&
                       narrow_a->second.element() == narrow_b->second.element();
  const ElementType narrow_element = widened ? narrow_a->second.element() : a.element();
  Value lhs = a, rhs = b;
  std::string precision;
  if (widened && narrow_element == ElementType::BF16) {
    lhs = narrow_a->second;
    rhs = narrow_b->second;
    precision = precision_of(narrow_element);
  } else if (widened && narrow_element == ElementType::F16) {
    std::tie(lhs, rhs) = barrier(a, b);
    precision = "HIGHEST";
  } else {
    precision = precision_of(a.element());
  }
  return emit("stablehlo.dot_general " + name(lhs) + ", " + name(rhs) + ", batching_dims = " + list(lhs_batch) + " x " +
                  list(rhs_batch) + ", contracting_dims = " + list(lhs_contract) + " x " + list(rhs_contract) +
                  (precision.empty() ? "" : ", precision = [" + precision + ", " + precision + "]") + " : (" +
                  lhs.type.mlir() + ", " + rhs.type.mlir() + ") -> " + t.mlir(),
              t);
}

std::string Builder::precision_of(ElementType element) const {
  // PyTorch's setting governs float32 (and complex64) products; a TPU's DEFAULT is one bfloat16 pass,
  // which is exact for bfloat16 operands. XLA's CPU and GPU backends compute float32 in full.
  if ((element != ElementType::F32 && element != ElementType::C64) || numerics_.matmul == MatmulPrecision::Default) {
    return "";
  }
  return numerics_.matmul == MatmulPrecision::Highest ? "HIGHEST" : "HIGH";
}

Value Builder::matmul(const Value& a, const Value& b) { return dot_general(a, b, {}, {}, {1}, {0}); }

// ---------------------------------------------------------------------------------------------
// linalg primitives (specs/linalg.yaml)

Value Builder::bmm(const Value& a, const Value& b) { return dot_general(a, b, {0}, {0}, {2}, {1}); }

Value Builder::mv(const Value& a, const Value& v) { return dot_general(a, v, {}, {}, {1}, {0}); }

Value Builder::dot(const Value& a, const Value& b) { return dot_general(a, b, {}, {}, {0}, {0}); }

Value Builder::addbmm(const Value& self, const Value& batch1, const Value& batch2, const Value& beta,
                      const Value& alpha) {
  const int64_t batches = batch1.dims().at(0), n = batch1.dims().at(1), m = batch2.dims().at(2);
  Value r = broadcast_to(select(eq(beta, scalar_like(0, beta)), scalar_like(0, self), mul(self, beta)), {n, m});
  if (batches == 0) return r;
  const Value products = bmm(batch1, batch2);
  for (int64_t i = 0; i < batches; ++i) {
    const Value p = reshape(slice(products, {i, 0, 0}, {i + 1, n, m}, {1, 1, 1}), {n, m});
    r = nominal(add(r, mul(p, alpha)));
  }
  return r;
}

// --- convolution primitives (specs/conv.yaml) ---

namespace {

// Where each label of one word of convolution()'s `dims` ("bf01") sits: label -> dim.
std::vector<int> conv_positions(const std::string& word, const char* letters, int rank, const std::string& dims) {
  if (static_cast<int>(word.size()) != rank) {
    fail("convolution dims " + dims + ": '" + word + "' labels " + std::to_string(word.size()) + " dims of a rank-" +
         std::to_string(rank) + " value");
  }
  const int spatial = rank - 2;
  std::vector<int> at(2 + spatial, -1);  // letters[0], letters[1], then spatial 0..n-1
  for (int d = 0; d < rank; ++d) {
    const char c = word[d];
    int slot = -1;
    if (c == letters[0]) slot = 0;
    else if (c == letters[1]) slot = 1;
    else if (c >= '0' && c < '0' + spatial) slot = 2 + (c - '0');
    if (slot < 0 || at[slot] >= 0) fail("convolution dims " + dims + ": bad or repeated label in '" + word + "'");
    at[slot] = d;
  }
  return at;
}

std::string conv_word(const std::string& word) {
  std::string s = "[";
  for (size_t i = 0; i < word.size(); ++i) s += (i ? ", " : "") + std::string(1, word[i]);
  return s + "]";
}

// A dim of `size` with (size - 1) holes of (dilation - 1) between elements, as XLA counts it.
int64_t dilated(int64_t size, int64_t dilation) { return size == 0 ? 0 : (size - 1) * dilation + 1; }

// An int[] attribute for n spatial dims (PyTorch allows one value for all).
std::vector<int64_t> per_dim(const std::vector<int64_t>& values, int n, const char* what) {
  if (static_cast<int>(values.size()) == n) return values;
  if (values.size() == 1) return std::vector<int64_t>(n, values[0]);
  fail(std::string("convolution: ") + what + " has " + std::to_string(values.size()) + " values for " +
       std::to_string(n) + " spatial dims");
}

std::string spatial_labels(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += static_cast<char>('0' + i);
  return s;
}

// y = conv(x, w): x [N, C_in, *S], w [C_out, C_in/groups, *K], padding (low, high) per spatial dim.
Value regular_conv(Builder& b, const Value& x, const Value& w, const std::vector<int64_t>& stride,
                   const std::vector<int64_t>& low, const std::vector<int64_t>& high,
                   const std::vector<int64_t>& dilation, int64_t groups) {
  const int n = x.rank() - 2;
  const std::string sp = spatial_labels(n);
  std::vector<int64_t> padding;
  for (int i = 0; i < n; ++i) {
    padding.push_back(low[i]);
    padding.push_back(high[i]);
  }
  return b.convolution(x, w, "bf" + sp + " oi" + sp + " bf" + sp, stride, padding, std::vector<int64_t>(n, 1),
                       dilation, groups, 1);
}

// The gradient of regular_conv(x, w) with respect to x (of spatial sizes `x_sizes`) given gy:
// gy dilated by the stride, convolved with w flipped and its channel dims swapped within each group.
Value regular_grad_input(Builder& b, const Value& gy, const Value& w, const std::vector<int64_t>& x_sizes,
                         const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                         const std::vector<int64_t>& dilation, int64_t groups) {
  const int n = gy.rank() - 2;
  const int64_t c_out = w.dims()[0], c_in_g = w.dims()[1];
  std::vector<int64_t> grouped{groups, c_out / groups, c_in_g}, spatial_dims, perm{0, 2, 1}, swapped{groups * c_in_g, c_out / groups};
  for (int i = 0; i < n; ++i) {
    grouped.push_back(w.dims()[2 + i]);
    swapped.push_back(w.dims()[2 + i]);
    perm.push_back(3 + i);
    spatial_dims.push_back(2 + i);
  }
  const Value w_t = b.reverse(b.reshape(b.transpose(b.reshape(w, grouped), perm), swapped), spatial_dims);
  const std::string sp = spatial_labels(n);
  std::vector<int64_t> pads;
  for (int i = 0; i < n; ++i) {
    const int64_t window = dilation[i] * (w.dims()[2 + i] - 1);
    const int64_t low = window - padding[i];
    pads.push_back(low);
    pads.push_back(x_sizes[i] + window - low - dilated(gy.dims()[2 + i], stride[i]));
  }
  return b.convolution(gy, w_t, "bf" + sp + " oi" + sp + " bf" + sp, std::vector<int64_t>(n, 1), pads, stride,
                       dilation, groups, 1);
}

// The gradient of regular_conv(x, w) with respect to w (of spatial sizes `k_sizes`) given gy: x's batch
// dim contracted with gy's, each group of x's channels (batch_group_count) against its group of gy's.
Value regular_grad_weight(Builder& b, const Value& x, const Value& gy, const std::vector<int64_t>& k_sizes,
                          const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                          const std::vector<int64_t>& dilation, int64_t groups) {
  const int n = x.rank() - 2;
  const std::string sp = spatial_labels(n);
  std::vector<int64_t> pads;
  for (int i = 0; i < n; ++i) {
    pads.push_back(padding[i]);
    pads.push_back(dilation[i] * (k_sizes[i] - 1) + dilated(gy.dims()[2 + i], stride[i]) - x.dims()[2 + i] -
                   padding[i]);
  }
  return b.convolution(x, gy, "fb" + sp + " io" + sp + " fb" + sp, dilation, pads, std::vector<int64_t>(n, 1),
                       stride, 1, groups);
}

// The generic form's precision_config attribute for both operands ("" for DEFAULT).
std::string precision_config(const std::string& precision) {
  if (precision.empty()) return "";
  return ", precision_config = [#stablehlo<precision " + precision + ">, #stablehlo<precision " + precision + ">]";
}

std::vector<int64_t> spatial_sizes(const Value& v) { return std::vector<int64_t>(v.dims().begin() + 2, v.dims().end()); }

}  // namespace

Value Builder::convolution(const Value& lhs, const Value& rhs, const std::string& dims,
                           const std::vector<int64_t>& window_strides, const std::vector<int64_t>& padding,
                           const std::vector<int64_t>& lhs_dilation, const std::vector<int64_t>& rhs_dilation,
                           int64_t feature_group_count, int64_t batch_group_count) {
  std::vector<std::string> words;
  for (size_t start = 0; start <= dims.size();) {
    const size_t end = std::min(dims.find(' ', start), dims.size());
    words.push_back(dims.substr(start, end - start));
    start = end + 1;
  }
  if (words.size() != 3) fail("convolution dims " + dims + ": need three words (lhs rhs result)");
  const int rank = lhs.rank(), n = rank - 2;
  if (rank < 3 || rhs.rank() != rank) fail("convolution of ranks " + std::to_string(lhs.rank()) + " and " + std::to_string(rhs.rank()));
  if (static_cast<int>(window_strides.size()) != n || static_cast<int>(padding.size()) != 2 * n ||
      static_cast<int>(lhs_dilation.size()) != n || static_cast<int>(rhs_dilation.size()) != n) {
    fail("convolution: window attributes do not match " + std::to_string(n) + " spatial dims");
  }
  const auto l = conv_positions(words[0], "bf", rank, dims);
  const auto r = conv_positions(words[1], "io", rank, dims);
  const auto o = conv_positions(words[2], "bf", rank, dims);
  std::vector<int64_t> out(rank);
  out[o[0]] = lhs.dims()[l[0]] / batch_group_count;
  out[o[1]] = rhs.dims()[r[1]];
  std::string pads;
  for (int i = 0; i < n; ++i) {
    const int64_t padded = dilated(lhs.dims()[l[2 + i]], lhs_dilation[i]) + padding[2 * i] + padding[2 * i + 1];
    const int64_t window = dilated(rhs.dims()[r[2 + i]], rhs_dilation[i]);
    out[o[2 + i]] = padded < window ? 0 : (padded - window) / window_strides[i] + 1;
    pads += (i ? ", [" : "[") + std::to_string(padding[2 * i]) + ", " + std::to_string(padding[2 * i + 1]) + "]";
  }
  // bfloat16/float16: accumulated and returned in float32, rounded once (as CPU does). A TPU's own
  // low-precision convolution rounded partial sums (gradients 20 ulps off near cancellation on a v5e).
  const bool low_precision = lhs.element() == ElementType::BF16 || lhs.element() == ElementType::F16;
  TensorType t{low_precision ? ElementType::F32 : lhs.element(), out};
  // float16 operands as float32 at HIGHEST, behind a barrier, as dot_general takes them (it says why).
  const bool half = lhs.element() == ElementType::F16;
  const auto [x, w] = half ? barrier(convert(lhs, ElementType::F32), convert(rhs, ElementType::F32)) : std::pair{lhs, rhs};
  const std::string precision = half ? "HIGHEST" : precision_of(lhs.element());
  const Value result = emit("\"stablehlo.convolution\"(" + name(x) + ", " + name(w) + ") {window_strides = " +
                  i64_array(window_strides) + ", padding = dense<[" + pads + "]> : tensor<" + std::to_string(n) +
                  "x2xi64>, lhs_dilation = " + i64_array(lhs_dilation) + ", rhs_dilation = " +
                  i64_array(rhs_dilation) + ", dimension_numbers = #stablehlo.conv<" + conv_word(words[0]) + "x" +
                  conv_word(words[1]) + "->" + conv_word(words[2]) + ">, feature_group_count = " +
                  std::to_string(feature_group_count) + " : i64, batch_group_count = " +
                  std::to_string(batch_group_count) + " : i64" + precision_config(precision) +
                  "} : (" + x.type.mlir() + ", " + w.type.mlir() +
                  ") -> " + t.mlir(),
              t);
  return convert(result, lhs.element());
}

Value Builder::reverse(const Value& v, const std::vector<int64_t>& dims) {
  if (dims.empty()) return v;
  return emit("\"stablehlo.reverse\"(" + name(v) + ") {dimensions = " + i64_array(normalize_dims(dims, v.rank())) +
                  "} : (" + v.type.mlir() + ") -> " + v.type.mlir(),
              v.type);
}

Value Builder::sum_except(const Value& v, int64_t dim) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < v.rank(); ++d) {
    if (d != dim) dims.push_back(d);
  }
  return dims.empty() ? v : reduce(v, dims, "add", 0);
}

Value Builder::conv(const Value& input, const Value& weight, const std::optional<Value>& bias,
                    const std::vector<int64_t>& stride_in, const std::vector<int64_t>& padding_in,
                    const std::vector<int64_t>& dilation_in, bool transposed,
                    const std::vector<int64_t>& output_padding_in, int64_t groups) {
  const int n = input.rank() - 2;
  const auto stride = per_dim(stride_in, n, "stride"), padding = per_dim(padding_in, n, "padding");
  const auto dilation = per_dim(dilation_in, n, "dilation");
  Value out;
  if (!transposed) {
    out = regular_conv(*this, input, weight, stride, padding, padding, dilation, groups);
  } else {
    // The transposed conv is the input gradient of the regular conv whose weight it holds.
    const auto output_padding = per_dim(output_padding_in, n, "output_padding");
    std::vector<int64_t> sizes;
    for (int i = 0; i < n; ++i) {
      sizes.push_back((input.dims()[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (weight.dims()[2 + i] - 1) +
                      output_padding[i] + 1);
    }
    out = regular_grad_input(*this, input, weight, sizes, stride, padding, dilation, groups);
  }
  if (!bias) return out;
  std::vector<int64_t> shape(out.rank(), 1);
  shape[1] = out.dims()[1];
  return add(out, reshape(*bias, shape));
}

Value Builder::conv_grad_input(const Value& grad_output, const Value& input, const Value& weight,
                               const std::vector<int64_t>& stride_in, const std::vector<int64_t>& padding_in,
                               const std::vector<int64_t>& dilation_in, bool transposed, int64_t groups) {
  const int n = input.rank() - 2;
  const auto stride = per_dim(stride_in, n, "stride"), padding = per_dim(padding_in, n, "padding");
  const auto dilation = per_dim(dilation_in, n, "dilation");
  if (!transposed) {
    return regular_grad_input(*this, grad_output, weight, spatial_sizes(input), stride, padding, dilation, groups);
  }
  // A regular conv of grad_output, its high padding cut to give exactly input's sizes (output_padding).
  std::vector<int64_t> high;
  for (int i = 0; i < n; ++i) {
    high.push_back((input.dims()[2 + i] - 1) * stride[i] + dilated(weight.dims()[2 + i], dilation[i]) -
                   grad_output.dims()[2 + i] - padding[i]);
  }
  return regular_conv(*this, grad_output, weight, stride, padding, high, dilation, groups);
}

Value Builder::conv_grad_weight(const Value& grad_output, const Value& input, const Value& weight,
                                const std::vector<int64_t>& stride_in, const std::vector<int64_t>& padding_in,
                                const std::vector<int64_t>& dilation_in, bool transposed, int64_t groups) {
  const int n = input.rank() - 2;
  const auto stride = per_dim(stride_in, n, "stride"), padding = per_dim(padding_in, n, "padding");
  const auto dilation = per_dim(dilation_in, n, "dilation");
  // A transposed conv's weight gradient is the regular one with input and grad_output in swapped roles.
  const Value& x = transposed ? grad_output : input;
  const Value& gy = transposed ? input : grad_output;
  return regular_grad_weight(*this, x, gy, spatial_sizes(weight), stride, padding, dilation, groups);
}

}  // namespace torchtpu::rt
