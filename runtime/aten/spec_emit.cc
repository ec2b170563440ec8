// Emission of one spec'd call into a builder: the piece the eager kernel (a one-op module) and
// graph capture (every node of a graph in one module) share.
#include <ATen/EmptyTensor.h>
#include <c10/util/strides.h>

#include <algorithm>
#include <map>

#include "aten/spec_call.h"

namespace torchtpu {
namespace {

rt::ElementType natural_element(const c10::Scalar& s) {
  if (s.isBoolean()) return rt::ElementType::Pred;
  if (s.isIntegral(false)) return rt::ElementType::S64;
  if (s.isComplex()) return rt::ElementType::C128;
  return rt::ElementType::F64;
}

// Length of a foreach op's first list argument.
size_t list_length(const OpSpec& spec, const c10::IValue* args) {
  for (size_t i = 0; i < spec.args.size(); ++i) {
    if (spec.args[i] == ArgKind::TensorList || spec.args[i] == ArgKind::ScalarList) return args[i].toListRef().size();
  }
  TORCH_INTERNAL_ASSERT(false, "torchtpu: foreach op aten::", spec.overload, " has no list argument");
}

}  // namespace

rt::Value read_tensor(rt::Builder& b, const std::optional<rt::Value>& storage, const rt::TensorType& storage_type,
                      const at::Tensor& t) {
  rt::Value contents = storage ? *storage : b.full(0, storage_type);
  const rt::ElementType element = element_type(t.scalar_type());
  if (rt::element_size(storage_type.element) != rt::element_size(element)) {
    contents = b.reinterpret_bytes(contents, element);  // a view with another element width
  }
  return b.reinterpret(b.read_view(contents, geometry_of(t)), element);
}

rt::Value write_tensor(rt::Builder& b, const std::optional<rt::Value>& old, const rt::TensorType& storage_type,
                       const rt::Value& value, const at::Tensor& t) {
  const rt::ElementType element = element_type(t.scalar_type());
  rt::Value v = b.broadcast_to(b.convert(value, element), t.sizes().vec());
  if (rt::element_size(storage_type.element) != rt::element_size(element)) {
    // A view with another element width writes into the storage's bytes seen as its elements.
    const int64_t count = storage_type.numel() * rt::element_size(storage_type.element) / rt::element_size(element);
    const rt::TensorType as_view{element, {count}};
    std::optional<rt::Value> bytes;
    if (old) bytes = b.reinterpret_bytes(*old, element);
    const rt::Value written = b.write_view(bytes ? &*bytes : nullptr, as_view, v, geometry_of(t));
    return b.reshape(b.reinterpret_bytes(written, storage_type.element), storage_type.dims);
  }
  return b.write_view(old ? &*old : nullptr, storage_type, b.reinterpret(v, storage_type.element), geometry_of(t));
}

EmittedCall emit_call(const OpSpec& spec, rt::Builder& b, const CallPlan& plan, const c10::IValue* args,
                      InputSource& source) {
  const size_t n = spec.args.size();
  const at::ScalarType compute = plan.compute;
  // Like PyTorch's opmath: half-precision floats compute in float32 and round once at the end.
  const rt::ElementType compute_element =
      compute == at::kHalf || compute == at::kBFloat16 ? rt::ElementType::F32 : element_type(compute);
  EmittedCall call;
  call.fresh = plan.fresh;
  call.fresh_is_list = plan.fresh_is_list;

  b.set_nominal_element(element_type(compute));
  EmitArgs ea;
  ea.args.resize(n + (spec.implicit_generator ? 1 : 0));
  // The current contents of each written tensor's storage, keyed by (argument, element).
  std::map<std::pair<int, int>, std::optional<rt::Value>> written_storages;
  auto is_written = [&](int i) { return std::find(spec.written.begin(), spec.written.end(), i) != spec.written.end(); };
  auto is_promoted = [&](int i) { return std::find(spec.promoted.begin(), spec.promoted.end(), i) != spec.promoted.end(); };
  auto emit_tensor = [&](const at::Tensor& t, int arg, int index, bool promote) -> EmitArg {
    if (!t.defined()) return std::monostate{};
    rt::Value v;
    if (is_cpu_scalar(t)) {
      v = source.cpu_scalar(b, t, arg, index, promote ? compute_element : element_type(t.scalar_type()));
    } else {
      const std::optional<rt::Value> storage = source.storage(b, t, arg, index);
      if (is_written(arg)) written_storages.emplace(std::make_pair(arg, index), storage);
      v = read_tensor(b, storage, source.storage_type(t), t);
      if (t.is_conj()) v = b.conj_of(v);  // the conj bit: the storage holds the unconjugated values
    }
    return promote ? b.convert(v, compute_element) : v;
  };
  bool draws_random = false;
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& a = args[i];
    const int arg = static_cast<int>(i);
    switch (spec.args[i]) {
      case ArgKind::Tensor:
        ea.args[i] = emit_tensor(a.isTensor() ? a.toTensor() : at::Tensor(), arg, -1, is_promoted(arg));
        break;
      case ArgKind::OptionalTensorList: {
        std::vector<rt::Value> values;
        const auto list = a.toListRef();
        for (size_t j = 0; j < list.size(); ++j) {
          const EmitArg e = emit_tensor(list[j].isTensor() ? list[j].toTensor() : at::Tensor(), arg,
                                        static_cast<int>(j), is_promoted(arg));
          values.push_back(std::holds_alternative<rt::Value>(e) ? std::get<rt::Value>(e) : rt::Value{});
        }
        ea.args[i] = std::move(values);
        break;
      }
      case ArgKind::TensorList: {
        std::vector<rt::Value> values;
        const auto list = a.toTensorList();
        for (size_t j = 0; j < list.size(); ++j) {
          values.push_back(std::get<rt::Value>(emit_tensor(list.get(j), arg, static_cast<int>(j), is_promoted(arg))));
        }
        ea.args[i] = std::move(values);
        break;
      }
      case ArgKind::Scalar: {
        if (a.isNone()) break;
        const rt::ElementType e = is_promoted(arg) ? compute_element : natural_element(a.toScalar());
        ea.args[i] = source.scalar(b, a, arg, -1, e);
        break;
      }
      case ArgKind::ScalarList: {
        std::vector<rt::Value> values;
        const auto list = a.toListRef();
        for (size_t j = 0; j < list.size(); ++j) {
          const rt::ElementType e = is_promoted(arg) ? compute_element : natural_element(list[j].toScalar());
          values.push_back(source.scalar(b, list[j], arg, static_cast<int>(j), e));
        }
        ea.args[i] = std::move(values);
        break;
      }
      case ArgKind::Attr:
        if (a.isBool()) ea.args[i] = a.toBool();
        else if (a.isInt()) ea.args[i] = a.toInt();
        else if (a.isDouble()) ea.args[i] = a.toDouble();
        else if (a.isIntList()) ea.args[i] = a.toIntVector();
        else if (a.isString()) ea.args[i] = a.toStringRef();
        else if (a.isBoolList()) {
          const auto bits = a.toBoolList();
          ea.args[i] = std::vector<bool>(bits.begin(), bits.end());
        }
        else if (a.isDoubleList()) ea.args[i] = a.toDoubleVector();
        else if (a.isScalar()) ea.args[i] = a.toScalar().toDouble();
        break;
      case ArgKind::Generator:
        ea.args[i] = source.random_state(b, args, arg);
        draws_random = true;
        break;
      case ArgKind::Ignored:
        break;
    }
  }
  if (spec.implicit_generator) {
    ea.args[n] = source.random_state(b, args, -1);
    draws_random = true;
  }

