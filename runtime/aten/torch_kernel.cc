// The spec kernel (cache key -> executable + output metadata; on a miss: Meta pass, emission,
// compile), host<->device copies, scalar reads, and the CPU fallback for ops without a spec.
#include "aten/torch_kernel.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/TypeProperties.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/nonzero.h>
#include <c10/core/ScalarType.h>
#include <c10/util/strides.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "aten/torch_tpu.h"

namespace torchtpu {
namespace {

// --- cache keys -------------------------------------------------------------------------------

struct KeyWriter {
  std::string s;
  void tag(char c) { s.push_back(c); }
  void i(int64_t v) { s.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void ints(c10::IntArrayRef v) {
    i(static_cast<int64_t>(v.size()));
    s.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
  }
  void str(const std::string& v) {
    i(static_cast<int64_t>(v.size()));
    s += v;
  }
};

bool is_tpu(const at::Tensor& t) { return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1; }
bool is_cpu_scalar(const at::Tensor& t) { return t.defined() && t.device().is_cpu() && t.dim() == 0; }

void key_tensor(KeyWriter& k, const at::Tensor& t, int& device) {
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
  k.tag('T');
  k.i(static_cast<int64_t>(t.scalar_type()));
  k.ints(t.sizes());
  k.ints(t.strides());
  k.i(t.storage_offset());
  const TpuStorage& s = storage_of(t);
  if (s.buffer) {
    TORCH_CHECK_NOT_IMPLEMENTED(rt::element_size(s.buffer->type()) == static_cast<int>(t.dtype().itemsize()),
                                "torchtpu: a ", t.scalar_type(), " view of a storage holding ",
                                scalar_type(s.buffer->type()), " elements (another element width) is not supported yet");
    k.i(static_cast<int64_t>(s.buffer->type()));
    k.ints(s.buffer->dims());
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
  if (v.isBoolList()) {  // bool[N] (output_mask)
    k.tag('B');
    for (bool bit : v.toBoolList()) k.tag(bit ? 'y' : 'n');
    return k.tag('.');
  }
  if (v.isString()) return k.tag('s'), k.str(v.toStringRef());
  if (v.isDevice()) return k.tag('D'), k.i(static_cast<int64_t>(v.toDevice().type()));
  TORCH_CHECK(false, "torchtpu: cannot key a compile-time argument of type ", v.tagKind());
}

// --- Meta pass --------------------------------------------------------------------------------

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
    default: return c10::toString(t);
  }
}

rt::ElementType natural_element(const c10::Scalar& s) {
  if (s.isBoolean()) return rt::ElementType::Pred;
  if (s.isIntegral(false)) return rt::ElementType::S64;
  return rt::ElementType::F64;
}

// --- reading and writing tensors inside a module -------------------------------------------

// The storage as a module value: a parameter, or zeros for a lazy storage (no buffer yet).
rt::Value storage_value(rt::Builder& b, const rt::TensorType& type, bool lazy) {
  return lazy ? b.full(0, type) : b.parameter(type);
}

// The elements `t` sees, in t's dtype.
rt::Value read_tensor(rt::Builder& b, const rt::Value& storage, const at::Tensor& t) {
  return b.reinterpret(b.read_view(storage, geometry_of(t)), element_type(t.scalar_type()));
}

// The new contents of t's storage after writing `value` (converted to t's dtype, broadcast to
// t's shape) through t. `old` is the storage's current value, or nullptr where none is kept.
rt::Value write_tensor(rt::Builder& b, const rt::Value* old, const rt::TensorType& storage, const rt::Value& value,
                       const at::Tensor& t) {
  rt::Value v = b.broadcast_to(b.convert(value, element_type(t.scalar_type())), t.sizes().vec());
  return b.write_view(old, storage, b.reinterpret(v, storage.element), geometry_of(t));
}

// --- the spec kernel --------------------------------------------------------------------------

struct ParamSource {
  enum Kind : uint8_t { Storage, Scalar, Random } kind;
  int arg;    // Random: -1 for the default generator (an implicit-generator op)
  int index;  // element of a tensor or scalar list, or -1
  rt::ElementType element;
  uint64_t random_words = 0;  // Random: counter values one call consumes
};

struct OutputPlan {
  at::ScalarType dtype;
  std::vector<int64_t> sizes, strides;
  bool defined = true;  // false: Meta returned an undefined tensor (an output an output_mask turns off)
};

// The benchmark's "bare PJRT" baseline: the executable and buffers of one real kernel call.
struct CapturedExecution {
  rt::ExecutablePtr exe;
  std::vector<rt::BufferPtr> inputs;
  int device = 0;
};
std::atomic<bool> g_capture_next_execution{false};
CapturedExecution g_captured;

// An out= tensor the Meta pass resized: resized for real before the call is keyed again.
struct OutResize {
  int arg;
  std::vector<int64_t> sizes, strides;
};

struct Entry {
  rt::ExecutablePtr exe;
  std::vector<ParamSource> params;
  std::vector<std::vector<OutputPlan>> fresh;  // per fresh (non-aliasing) return: its tensor(s)
  std::vector<bool> fresh_is_list;             // that return is a Tensor[]
  std::vector<OutResize> resizes;              // non-empty: resize these outs, then key again
};

// Function-local statics: kernels are constructed by other translation units' static registrations.
std::mutex& all_kernels_mutex() {
  static std::mutex m;
  return m;
}
std::vector<class SpecKernel*>& all_kernels() {
  static std::vector<class SpecKernel*> kernels;
  return kernels;
}

class SpecKernel final : public c10::OperatorKernel {
 public:
  SpecKernel(const OpSpec& spec, MetaCallFn meta) : spec_(spec), meta_(meta) {
    std::lock_guard<std::mutex> lock(all_kernels_mutex());
    all_kernels().push_back(this);
  }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    calls_.fetch_add(1, std::memory_order_relaxed);
    const size_t n = spec_.args.size();
    TORCH_INTERNAL_ASSERT(stack->size() >= n);
    c10::IValue* args = stack->data() + (stack->size() - n);

