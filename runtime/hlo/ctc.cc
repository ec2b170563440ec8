// Connectionist temporal classification (nn.functional.ctc_loss): the alpha recursion forward in time
// and the beta recursion backward, each a stablehlo.while over time steps that reads and writes its
// step's [N, L] slice (L = 2 * max target length + 1 extended labels: blank, label, blank, ...).
// Lengths are compile-time lists, so the masks and the label positions are constants.
#include <algorithm>
#include <cmath>

#include "hlo/builder_internal.h"
#include "hlo/hlo_builder.h"

namespace torchtpu::rt {

using namespace builder_internal;

namespace {

constexpr ElementType kIndex = ElementType::S64;

// v [N, L] with state s reading state s - by (by < 0: a later state); `fill` where there is none.
Value shift_states(Builder& b, const Value& v, int64_t by, double fill = -HUGE_VAL) {
  const int64_t n = v.dims()[0], l = v.dims()[1], k = std::min<int64_t>(std::abs(by), l);
  const Value filled = b.full(fill, TensorType{v.element(), {n, k}});
  if (by > 0) return b.concatenate({filled, b.slice(v, {0, 0}, {n, l - k}, {1, 1})}, 1);
  return b.concatenate({b.slice(v, {0, k}, {n, l}, {1, 1}), filled}, 1);
}

Value i64_constant(Builder& b, const std::vector<int64_t>& values, const std::vector<int64_t>& dims) {
  return b.reshape(i64_vector(b, values), dims);
}

// What both directions share: the extended labels and where each batch element's states end.
struct CtcSetup {
  int64_t steps = 0, batch = 0, states = 0, max_input = 0;
  Value labels;     // [N, L] int64: blank at even s, target (s - 1) / 2 at odd s (blank past the target)
  Value valid;      // [N, L] pred: s < 2 * target_length + 1
  Value skip;       // [N, L] pred: s > 1 and label s differs from label s - 2 (the blank may be skipped)
  Value label_lp;   // [N, T, L] log_probs at each state's label
};

CtcSetup ctc_setup(Builder& b, const Value& log_probs, const Value& targets, const std::vector<int64_t>& input_lengths,
                   const std::vector<int64_t>& target_lengths, int64_t blank) {
  if (log_probs.rank() != 3) fail("ctc_loss: log_probs must be [T, N, C]");
  CtcSetup c;
  c.steps = log_probs.dims()[0], c.batch = log_probs.dims()[1];
  if (static_cast<int64_t>(input_lengths.size()) != c.batch || static_cast<int64_t>(target_lengths.size()) != c.batch) {
    fail("ctc_loss: one input and one target length per batch element");
  }
  const int64_t max_target = target_lengths.empty() ? 0 : *std::max_element(target_lengths.begin(), target_lengths.end());
  c.max_input = input_lengths.empty() ? 0 : *std::max_element(input_lengths.begin(), input_lengths.end());
  c.states = 2 * max_target + 1;
  const int64_t n = c.batch, l = c.states;
  // Each odd state's flat position in the targets (2-d: rows of the padded targets; 1-d: the
  // concatenated targets, each after the previous lengths); -1: a blank.
  std::vector<int64_t> position(n * l, -1), valid(n * l, 0), skip_allowed(n * l, 0);
  int64_t offset = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t start = targets.rank() == 2 ? i * targets.dims()[1] : offset;
    offset += target_lengths[i];
    for (int64_t s = 0; s < l; ++s) {
      if (s % 2 == 1 && (s - 1) / 2 < target_lengths[i]) position[i * l + s] = start + (s - 1) / 2;
      valid[i * l + s] = s < 2 * target_lengths[i] + 1;
      skip_allowed[i * l + s] = s > 1;
    }
  }
  const Value pos = i64_constant(b, position, {n, l});
  const Value flat_targets = b.convert(b.reshape(targets, {targets.type.numel()}), kIndex);
  const Value minus_one = b.broadcast_to(b.constant_int(-1, kIndex), {n, l});
  const Value is_label = b.ne(pos, minus_one);
  const Value picked = flat_targets.type.numel() == 0
                           ? b.full(0, TensorType{kIndex, {n, l}})
                           : b.gather_flat(flat_targets, b.select(is_label, pos, b.full(0, TensorType{kIndex, {n, l}})));
  c.labels = b.select(is_label, picked, b.broadcast_to(b.constant_int(blank, kIndex), {n, l}));
  c.valid = b.ne(i64_constant(b, valid, {n, l}), b.full(0, TensorType{kIndex, {n, l}}));
  c.skip = b.binary("and", b.ne(i64_constant(b, skip_allowed, {n, l}), b.full(0, TensorType{kIndex, {n, l}})),
                    b.ne(c.labels, shift_states(b, c.labels, 2, -1)));
  const Value by_batch = b.transpose(log_probs, {1, 0, 2});  // [N, T, C]
  c.label_lp = b.take_along(by_batch, 2, b.broadcast_in_dim(c.labels, {n, c.steps, l}, {0, 2}));
  return c;
}

// CPU's log-sum-exp of up to three terms: shifted by their max (0 where all are -inf), summed in order.
Value log_add(Builder& b, const std::vector<Value>& terms) {
  Value m = terms[0];
  for (size_t i = 1; i < terms.size(); ++i) m = b.maximum(m, terms[i]);
  m = b.select(b.eq(m, b.scalar_like(-HUGE_VAL, m)), b.full(0, m.type), m);
  Value sum = b.exp(b.sub(terms[0], m));
  for (size_t i = 1; i < terms.size(); ++i) sum = b.add(sum, b.exp(b.sub(terms[i], m)));
  return b.add(b.log(sum), m);
}

// [N, L] slice t of a [N, T, L] value.
Value step_of(Builder& b, const Value& v, const Value& t) {
  const Value zero = b.constant_int(0, kIndex);
  return b.reshape(b.dynamic_slice(v, {zero, t, zero}, {v.dims()[0], 1, v.dims()[2]}), {v.dims()[0], v.dims()[2]});
}

// [N, L] pred: whether time t lies inside each batch element's input (t < its length).
Value inside_input(Builder& b, const std::vector<int64_t>& input_lengths, const Value& t, int64_t states) {
  const int64_t n = input_lengths.size();
  const Value lengths = i64_constant(b, input_lengths, {n});
  return b.broadcast_in_dim(b.lt(b.broadcast_to(t, {n}), lengths), {n, states}, {0});
}

// Each batch element's [N] entry of v [N, L] at a compile-time state per row (-1: -inf).
Value at_state(Builder& b, const Value& v, const std::vector<int64_t>& state) {
  const int64_t n = v.dims()[0];
  std::vector<int64_t> clamped(state.size());
  for (size_t i = 0; i < state.size(); ++i) clamped[i] = std::max<int64_t>(state[i], 0);
  const Value picked = b.reshape(b.take_along(v, 1, i64_constant(b, clamped, {n, 1})), {n});
  const Value present = b.ne(i64_constant(b, state, {n}), b.broadcast_to(b.constant_int(-1, kIndex), {n}));
  return b.select(present, picked, b.full(-HUGE_VAL, TensorType{v.element(), {n}}));
}

}  // namespace

