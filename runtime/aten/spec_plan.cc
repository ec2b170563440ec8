// The plan of a spec'd call: cache-key pieces, the Meta pass and the compute dtype.
#include <ATen/native/TypeProperties.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/nonzero.h>
#include <c10/core/ScalarType.h>

#include <cstdlib>
#include <cstring>

#include "aten/spec_call.h"

namespace torchtpu {
namespace {

at::Tensor to_meta(const at::Tensor& t) {
  if (!is_tpu(t)) return t;  // undefined or a CPU scalar: the Meta kernels take those as they are
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
}

c10::IValue to_meta(const c10::IValue& v) {
  if (v.isTensor()) return to_meta(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : v.toTensorList()) list.push_back(to_meta(t));
    return list;
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> list;
    for (const c10::IValue& e : v.toListRef()) {
      list.push_back(e.isTensor() ? std::optional<at::Tensor>(to_meta(e.toTensor())) : std::nullopt);
    }
    return list;
  }
  if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) return c10::Device(c10::kMeta);
  return v;
}

}  // namespace

void key_tensor(KeyWriter& k, const at::Tensor& t, int& device, const rt::TensorType* contents) {
  if (!t.defined()) return k.tag('N');
  if (is_cpu_scalar(t)) {
    k.tag('S');
    k.i(static_cast<int64_t>(t.scalar_type()));
    return;
  }
  TORCH_CHECK(is_tpu(t), "Expected all tensors to be on the same device, but found at least two devices, tpu:",
              device < 0 ? 0 : device, " and ", t.device(), "!");
  if (device < 0) device = t.device().index();
  TORCH_CHECK(t.device().index() == device,
              "Expected all tensors to be on the same device, but found at least two devices, tpu:", device,
              " and ", t.device(), "!");
  k.tag(t.is_conj() ? 'C' : 'T');  // a conjugated view reads its storage differently
  k.i(static_cast<int64_t>(t.scalar_type()));
  k.ints(t.sizes());
  k.ints(t.strides());
  k.i(t.storage_offset());
  const TpuStorage& s = storage_of(t);
  if (s.buffer) {
    k.i(static_cast<int64_t>(s.buffer->type()));
    k.ints(s.buffer->dims());
  } else if (contents) {
    k.i(static_cast<int64_t>(contents->element));
    k.ints(contents->dims);
  } else {
    k.tag('L');
    k.i(static_cast<int64_t>(s.nbytes));
  }
}

void key_attr(KeyWriter& k, const c10::IValue& v) {
  if (v.isNone()) return k.tag('N');
  if (v.isBool()) return k.tag(v.toBool() ? 'y' : 'n');
  if (v.isInt()) return k.tag('i'), k.i(v.toInt());
  if (v.isDouble() || v.isScalar()) {  // compile-time Scalars key by their exact bits
    const double d = v.isDouble() ? v.toDouble() : v.toScalar().toDouble();
    int64_t bits;
    std::memcpy(&bits, &d, 8);
    return k.tag('d'), k.i(bits);
  }
  if (v.isIntList()) return k.tag('l'), k.ints(v.toIntVector());
  if (v.isDoubleList()) {  // float[] (histogram's range), by exact bits
    k.tag('F');
    for (double d : v.toDoubleVector()) {
      int64_t bits;
      std::memcpy(&bits, &d, 8);
      k.i(bits);
    }
    return k.tag('.');
  }
  if (v.isBoolList()) {  // bool[N] (output_mask)
    k.tag('B');
    for (bool bit : v.toBoolList()) k.tag(bit ? 'y' : 'n');
    return k.tag('.');
  }
  if (v.isString()) return k.tag('s'), k.str(v.toStringRef());
  if (v.isDevice()) return k.tag('D'), k.i(static_cast<int64_t>(v.toDevice().type()));
  TORCH_CHECK(false, "torchtpu: cannot key a compile-time argument of type ", v.tagKind());
}

std::string geometry_key(const at::Tensor& t) {
  KeyWriter k;
  int device = t.device().index();
  key_tensor(k, t, device);
  return k.s;
}