    // A transfer between devices (x.to("cpu"), cpu_tensor.to("tpu")): the composite kernel
    // allocates on the target and copies.
    bool has_device_arg = false, crosses_devices = false;
    for (size_t i = 0; i < n; ++i) {
      if (args[i].isDevice()) {
        has_device_arg = true;
        crosses_devices |= args[i].toDevice().type() != c10::DeviceType::PrivateUse1;
      } else if (args[i].isTensor() && args[i].toTensor().defined()) {
        crosses_devices |= !is_tpu(args[i].toTensor());
      }
    }
    if (has_device_arg && crosses_devices) {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CompositeExplicitAutograd), stack);
      return;
    }

    for (size_t i = 0; i < n; ++i) {
      if (spec_.args[i] == ArgKind::OptionalTensorList) args[i] = expand_indices(args[i], args[0].toTensor());
    }

    int device = -1;
    KeyWriter key;
    key.s.reserve(160);
    for (size_t i = 0; i < n; ++i) {
      switch (spec_.args[i]) {
        case ArgKind::OptionalTensorList: {
          const auto list = args[i].toListRef();
          key.i(static_cast<int64_t>(list.size()));
          for (const c10::IValue& e : list) key_tensor(key, e.isTensor() ? e.toTensor() : at::Tensor(), device);
          break;
        }
        case ArgKind::Tensor:
          key_tensor(key, args[i].isTensor() ? args[i].toTensor() : at::Tensor(), device);
          break;
        case ArgKind::TensorList: {
          const auto list = args[i].toTensorList();
          key.i(static_cast<int64_t>(list.size()));
          for (const at::Tensor& t : list) key_tensor(key, t, device);
          break;
        }
        case ArgKind::Scalar:
          key_scalar_kind(key, args[i]);
          break;
        case ArgKind::ScalarList: {
          const auto list = args[i].toListRef();
          key.i(static_cast<int64_t>(list.size()));
          for (const c10::IValue& v : list) key_scalar_kind(key, v);
          break;
        }
        case ArgKind::Attr:
          key_attr(key, args[i]);
          break;
        case ArgKind::Generator:
        case ArgKind::Ignored:
          break;
      }
    }
    if (device < 0) device = current_device();