  std::vector<rt::Value> results;
  b.restart_random_counters();
  try {
    results = spec.emit(b, ea);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "torchtpu: emitting aten::", spec.overload, " (", spec.source, ") failed: ", e.what());
  }
  // Room for two 32-bit draws per element written (Box-Muller), so that streams never overlap,
  // and at least every counter the module's draws used.
  if (draws_random) {
    int64_t numel = 0;
    for (const auto& plans : plan.fresh) {
      for (const OutputPlan& o : plans) numel += o.defined ? c10::multiply_integers(o.sizes) : 0;
    }
    for (const OutputPlan& o : plan.written) numel += c10::multiply_integers(o.sizes);
    source.random_used(std::max<uint64_t>(static_cast<uint64_t>(numel), b.random_counters()) + 16);
  }

  std::optional<rt::Value> count;
  if (spec.data_dependent) {  // padded outputs, then the count of real rows
    TORCH_CHECK(results.size() >= 2, "torchtpu: the lowering of aten::", spec.overload, " (", spec.source,
                ") is data_dependent: it returns the padded outputs and then a count");
    count = b.convert(results.back(), rt::ElementType::S64);
    results.pop_back();
    for (const rt::Value& r : results) {
      const at::ScalarType dtype = r.element() == compute_element ? compute : scalar_type(r.element());
      const auto strides = c10::contiguous_strides(r.dims());
      call.fresh.push_back({OutputPlan{dtype, r.dims(), std::vector<int64_t>(strides.begin(), strides.end())}});
      call.fresh_is_list.push_back(false);
    }
  }
  // The lowering's results, slot by slot: each fresh return, then each written argument. A slot
  // holds one value, or for a foreach op one per element of its first list argument.
  const size_t per_slot = spec.foreach ? list_length(spec, args) : 1;
  const size_t slots = call.fresh.size() + spec.written.size();
  TORCH_CHECK(results.size() == slots * per_slot, "torchtpu: the lowering of aten::", spec.overload, " (",
              spec.source, ") returns ", results.size(), " values; the op needs ", slots * per_slot);
  for (size_t j = 0; j < call.fresh.size(); ++j) {
    TORCH_CHECK(call.fresh[j].size() == per_slot, "torchtpu: aten::", spec.overload, " returns ", call.fresh[j].size(),
                " tensors where its lowering gives ", per_slot);
    for (size_t e = 0; e < per_slot; ++e) {
      OutputPlan& out = call.fresh[j][e];
      if (!out.defined) continue;
      // A lowering that returns an empty 1-D value (empty_1d) where Meta sized a result makes that
      // result empty: what CPU returns for eval batch norm's save_mean/save_invstd, which Meta sizes [C].
      const rt::Value& lowered = results[j * per_slot + e];
      if (!spec.data_dependent && lowered.dims() == std::vector<int64_t>{0} && c10::multiply_integers(out.sizes) != 0) {
        out.sizes = {0};
        out.strides = {1};
      }
      // An empty output has no elements to compute (eval batch norm's save_mean is [0]).
      const rt::TensorType out_type{element_type(out.dtype), out.sizes};
      rt::Value v = out_type.numel() == 0
                        ? b.full(0, out_type)
                        : b.broadcast_to(b.convert(results[j * per_slot + e], out_type.element), out.sizes);
      const int64_t itemsize = static_cast<int64_t>(c10::elementSize(out.dtype));
      const int64_t storage_numel =
          static_cast<int64_t>(at::detail::computeStorageNbytes(out.sizes, out.strides, itemsize)) / itemsize;
      const bool contiguous = c10::contiguous_strides(out.sizes) == c10::DimVector(out.strides.begin(), out.strides.end());
      const rt::TensorType st{element_type(out.dtype), contiguous ? out.sizes : std::vector<int64_t>{storage_numel}};
      call.storages.push_back(b.write_view(nullptr, st, v, rt::ViewGeometry{out.sizes, out.strides, 0}));
    }
  }
  // Writes into one storage through several arguments (_foreach_copy_ into views of one buffer)
  // build on each other: each starts from the contents the previous one left.
  std::map<const TpuStorage*, rt::Value> written_so_far;
  auto write_back = [&](int arg, int index, const rt::Value& value, const at::Tensor& target) {
    const TpuStorage* storage = &storage_of(target);
    std::optional<rt::Value> old;
    if (const auto earlier = written_so_far.find(storage); earlier != written_so_far.end()) {
      old = earlier->second;
    } else if (const auto it = written_storages.find({arg, index}); it != written_storages.end()) {
      old = it->second;
    }
    call.storages.push_back(write_tensor(b, old, source.storage_type(target), value, target));
    written_so_far[storage] = call.storages.back();
  };
  for (size_t w = 0; w < spec.written.size(); ++w) {
    const int arg = spec.written[w];
    const c10::IValue& a = args[arg];
    const size_t slot = (call.fresh.size() + w) * per_slot;
    if (a.isTensorList()) {
      const auto list = a.toTensorVector();
      // A shorter list (an empty max_exp_avg_sqs without amsgrad) has no values to write.
      TORCH_CHECK(list.empty() || list.size() == per_slot, "torchtpu: aten::", spec.overload, ": list argument ", arg,
                  " has ", list.size(), " tensors, expected ", per_slot);
      for (size_t e = 0; e < list.size(); ++e) write_back(arg, static_cast<int>(e), results[slot + e], list[e]);
    } else if (a.isTensor() && a.toTensor().defined()) {
      write_back(arg, -1, results[slot], a.toTensor());
    }
  }
  if (count) {
    call.storages.push_back(*count);
    call.has_count = true;
  }
  return call;
}