Value Builder::ctc_loss(const Value& log_probs, const Value& targets, const std::vector<int64_t>& input_lengths,
                        const std::vector<int64_t>& target_lengths, int64_t blank, int64_t which) {
  const CtcSetup c = ctc_setup(*this, log_probs, targets, input_lengths, target_lengths, blank);
  const int64_t n = c.batch, l = c.states;
  const ElementType e = log_probs.element();
  const Value neg_inf = full(-HUGE_VAL, TensorType{e, {n, l}});
  if (n == 0 || c.steps == 0) return which == 0 ? full(0, TensorType{e, {n}}) : full(-HUGE_VAL, TensorType{e, {n, c.steps, l}});
  // t = 0: the blank and the first label.
  const Value state = iota(TensorType{kIndex, {n, l}}, 1);
  const Value first = binary("and", lt(state, broadcast_to(constant_int(2, kIndex), {n, l})), c.valid);
  const Value alpha0 = select(first, step_of(*this, c.label_lp, constant_int(0, kIndex)), neg_inf);
  Value log_alpha = full(-HUGE_VAL, TensorType{e, {n, c.steps, l}});
  const Value zero = constant_int(0, kIndex);
  log_alpha = dynamic_update_slice(log_alpha, reshape(alpha0, {n, 1, l}), {zero, zero, zero});
  // Each later step from the previous one; a batch element past its input keeps its last alpha.
  Value alpha = alpha0;
  if (c.max_input > 1) {
    auto out = for_loop(*this, c.max_input - 1, {alpha, log_alpha, c.label_lp, c.valid, c.skip},
                        [&](Builder& b, const Value& i, const std::vector<Value>& s) {
                          const Value t = b.add(i, b.constant_int(1, kIndex));
                          const Value& previous = s[0];
                          const Value minus_inf = b.full(-HUGE_VAL, previous.type);
                          const Value skipped = b.select(s[4], shift_states(b, previous, 2), minus_inf);
                          Value next = b.add(log_add(b, {previous, shift_states(b, previous, 1), skipped}),
                                             step_of(b, s[2], t));
                          const Value inside = inside_input(b, input_lengths, t, l);
                          next = b.select(s[3], next, minus_inf);
                          const Value z = b.constant_int(0, kIndex);
                          const Value written = b.dynamic_update_slice(
                              s[1], b.reshape(b.select(inside, next, minus_inf), {n, 1, l}), {z, t, z});
                          return std::vector<Value>{b.select(inside, next, previous), written, s[2], s[3], s[4]};
                        });
    alpha = out[0], log_alpha = out[1];
  }
  if (which == 1) return log_alpha;
  // The likelihood ends in the last label or the blank after it.
  std::vector<int64_t> last_blank(n), last_label(n);
  for (int64_t i = 0; i < n; ++i) {
    last_blank[i] = 2 * target_lengths[i];
    last_label[i] = target_lengths[i] > 0 ? 2 * target_lengths[i] - 1 : -1;
  }
  return neg(log_add(*this, {at_state(*this, alpha, last_blank), at_state(*this, alpha, last_label)}));
}