    std::shared_ptr<Entry> entry;  // shared: another thread may clear the caches meanwhile
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = cache_.find(key.s);
      if (it != cache_.end()) entry = it->second;
    }
    if (!entry) {
      // Executables hold memory mappings of JIT code; a process has ~65k. Past the budget, drop
      // the in-process caches (the disk tier reloads what is used again). The mappings are
      // counted every 64th miss (reading /proc/self/maps costs about a millisecond).
      static std::atomic<int64_t> misses{0};
      if (runtime().metrics().live_executables.load() >= rt::kMaxLiveExecutables ||
          (++misses % 64 == 0 && rt::process_memory_mappings() >= rt::kMaxMemoryMappings)) {
        clear_kernel_caches();
        runtime().clear_in_process_cache();
      }
      std::shared_ptr<Entry> built = build(op, args, device);
      std::lock_guard<std::mutex> lock(mutex_);
      entry = cache_.emplace(key.s, std::move(built)).first->second;
    }
    if (!entry->resizes.empty()) {
      for (const OutResize& r : entry->resizes) {
        const at::Tensor& out = args[r.arg].toTensor();
        out.resize_(r.sizes);
        if (out.strides() != c10::IntArrayRef(r.strides)) {
          out.unsafeGetTensorImpl()->set_sizes_and_strides(r.sizes, r.strides);
        }
      }
      return (*this)(op, c10::DispatchKeySet(), stack);
    }
    run(*entry, args, n, device, stack);
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    cache_.clear();
  }
  int64_t calls() const { return calls_.load(std::memory_order_relaxed); }
  const char* overload() const { return spec_.overload; }
  size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return cache_.size();
  }

 private:
  static void key_scalar_kind(KeyWriter& key, const c10::IValue& v) {
    key.tag(v.isNone() ? 'N' : v.toScalar().isFloatingPoint() ? 'f' : v.toScalar().isBoolean() ? 'b' : 'i');
  }

  // The tensors a written argument holds: itself, the elements of a list, none for an absent Tensor?.
  static std::vector<at::Tensor> written_tensors(const c10::IValue& v) {
    if (v.isTensorList()) return v.toTensorVector();
    if (v.isTensor() && v.toTensor().defined()) return {v.toTensor()};
    return {};
  }

  const at::Tensor& tensor_at(const c10::IValue* args, int arg, int index, at::Tensor& holder) const {
    if (index < 0) {
      holder = args[arg].toTensor();
    } else if (spec_.args[arg] == ArgKind::OptionalTensorList) {
      holder = args[arg].toListRef()[index].toTensor();
    } else {
      holder = args[arg].toTensorList().get(index);
    }
    return holder;
  }

  void run(const Entry& entry, c10::IValue* args, size_t n, int device, torch::jit::Stack* stack) {
    std::vector<rt::BufferPtr> keep;
    std::vector<PJRT_Buffer*> raw;
    keep.reserve(entry.params.size());
    raw.reserve(entry.params.size());
    at::Tensor holder;
    for (const ParamSource& p : entry.params) {
      if (p.kind == ParamSource::Storage) {
        keep.push_back(storage_of(tensor_at(args, p.arg, p.index, holder)).buffer);
      } else if (p.kind == ParamSource::Random) {
        const auto [seed, offset] = reserve_random(
            p.arg < 0 ? std::nullopt : args[p.arg].toOptional<at::Generator>(), device, p.random_words);
        const uint64_t state[2] = {seed, offset};
        keep.push_back(runtime().to_device(state, rt::ElementType::U64, {2}, device));
      } else {
        const c10::IValue& a = args[p.arg];
        const c10::Scalar value = a.isTensor()                 ? a.toTensor().item()
                                  : a.isTensorList()           ? tensor_at(args, p.arg, p.index, holder).item()
                                  : p.index >= 0 && a.isList() ? a.toListRef()[p.index].toScalar()
                                                               : a.toScalar();
        keep.push_back(scalar_buffer(value, p.element, device));
      }
      raw.push_back(keep.back()->raw());
    }
    auto outputs = runtime().execute(*entry.exe, raw, device);
    int64_t rows = -1;  // data_dependent: the outputs' real row count, read from the module's last result
    if (spec_.data_dependent) {
      runtime().to_host(*outputs.back(), &rows, sizeof rows);  // synchronizes: the shape is the data's
    }
    if (g_capture_next_execution) {
      g_captured = CapturedExecution{entry.exe, keep, device};
      g_capture_next_execution = false;
    }

    // Module results: the fresh returns' tensors (undefined ones have none), then the written tensors.
    size_t next = 0;
    std::vector<c10::IValue> fresh;
    for (size_t j = 0; j < entry.fresh.size(); ++j) {
      std::vector<at::Tensor> tensors;
      for (const OutputPlan& plan : entry.fresh[j]) {
        std::vector<int64_t> sizes = plan.sizes;
        if (rows >= 0) sizes.at(0) = rows;  // data_dependent: the real rows of the padded result
        tensors.push_back(plan.defined ? wrap_buffer(outputs[next++], plan.dtype, sizes, plan.strides, 0, device)
                                       : at::Tensor());
      }
      if (entry.fresh_is_list[j]) {
        fresh.emplace_back(c10::List<at::Tensor>(tensors));
      } else {
        fresh.emplace_back(std::move(tensors.at(0)));
      }
    }
    for (int w : spec_.written) {
      for (const at::Tensor& t : written_tensors(args[w])) storage_of(t).buffer = outputs.at(next++);
    }
    std::vector<c10::IValue> returns;
    size_t next_fresh = 0;
    for (int r : spec_.returns) returns.push_back(r >= 0 ? args[r] : std::move(fresh.at(next_fresh++)));
    torch::jit::drop(*stack, n);
    for (auto& r : returns) stack->push_back(std::move(r));
  }

  std::unique_ptr<Entry> build(const c10::OperatorHandle& op, c10::IValue* args, int device) {
    const size_t n = spec_.args.size();
    auto entry = std::make_unique<Entry>();

    // 1. Meta pass: PyTorch's own shape/dtype rules and error messages.
    std::vector<c10::IValue> meta_args;
    meta_args.reserve(n);
    for (size_t i = 0; i < n; ++i) meta_args.push_back(to_meta(args[i]));
    torch::jit::Stack meta(meta_args.begin(), meta_args.end());
    if (spec_.data_dependent) {
      meta.clear();  // no Meta pass: the lowering's padded results give the outputs (after emission)
    } else if (meta_) {
      meta_(meta);
    } else {
      op.callBoxed(&meta);
    }

    auto plan_of = [](const at::Tensor& t) {
      if (!t.defined()) return OutputPlan{at::kFloat, {}, {}, false};  // an output output_mask turned off
      return OutputPlan{t.scalar_type(), t.sizes().vec(), t.strides().vec()};
    };
    if (spec_.variant == Variant::Out) {
      for (int w : spec_.written) {
        if (!meta_args[w].isTensor()) continue;
        const at::Tensor& resized = meta_args[w].toTensor();
        const at::Tensor& real = args[w].toTensor();
        if (resized.defined() && resized.sizes() != real.sizes()) {
          entry->resizes.push_back(OutResize{static_cast<int>(w), resized.sizes().vec(), resized.strides().vec()});
        }
      }
      if (!entry->resizes.empty()) return entry;
    }
    TORCH_INTERNAL_ASSERT(spec_.data_dependent || meta.size() == spec_.returns.size(), "torchtpu: the Meta pass of aten::",
                          spec_.overload, " returned ", meta.size(), " values for ", spec_.returns.size(), " returns");
    std::vector<std::vector<OutputPlan>> fresh;  // data_dependent: filled from the lowering's results instead
    std::vector<bool> fresh_is_list;
    for (size_t j = 0; j < meta.size(); ++j) {
      if (spec_.returns[j] >= 0) continue;
      const c10::IValue& r = meta[j];
      std::vector<OutputPlan> plans;
      if (r.isTensorList()) {
        for (const at::Tensor& t : r.toTensorVector()) plans.push_back(plan_of(t));
      } else {
        plans.push_back(plan_of(r.isTensor() ? r.toTensor() : at::Tensor()));
      }
      fresh.push_back(std::move(plans));
      fresh_is_list.push_back(r.isTensorList());
    }
    std::vector<OutputPlan> written_plans;  // the written tensors, flattened
    for (int w : spec_.written) {
      for (const at::Tensor& t : written_tensors(args[w])) written_plans.push_back(plan_of(t));
    }

    // 2. The dtype the lowering computes in: for `output`, the first fresh result's, else the first written one's.
    std::optional<at::ScalarType> output_dtype;
    for (const auto& plans : fresh) {
      for (const OutputPlan& p : plans) {
        if (p.defined && !output_dtype) output_dtype = p.dtype;
      }
    }
    if (!output_dtype && !written_plans.empty()) output_dtype = written_plans.front().dtype;
    at::ScalarType compute = output_dtype.value_or(at::kLong);  // data_dependent: compute is never output
    if (spec_.compute != Compute::Output) {
      at::native::ResultTypeState state{};
      for (int i : spec_.promoted) {
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
      if (spec_.compute == Compute::CommonFloat && c10::isIntegralType(compute, /*includeBool=*/true)) {
        compute = c10::typeMetaToScalarType(c10::get_default_dtype());
      }
    }
    const std::string compute_name = dtype_name(compute);
    bool supported = false;
    for (const auto& d : spec_.dtypes) supported |= d == compute_name;
    TORCH_CHECK_NOT_IMPLEMENTED(supported, "torchtpu: aten::", spec_.overload, " does not support dtype ",
                                compute_name, " on tpu (supported: ", c10::Join(", ", spec_.dtypes),
                                "; see ", spec_.source, ")");
    // Like PyTorch's opmath: half-precision floats compute in float32 and round once at the end.
    const rt::ElementType compute_element =
        compute == at::kHalf || compute == at::kBFloat16 ? rt::ElementType::F32 : element_type(compute);

    // 3. Emission: parameters, view reads, promotion, the spec's lowering, then the write-back.
    rt::Builder b;
    b.set_nominal_element(element_type(compute));
    EmitArgs ea;
    ea.args.resize(n + (spec_.implicit_generator ? 1 : 0));
    // The current value of each written tensor's storage, keyed by (argument, element), where it
    // is a parameter (a lazy storage has no contents to keep).
    std::map<std::pair<int, int>, rt::Value> written_storages;
    auto is_written = [&](int i) { return std::find(spec_.written.begin(), spec_.written.end(), i) != spec_.written.end(); };
    auto is_promoted = [&](int i) {
      return std::find(spec_.promoted.begin(), spec_.promoted.end(), i) != spec_.promoted.end();
    };
    auto emit_tensor = [&](const at::Tensor& t, int arg, int index, bool promote) -> EmitArg {
      if (!t.defined()) return std::monostate{};
      rt::Value v;
      if (is_cpu_scalar(t)) {
        const rt::ElementType e = promote ? compute_element : element_type(t.scalar_type());
        entry->params.push_back(ParamSource{ParamSource::Scalar, arg, index, e});
        v = b.parameter(rt::TensorType{e, {}});
      } else {
        bool lazy = false;
        const rt::TensorType st = storage_type(t, &lazy);
        if (!lazy) entry->params.push_back(ParamSource{ParamSource::Storage, arg, index, st.element});
        const rt::Value storage = storage_value(b, st, lazy);
        if (!lazy && is_written(arg)) written_storages.emplace(std::make_pair(arg, index), storage);
        v = read_tensor(b, storage, t);
      }
      return promote ? b.convert(v, compute_element) : v;
    };
    for (size_t i = 0; i < n; ++i) {
      const c10::IValue& a = args[i];
      const int arg = static_cast<int>(i);
      switch (spec_.args[i]) {
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
          entry->params.push_back(ParamSource{ParamSource::Scalar, arg, -1, e});
          ea.args[i] = b.parameter(rt::TensorType{e, {}});
          break;
        }
        case ArgKind::ScalarList: {
          std::vector<rt::Value> values;
          const auto list = a.toListRef();
          for (size_t j = 0; j < list.size(); ++j) {
            const rt::ElementType e = is_promoted(arg) ? compute_element : natural_element(list[j].toScalar());
            entry->params.push_back(ParamSource{ParamSource::Scalar, arg, static_cast<int>(j), e});
            values.push_back(b.parameter(rt::TensorType{e, {}}));
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
          else if (a.isScalar()) ea.args[i] = a.toScalar().toDouble();
          break;
        case ArgKind::Generator:
          ea.args[i] = random_state_parameter(b, *entry, arg, fresh, written_plans);
          break;
        case ArgKind::Ignored:
          break;
      }
    }
    if (spec_.implicit_generator) ea.args[n] = random_state_parameter(b, *entry, -1, fresh, written_plans);

    std::vector<rt::Value> results;
    try {
      results = spec_.emit(b, ea);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "torchtpu: emitting aten::", spec_.overload, " (", spec_.source, ") failed: ", e.what());
    }

    for (ParamSource& p : entry->params) {  // the generator advances past every counter the module used
      if (p.kind == ParamSource::Random) p.random_words = std::max<uint64_t>(p.random_words, b.random_counters() + 16);
    }
    std::optional<rt::Value> count;
    if (spec_.data_dependent) {  // padded outputs, then the count of real rows
      TORCH_CHECK(results.size() >= 2, "torchtpu: the lowering of aten::", spec_.overload, " (", spec_.source,
                  ") is data_dependent: it returns the padded outputs and then a count");
      count = b.convert(results.back(), rt::ElementType::S64);
      results.pop_back();
      for (const rt::Value& r : results) {
        const at::ScalarType dtype = r.element() == compute_element ? compute : scalar_type(r.element());
        const auto strides = c10::contiguous_strides(r.dims());
        fresh.push_back({OutputPlan{dtype, r.dims(), std::vector<int64_t>(strides.begin(), strides.end())}});
        fresh_is_list.push_back(false);
      }
    }
    // The lowering's results, slot by slot: each fresh return, then each written argument. A slot
    // holds one value, or for a foreach op one per element of its first list argument.
    const size_t per_slot = spec_.foreach ? list_length(args) : 1;
    const size_t slots = fresh.size() + spec_.written.size();
    TORCH_CHECK(results.size() == slots * per_slot, "torchtpu: the lowering of aten::", spec_.overload, " (",
                spec_.source, ") returns ", results.size(), " values; the op needs ", slots * per_slot);
    std::vector<rt::Value> module_results;
    for (size_t j = 0; j < fresh.size(); ++j) {
      TORCH_CHECK(fresh[j].size() == per_slot, "torchtpu: aten::", spec_.overload, " returns ", fresh[j].size(),
                  " tensors where its lowering gives ", per_slot);
      for (size_t e = 0; e < per_slot; ++e) {
        const OutputPlan& plan = fresh[j][e];
        if (!plan.defined) continue;
        // An empty output has no elements to compute (eval batch norm's save_mean is [0]).
        const rt::TensorType out_type{element_type(plan.dtype), plan.sizes};
        rt::Value v = out_type.numel() == 0
                          ? b.full(0, out_type)
                          : b.broadcast_to(b.convert(results[j * per_slot + e], out_type.element), plan.sizes);
        const int64_t itemsize = static_cast<int64_t>(c10::elementSize(plan.dtype));
        const int64_t storage_numel =
            static_cast<int64_t>(at::detail::computeStorageNbytes(plan.sizes, plan.strides, itemsize)) / itemsize;
        const bool contiguous = c10::contiguous_strides(plan.sizes) == c10::DimVector(plan.strides.begin(), plan.strides.end());
        const rt::TensorType st{element_type(plan.dtype), contiguous ? plan.sizes : std::vector<int64_t>{storage_numel}};
        module_results.push_back(b.write_view(nullptr, st, v, rt::ViewGeometry{plan.sizes, plan.strides, 0}));
      }
    }
    for (size_t w = 0; w < spec_.written.size(); ++w) {
      const int arg = spec_.written[w];
      const c10::IValue& a = args[arg];
      const size_t slot = (fresh.size() + w) * per_slot;
      if (a.isTensorList()) {
        const auto list = a.toTensorVector();
        // A shorter list (an empty max_exp_avg_sqs without amsgrad) has no values to write.
        TORCH_CHECK(list.empty() || list.size() == per_slot, "torchtpu: aten::", spec_.overload, ": list argument ",
                    arg, " has ", list.size(), " tensors, expected ", per_slot);
        for (size_t e = 0; e < list.size(); ++e) {
          module_results.push_back(write_back(b, written_storages, arg, static_cast<int>(e), results[slot + e], list[e]));
        }
      } else if (a.isTensor() && a.toTensor().defined()) {
        module_results.push_back(write_back(b, written_storages, arg, -1, results[slot], a.toTensor()));
      }
    }

    if (count) module_results.push_back(*count);

    std::vector<rt::TensorType> types;
    for (const auto& r : module_results) types.push_back(r.type);
    entry->exe = runtime().compile(b.finish(module_results), types);
    entry->fresh = std::move(fresh);
    entry->fresh_is_list = std::move(fresh_is_list);
    return entry;
  }

  // Length of a foreach op's first list argument.
  size_t list_length(const c10::IValue* args) const {
    for (size_t i = 0; i < spec_.args.size(); ++i) {
      if (spec_.args[i] == ArgKind::TensorList || spec_.args[i] == ArgKind::ScalarList) return args[i].toListRef().size();
    }
    TORCH_INTERNAL_ASSERT(false, "torchtpu: foreach op aten::", spec_.overload, " has no list argument");
  }

  // The (seed, offset) parameter of a random op: room for two 32-bit draws per element it writes
  // (Box-Muller) and rounding, so that streams never overlap.
  static rt::Value random_state_parameter(rt::Builder& b, Entry& entry, int arg,
                                          const std::vector<std::vector<OutputPlan>>& fresh,
                                          const std::vector<OutputPlan>& written) {
    int64_t numel = 0;
    for (const auto& plans : fresh) {
      for (const OutputPlan& o : plans) numel += o.defined ? c10::multiply_integers(o.sizes) : 0;
    }
    for (const OutputPlan& o : written) numel += c10::multiply_integers(o.sizes);
    const uint64_t words = static_cast<uint64_t>(numel) + 16;
    entry.params.push_back(ParamSource{ParamSource::Random, arg, -1, rt::ElementType::U64, words});
    return b.parameter(rt::TensorType{rt::ElementType::U64, {2}});
  }

  // The new contents of a written tensor's storage after writing `value` through it.
  static rt::Value write_back(rt::Builder& b, const std::map<std::pair<int, int>, rt::Value>& storages, int arg,
                              int index, const rt::Value& value, const at::Tensor& target) {
    bool lazy = false;
    const rt::TensorType st = storage_type(target, &lazy);
    const auto it = storages.find({arg, index});
    return write_tensor(b, it == storages.end() ? nullptr : &it->second, st, value, target);
  }

  const OpSpec& spec_;
  const MetaCallFn meta_;
  std::atomic<int64_t> calls_{0};
  std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<Entry>> cache_;
};