// Tensor?[] indices (ArgKind::OptionalTensorList), as PyTorch's expandTensors: a bool/uint8 mask
// becomes its nonzero() columns (aten::nonzero on tpu: synchronizes), a CPU index tensor (not 0-d)
// moves to self's device. Returns `v` itself where nothing changes.
c10::IValue expand_indices(const c10::IValue& v, const at::Tensor& self) {
  bool changed = false;
  c10::List<std::optional<at::Tensor>> out;
  for (const c10::IValue& e : v.toListRef()) {
    if (!e.isTensor() || !e.toTensor().defined()) {
      out.push_back(std::nullopt);
      continue;
    }
    at::Tensor t = e.toTensor();
    if (!is_tpu(t) && !is_cpu_scalar(t) && is_tpu(self)) {
      t = t.to(self.device());
      changed = true;
    }
    if (t.scalar_type() != at::kBool && t.scalar_type() != at::kByte) {
      out.push_back(t);
      continue;
    }
    const int64_t at_dim = static_cast<int64_t>(out.size());
    for (int64_t j = 0; j < t.dim(); ++j) {
      TORCH_CHECK_INDEX(at_dim + j < self.dim() && t.size(j) == self.size(at_dim + j), "The shape of the mask ",
                        t.sizes(), " at index ", j, " does not match the shape of the indexed tensor ", self.sizes(),
                        " at index ", at_dim + j);
    }
    const at::Tensor nz = at::nonzero(is_tpu(t) || !is_tpu(self) ? t : t.to(self.device()));
    for (int64_t j = 0; j < t.dim(); ++j) out.push_back(nz.select(1, j));
    changed = true;
  }
  return changed ? c10::IValue(out) : v;
}

const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kBool: return "bool";
    case at::kByte: return "uint8";
    case at::kChar: return "int8";
    case at::kShort: return "int16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kComplexFloat: return "complex64";
    case at::kComplexDouble: return "complex128";
    case at::kFloat8_e4m3fn: return "float8_e4m3fn";
    case at::kFloat8_e5m2: return "float8_e5m2";
    case at::kFloat8_e4m3fnuz: return "float8_e4m3fnuz";
    case at::kFloat8_e5m2fnuz: return "float8_e5m2fnuz";
    default: return c10::toString(t);
  }
}

const at::Tensor& tensor_arg(const OpSpec& spec, const c10::IValue* args, int arg, int index, at::Tensor& holder) {
  if (index < 0) {
    holder = args[arg].toTensor();
  } else if (spec.args[arg] == ArgKind::OptionalTensorList) {
    holder = args[arg].toListRef()[index].toTensor();
  } else {
    holder = args[arg].toTensorList().get(index);
  }
  return holder;
}

std::vector<at::Tensor> written_tensors(const c10::IValue& v) {
  if (v.isTensorList()) return v.toTensorVector();
  if (v.isTensor() && v.toTensor().defined()) return {v.toTensor()};
  return {};
}

// A TPU's complex128 is emulated, and libtpu's emulation fails on much of it (measured on a v5e:
// transposes and complex() of float64 parts fail to compile with layout RET_CHECKs, FFTs reject c128
// operands, a complex128 division aborted the process), so such calls run on the CPU there: slow but
// exact, where compiling could take the process down.
bool platform_lacks_complex128() {
  // TORCHTPU_COMPLEX128_ON_HOST=1 takes that path on any platform (the CPU plugin's tests of it).
  static const bool lacks = runtime().platform_name() == "tpu" || std::getenv("TORCHTPU_COMPLEX128_ON_HOST") != nullptr;
  return lacks;
}

static bool touches_complex128(const OpSpec& spec, const c10::IValue* args, const CallPlan& plan, at::ScalarType compute) {
  if (compute == at::kComplexDouble) return true;
  for (const auto& plans : plan.fresh) {
    for (const OutputPlan& p : plans) {
      if (p.defined && p.dtype == at::kComplexDouble) return true;
    }
  }
  for (const OutputPlan& p : plan.written) {
    if (p.dtype == at::kComplexDouble) return true;
  }
  for (size_t i = 0; i < spec.args.size(); ++i) {
    if (spec.args[i] == ArgKind::Tensor && args[i].isTensor() && args[i].toTensor().defined() &&
        args[i].toTensor().scalar_type() == at::kComplexDouble) {
      return true;
    }
    if (spec.args[i] == ArgKind::TensorList) {
      for (const at::Tensor& t : args[i].toTensorList()) {
        if (t.scalar_type() == at::kComplexDouble) return true;
      }
    }
  }
  return false;
}