size_t defined_count(const std::vector<std::vector<OutputPlan>>& fresh) {
  size_t n = 0;
  for (const auto& plans : fresh) {
    for (const OutputPlan& plan : plans) n += plan.defined ? 1 : 0;
  }
  return n;
}

void push_returns(const OpSpec& spec, const std::vector<std::vector<OutputPlan>>& fresh,
                  const std::vector<bool>& fresh_is_list, const c10::IValue* args, torch::jit::Stack* stack,
                  const std::function<at::Tensor(const OutputPlan&)>& make) {
  std::vector<c10::IValue> fresh_values;
  for (size_t j = 0; j < fresh.size(); ++j) {
    std::vector<at::Tensor> tensors;
    for (const OutputPlan& plan : fresh[j]) tensors.push_back(plan.defined ? make(plan) : at::Tensor());
    if (fresh_is_list[j]) {
      fresh_values.emplace_back(c10::List<at::Tensor>(tensors));
    } else {
      fresh_values.emplace_back(std::move(tensors.at(0)));
    }
  }
  std::vector<c10::IValue> returns;
  size_t next_fresh = 0;
  for (int r : spec.returns) returns.push_back(r >= 0 ? args[r] : std::move(fresh_values.at(next_fresh++)));
  torch::jit::drop(*stack, spec.args.size());
  for (auto& r : returns) stack->push_back(std::move(r));
}

}  // namespace torchtpu