// --- modules built by the runtime itself (copies, reads, resizes) -----------------------------

std::mutex g_modules_mutex;
std::unordered_map<std::string, rt::ExecutablePtr> g_modules;

std::mutex g_scalars_mutex;
std::unordered_map<std::string, rt::BufferPtr> g_scalars;

std::string geometry_key(const at::Tensor& t) {
  KeyWriter k;
  int device = t.device().index();
  key_tensor(k, t, device);
  return k.s;
}

// --- host <-> device copies and scalar reads --------------------------------------------------

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (dst.numel() == 0) return dst;
  if (is_tpu(self) && is_tpu(dst)) {
    if (self.device() != dst.device()) {
      dst.copy_(self.cpu());
      return dst;
    }
    // On device: read the source view, convert, broadcast, write through the destination view.
    bool src_lazy = false, dst_lazy = false;
    const rt::TensorType src_type = storage_type(self, &src_lazy);
    const rt::TensorType dst_type = storage_type(dst, &dst_lazy);
    std::vector<rt::BufferPtr> inputs;
    if (!src_lazy) inputs.push_back(storage_of(self).buffer);
    if (!dst_lazy) inputs.push_back(storage_of(dst).buffer);
    auto out = run_module(
        "copy:" + geometry_key(self) + "->" + geometry_key(dst), inputs,
        [&](rt::Builder& b) {
          rt::Value src = read_tensor(b, storage_value(b, src_type, src_lazy), self);
          rt::Value old = dst_lazy ? rt::Value{} : b.parameter(dst_type);
          return std::vector<rt::Value>{write_tensor(b, dst_lazy ? nullptr : &old, dst_type, src, dst)};
        },
        dst.device().index());
    storage_of(dst).buffer = out[0];
    return dst;
  }
  if (is_tpu(dst)) {
    const at::Tensor host = self.to(dst.scalar_type()).expand(dst.sizes()).contiguous();
    auto buffer = runtime().to_device(host.data_ptr(), element_type(dst.scalar_type()), dst.sizes().vec(),
                                      dst.device().index());
    write_into(dst, buffer);
    return dst;
  }
  TORCH_CHECK(is_tpu(self), "torchtpu: _copy_from between ", self.device(), " and ", dst.device());
  auto buffer = read_contiguous(self, element_type(self.scalar_type()));
  at::Tensor host = at::empty(self.sizes(), self.options().device(c10::kCPU));
  runtime().to_host(*buffer, host.data_ptr(), host.nbytes());
  dst.copy_(host);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  auto buffer = read_contiguous(self, element_type(self.scalar_type()));
  at::Tensor host = at::empty({}, self.options().device(c10::kCPU));
  runtime().to_host(*buffer, host.data_ptr(), host.nbytes());
  return host.item();
}