CallPlan plan_call(const OpSpec& spec, MetaCallFn meta_call, const c10::OperatorHandle& op, const c10::IValue* args) {
  const size_t n = spec.args.size();
  CallPlan plan;

  // 1. Meta pass: PyTorch's own shape/dtype rules and error messages.
  std::vector<c10::IValue> meta_args;
  meta_args.reserve(n);
  for (size_t i = 0; i < n; ++i) meta_args.push_back(to_meta(args[i]));
  torch::jit::Stack meta(meta_args.begin(), meta_args.end());
  if (spec.data_dependent) {
    meta.clear();  // no Meta pass: the lowering's padded results give the outputs (after emission)
  } else if (meta_call) {
    meta_call(meta);
  } else {
    op.callBoxed(&meta);
  }

  auto plan_of = [](const at::Tensor& t) {
    if (!t.defined()) return OutputPlan{at::kFloat, {}, {}, false};  // an output output_mask turned off
    return OutputPlan{t.scalar_type(), t.sizes().vec(), t.strides().vec()};
  };
  if (spec.variant == Variant::Out) {
    for (int w : spec.written) {
      if (!meta_args[w].isTensor()) continue;
      const at::Tensor& resized = meta_args[w].toTensor();
      const at::Tensor& real = args[w].toTensor();
      if (resized.defined() && resized.sizes() != real.sizes()) {
        plan.resizes.push_back(OutResize{static_cast<int>(w), resized.sizes().vec(), resized.strides().vec()});
      }
    }
    if (!plan.resizes.empty()) return plan;
  }
  TORCH_INTERNAL_ASSERT(spec.data_dependent || meta.size() == spec.returns.size(), "torchtpu: the Meta pass of aten::",
                        spec.overload, " returned ", meta.size(), " values for ", spec.returns.size(), " returns");
  for (size_t j = 0; j < meta.size(); ++j) {  // data_dependent: filled from the lowering's results instead
    if (spec.returns[j] >= 0) continue;
    const c10::IValue& r = meta[j];
    std::vector<OutputPlan> plans;
    if (r.isTensorList()) {
      for (const at::Tensor& t : r.toTensorVector()) plans.push_back(plan_of(t));
    } else {
      plans.push_back(plan_of(r.isTensor() ? r.toTensor() : at::Tensor()));
    }
    plan.fresh.push_back(std::move(plans));
    plan.fresh_is_list.push_back(r.isTensorList());
  }
  for (int w : spec.written) {
    for (const at::Tensor& t : written_tensors(args[w])) plan.written.push_back(plan_of(t));
  }

  // 2. The dtype the lowering computes in: for `output`, the first fresh result's, else the first written one's.
  std::optional<at::ScalarType> output_dtype;
  for (const auto& plans : plan.fresh) {
    for (const OutputPlan& p : plans) {
      if (p.defined && !output_dtype) output_dtype = p.dtype;
    }
  }
  if (!output_dtype && !plan.written.empty()) output_dtype = plan.written.front().dtype;
  at::ScalarType compute = output_dtype.value_or(at::kLong);  // data_dependent: compute is never output
  if (spec.compute != Compute::Output) {
    at::native::ResultTypeState state{};
    for (int i : spec.promoted) {
      const c10::IValue& v = meta_args[i];
      if (v.isTensor() && v.toTensor().defined()) {
        state = at::native::update_result_type_state(v.toTensor(), state);
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList()) state = at::native::update_result_type_state(t, state);
      } else if (v.isScalar()) {
        state = at::native::update_result_type_state(v.toScalar(), state);
      } else if (v.isDouble()) {  // a float argument passed at run time
        state = at::native::update_result_type_state(c10::Scalar(v.toDouble()), state);
      } else if (v.isList()) {  // Scalar[]
        for (const c10::IValue& e : v.toListRef()) state = at::native::update_result_type_state(e.toScalar(), state);
      }
    }
    compute = at::native::result_type(state);
    if (spec.compute == Compute::CommonFloat && c10::isIntegralType(compute, /*includeBool=*/true)) {
      compute = c10::typeMetaToScalarType(c10::get_default_dtype());
    }
  }
  const std::string compute_name = dtype_name(compute);
  bool supported = false;
  for (const auto& d : spec.dtypes) supported |= d == compute_name;
  if (!supported) {
    plan.unsupported = "does not support dtype " + compute_name + " on tpu (supported: " +
                       c10::Join(", ", spec.dtypes) + "; see " + spec.source + ")";
  } else if (platform_lacks_complex128() && touches_complex128(spec, args, plan, compute)) {
    plan.unsupported = "computes in complex128, which libtpu cannot compile";
  }
  plan.compute = compute;
  return plan;
}

void resize_outs(const std::vector<OutResize>& resizes, const c10::IValue* args) {
  for (const OutResize& r : resizes) {
    const at::Tensor& out = args[r.arg].toTensor();
    out.resize_(r.sizes);
    if (out.strides() != c10::IntArrayRef(r.strides)) {
      out.unsafeGetTensorImpl()->set_sizes_and_strides(r.sizes, r.strides);
    }
  }
}

}  // namespace torchtpu