Value Builder::ctc_loss_backward(const Value& grad, const Value& log_probs, const Value& targets,
                                 const std::vector<int64_t>& input_lengths, const std::vector<int64_t>& target_lengths,
                                 const Value& neg_log_likelihood, const Value& log_alpha, int64_t blank,
                                 bool zero_infinity) {
  const CtcSetup c = ctc_setup(*this, log_probs, targets, input_lengths, target_lengths, blank);
  const int64_t n = c.batch, l = c.states, classes = log_probs.dims()[2];
  const ElementType e = log_probs.element();
  Value result = full(0, log_probs.type);
  if (n == 0 || c.steps == 0 || c.max_input == 0) return result;
  // The state each batch element's beta starts from at its last step: the last blank and label.
  std::vector<int64_t> ends(n * l, 0);
  for (int64_t i = 0; i < n; ++i) {
    ends[i * l + 2 * target_lengths[i]] = 1;
    if (target_lengths[i] > 0) ends[i * l + 2 * target_lengths[i] - 1] = 1;
  }
  const Value is_end = ne(i64_constant(*this, ends, {n, l}), full(0, TensorType{kIndex, {n, l}}));
  std::vector<int64_t> last_steps(input_lengths);
  for (int64_t& x : last_steps) x -= 1;
  // A step's gradient in log_probs' [N, C]: exp(lp) - exp(log(sum of alpha * beta over the states of
  // each class) + nll - lp), times the incoming gradient; 0 past the input (and, zero_infinity, for an
  // infinite loss).
  const Value nll = convert(neg_log_likelihood, e), incoming = convert(grad, e);
  const Value by_batch = transpose(log_probs, {1, 0, 2});  // [N, T, C]
  // s may step to s + 2 where s + 2 may skip back to s.
  const Value beta_skip = shift_states(*this, convert(c.skip, kIndex), -2, 0);
  auto out = for_loop(
      *this, c.max_input,
      {full(-HUGE_VAL, TensorType{e, {n, l}}), result, c.label_lp, c.valid, ne(beta_skip, full(0, beta_skip.type)),
       is_end, log_alpha, by_batch, nll, incoming, c.labels},
      [&](Builder& b, const Value& i, const std::vector<Value>& s) {
        const Value t = b.sub(b.constant_int(c.max_input - 1, kIndex), i);
        const Value& later = s[0];  // beta at t + 1
        const Value minus_inf = b.full(-HUGE_VAL, later.type);
        const Value lp = step_of(b, s[2], t);
        const Value skipped = b.select(s[4], shift_states(b, later, -2), minus_inf);
        const Value recursed = b.add(log_add(b, {later, shift_states(b, later, -1), skipped}), lp);
        const Value tn = b.broadcast_to(t, {n});
        const Value last = b.broadcast_in_dim(b.eq(tn, i64_constant(b, last_steps, {n})), {n, l}, {0});
        const Value inside = inside_input(b, input_lengths, t, l);
        Value beta = b.select(last, b.select(s[5], lp, minus_inf), recursed);
        beta = b.select(b.binary("and", inside, s[3]), beta, minus_inf);
        // log(sum over the states of each class of alpha * beta), by a max and a sum of scatters.
        const Value ab = b.select(s[3], b.add(step_of(b, s[6], t), beta), minus_inf);
        const Value none = b.full(-HUGE_VAL, TensorType{e, {n, classes}});
        Value top = b.scatter_along(none, 1, s[10], ab, "amax");
        top = b.select(b.eq(top, b.scalar_like(-HUGE_VAL, top)), b.full(0, top.type), top);
        const Value scaled = b.exp(b.sub(ab, b.take_along(top, 1, s[10])));
        const Value summed = b.scatter_along(b.full(0, top.type), 1, s[10], scaled, "add");
        const Value log_ab = b.add(b.log(summed), top);
        const Value lp_t = step_of(b, s[7], t);  // [N, C]
        const Value nll_c = b.broadcast_in_dim(s[8], {n, classes}, {0});
        Value g = b.mul(b.sub(b.exp(lp_t), b.exp(b.sub(b.add(log_ab, nll_c), lp_t))),
                        b.broadcast_in_dim(s[9], {n, classes}, {0}));
        Value keep = b.broadcast_in_dim(b.lt(tn, i64_constant(b, input_lengths, {n})), {n, classes}, {0});
        if (zero_infinity) keep = b.binary("and", keep, b.ne(nll_c, b.scalar_like(HUGE_VAL, nll_c)));
        g = b.select(keep, g, b.full(0, g.type));
        const Value z = b.constant_int(0, kIndex);
        const Value written = b.dynamic_update_slice(s[1], b.reshape(g, {1, n, classes}), {t, z, z});
        std::vector<Value> next(s);
        next[0] = beta, next[1] = written;
        return next;
      });
  return out[1];
}

}  // namespace torchtpu::rt