// --- CPU fallback -----------------------------------------------------------------------------

std::mutex g_fallback_mutex;
std::unordered_map<std::string, int64_t> g_fallbacks;
bool g_fallback_is_error = false;

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& name = op.schema().operator_name();
  const std::string full = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
  TORCH_CHECK_NOT_IMPLEMENTED(!g_fallback_is_error, "torchtpu: ", full,
                              " has no spec, and TORCHTPU_FALLBACK=error forbids running it on the CPU. "
                              "Add it to a file in specs/ and run `python -m codegen.gen`.");
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(g_fallback_mutex);
    first = g_fallbacks[full]++ == 0;
  }
  if (first) {
    TORCH_WARN("torchtpu: ", full, " has no spec yet, so it runs on the CPU (slow). Add an entry for it to a ",
               "file in specs/ and run `python -m codegen.gen`.");
  }
  at::native::cpu_fallback(op, stack);
}

// torch.ops.torchtpu.emitter_chain(["exp", "neg"], x): one module in which each named unary
// spec's emitter consumes the previous one's value -- the way a whole graph is lowered.
void emitter_chain(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  const at::Tensor x = stack->back().toTensor();
  const auto names = (*stack)[stack->size() - 2].toList();
  std::vector<const OpSpec*> chain;
  std::string key = "chain:";
  for (const c10::IValue& name : names) {
    const std::string& overload = name.toStringRef();
    const OpSpec* found = nullptr;
    for (const OpSpec& spec : op_specs()) {
      if (overload == spec.overload && spec.variant == Variant::Functional) found = &spec;
    }
    TORCH_CHECK(found && found->args.size() == 1 && found->args[0] == ArgKind::Tensor,
                "torchtpu: emitter_chain takes functional one-tensor specs; '", overload, "' is not one");
    chain.push_back(found);
    key += overload + ",";
  }
  TORCH_CHECK(is_tpu(x) && at::isFloatingType(x.scalar_type()), "torchtpu: emitter_chain takes a float tpu tensor");
  bool lazy = false;
  const rt::TensorType st = storage_type(x, &lazy);
  std::vector<rt::BufferPtr> inputs;
  if (!lazy) inputs.push_back(storage_of(x).buffer);
  auto out = run_module(
      key + geometry_key(x), inputs,
      [&](rt::Builder& b) {
        rt::Value v = read_tensor(b, storage_value(b, st, lazy), x);
        for (const OpSpec* spec : chain) {
          EmitArgs ea;
          ea.args.push_back(v);
          v = spec->emit(b, ea).at(0);
        }
        return std::vector<rt::Value>{v};
      },
      x.device().index());
  const at::Tensor result =
      wrap_buffer(out[0], x.scalar_type(), x.sizes(), c10::contiguous_strides(x.sizes()), 0, x.device().index());
  torch::jit::drop(*stack, 2);
  stack->emplace_back(result);
}

}  // namespace

void capture_next_execution() { g_capture_next_execution = true; }

double repeat_captured_execution_ns(int iterations) {
  TORCH_CHECK(g_captured.exe, "torchtpu: no execution was captured");
  std::vector<PJRT_Buffer*> raw;
  for (const auto& b : g_captured.inputs) raw.push_back(b->raw());
  auto& rt = runtime();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) rt.execute(*g_captured.exe, raw, g_captured.device);
  rt.synchronize();
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
  return static_cast<double>(ns.count()) / iterations;
}

torch::CppFunction spec_kernel(const OpSpec& spec, MetaCallFn meta) {
  return torch::CppFunction::makeFromBoxedFunctor(std::make_unique<SpecKernel>(spec, meta));
}

std::vector<rt::BufferPtr> run_module(const std::string& key, const std::vector<rt::BufferPtr>& inputs,
                                      const std::function<std::vector<rt::Value>(rt::Builder&)>& build, int device) {
  rt::ExecutablePtr exe;
  {
    std::lock_guard<std::mutex> lock(g_modules_mutex);
    auto it = g_modules.find(key);
    if (it != g_modules.end()) exe = it->second;
  }
  if (!exe) {
    rt::Builder b;
    auto results = build(b);
    std::vector<rt::TensorType> types;
    for (const auto& r : results) types.push_back(r.type);
    exe = runtime().compile(b.finish(results), types);
    std::lock_guard<std::mutex> lock(g_modules_mutex);
    g_modules.emplace(key, exe);
  }
  std::vector<PJRT_Buffer*> raw;
  for (const auto& in : inputs) raw.push_back(in->raw());
  return runtime().execute(*exe, raw, device);
}

rt::BufferPtr scalar_buffer(const c10::Scalar& value, rt::ElementType element, int device) {
  unsigned char bytes[8] = {0};
  switch (element) {
    case rt::ElementType::Pred: bytes[0] = value.toBool() ? 1 : 0; break;
    case rt::ElementType::S8: { int8_t v = value.toChar(); std::memcpy(bytes, &v, 1); break; }
    case rt::ElementType::S16: { int16_t v = value.toShort(); std::memcpy(bytes, &v, 2); break; }
    case rt::ElementType::S32: { int32_t v = value.toInt(); std::memcpy(bytes, &v, 4); break; }
    case rt::ElementType::S64: { int64_t v = value.toLong(); std::memcpy(bytes, &v, 8); break; }
    case rt::ElementType::U8: { uint8_t v = value.toByte(); std::memcpy(bytes, &v, 1); break; }
    case rt::ElementType::U16: { uint16_t v = value.to<uint16_t>(); std::memcpy(bytes, &v, 2); break; }
    case rt::ElementType::U32: { uint32_t v = value.to<uint32_t>(); std::memcpy(bytes, &v, 4); break; }
    case rt::ElementType::U64: { uint64_t v = value.to<uint64_t>(); std::memcpy(bytes, &v, 8); break; }
    case rt::ElementType::F16: { c10::Half v = value.toHalf(); std::memcpy(bytes, &v, 2); break; }
    case rt::ElementType::BF16: { c10::BFloat16 v = value.toBFloat16(); std::memcpy(bytes, &v, 2); break; }
    case rt::ElementType::F32: { float v = value.toFloat(); std::memcpy(bytes, &v, 4); break; }
    case rt::ElementType::F64: { double v = value.toDouble(); std::memcpy(bytes, &v, 8); break; }
  }
  std::string key(reinterpret_cast<const char*>(bytes), 8);
  key.push_back(static_cast<char>(element));
  key.push_back(static_cast<char>(device));
  {
    std::lock_guard<std::mutex> lock(g_scalars_mutex);
    auto it = g_scalars.find(key);
    if (it != g_scalars.end()) return it->second;
  }
  auto buffer = runtime().to_device(bytes, element, {}, device);
  std::lock_guard<std::mutex> lock(g_scalars_mutex);
  if (g_scalars.size() > 1024) g_scalars.clear();  // bounded: values seen once (loss scales, lr) don't pile up
  g_scalars.emplace(key, buffer);
  return buffer;
}

void write_into(const at::Tensor& dst, const rt::BufferPtr& value_buffer) {
  TpuStorage& storage = storage_of(dst);
  const int64_t itemsize = static_cast<int64_t>(dst.dtype().itemsize());
  if (dst.is_contiguous() && dst.storage_offset() == 0 &&
      dst.numel() * itemsize == static_cast<int64_t>(storage.nbytes)) {
    storage.buffer = value_buffer;  // the write covers the whole storage
    return;
  }
  bool lazy = false;
  const rt::TensorType st = storage_type(dst, &lazy);
  std::vector<rt::BufferPtr> inputs{value_buffer};
  if (!lazy) inputs.push_back(storage.buffer);
  auto out = run_module(
      "write:" + geometry_key(dst), inputs,
      [&](rt::Builder& b) {
        rt::Value v = b.parameter(rt::TensorType{value_buffer->type(), value_buffer->dims()});
        rt::Value old = lazy ? rt::Value{} : b.parameter(st);
        return std::vector<rt::Value>{write_tensor(b, lazy ? nullptr : &old, st, v, dst)};
      },
      storage.device);
  storage.buffer = out[0];
}

rt::BufferPtr read_contiguous(const at::Tensor& src, rt::ElementType element) {
  const TpuStorage& storage = storage_of(src);
  if (storage.buffer && storage.buffer->type() == element && element == element_type(src.scalar_type()) &&
      src.is_contiguous() && src.storage_offset() == 0 &&
      storage.buffer->dims() == src.sizes().vec()) {
    return storage.buffer;
  }
  bool lazy = false;
  const rt::TensorType st = storage_type(src, &lazy);
  std::vector<rt::BufferPtr> inputs;
  if (!lazy) inputs.push_back(storage.buffer);
  auto out = run_module(
      "read:" + geometry_key(src) + rt::mlir_name(element), inputs,
      [&](rt::Builder& b) {
        return std::vector<rt::Value>{b.convert(read_tensor(b, storage_value(b, st, lazy), src), element)};
      },
      storage.device);
  return out[0];
}

std::vector<std::pair<std::string, int64_t>> fallback_counts() {
  std::lock_guard<std::mutex> lock(g_fallback_mutex);
  return {g_fallbacks.begin(), g_fallbacks.end()};
}

void set_fallback_is_error(bool error) { g_fallback_is_error = error; }

void clear_kernel_caches() {
  {
    std::lock_guard<std::mutex> lock(all_kernels_mutex());
    for (auto* k : all_kernels()) k->clear();
  }
  std::lock_guard<std::mutex> lock(g_modules_mutex);
  g_modules.clear();
}

std::vector<std::pair<std::string, int64_t>> spec_op_calls() {
  std::vector<std::pair<std::string, int64_t>> calls;
  std::lock_guard<std::mutex> lock(all_kernels_mutex());
  for (auto* k : all_kernels()) {
    if (k->calls() > 0) calls.emplace_back(std::string("aten::") + k->overload(), k->calls());
  }
  return calls;
}

int64_t kernel_cache_size() {
  int64_t total = 0;
  std::lock_guard<std::mutex> lock(all_kernels_mutex());
  for (auto* k : all_kernels()) total += static_cast<int64_t>(k->size());
  return total;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
}

TORCH_LIBRARY(torchtpu, m) { m.def("emitter_chain(str[] overloads, Tensor x) -> Tensor"); }

TORCH_LIBRARY_IMPL(torchtpu, PrivateUse1, m) {
  m.impl("emitter_chain", torch::CppFunction::makeFromBoxedFunction<&emitter_chain>());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
}

}  // namespace torchtpu
