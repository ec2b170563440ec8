// The eager spec kernel: cache key -> (executable, output plans); on a miss the call is planned
// and emitted as a one-op module (spec_plan.cc, spec_emit.cc) and compiled; then executed. While a
// graph is captured, calls are emitted into the graph's module instead (graph.cc).
#include "aten/torch_kernel.h"

#include <ATen/WrapDimUtils.h>
#include <ATen/ops/any.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/ge.h>
#include <ATen/ops/item.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/lt.h>
#include <ATen/ops/ne.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "aten/graph.h"
#include "aten/op_trace.h"
#include "aten/spec_call.h"
#include "aten/torch_tpu.h"

namespace torchtpu {
namespace {

// Where a one-op module's parameters come from when it runs.
struct ParamSource {
  enum Kind : uint8_t { Storage, Scalar, Random } kind;
  int arg;    // Random: -1 for the default generator (an implicit-generator op)
  int index;  // element of a tensor or scalar list, or -1
  rt::ElementType element;
  uint64_t random_words = 0;  // Random: counter values one call consumes
};

// Eager inputs: every storage, runtime scalar and generator state is a parameter of the module.
class EagerInputs final : public InputSource {
 public:
  explicit EagerInputs(std::vector<ParamSource>& params) : params_(params) {}
  rt::TensorType storage_type(const at::Tensor& t) override {
    bool lazy = false;
    return torchtpu::storage_type(t, &lazy);
  }
  std::optional<rt::Value> storage(rt::Builder& b, const at::Tensor& t, int arg, int index) override {
    bool lazy = false;
    const rt::TensorType st = torchtpu::storage_type(t, &lazy);
    if (lazy) return std::nullopt;
    params_.push_back(ParamSource{ParamSource::Storage, arg, index, st.element});
    return b.parameter(st);
  }
  rt::Value cpu_scalar(rt::Builder& b, const at::Tensor&, int arg, int index, rt::ElementType element) override {
    params_.push_back(ParamSource{ParamSource::Scalar, arg, index, element});
    return b.parameter(rt::TensorType{element, {}});
  }
  rt::Value scalar(rt::Builder& b, const c10::IValue&, int arg, int index, rt::ElementType element) override {
    params_.push_back(ParamSource{ParamSource::Scalar, arg, index, element});
    return b.parameter(rt::TensorType{element, {}});
  }
  rt::Value random_state(rt::Builder& b, const c10::IValue*, int arg) override {
    params_.push_back(ParamSource{ParamSource::Random, arg, -1, rt::ElementType::U64});
    return b.parameter(rt::TensorType{rt::ElementType::U64, {2}});
  }
  void random_used(uint64_t words) override {
    for (ParamSource& p : params_) {
      if (p.kind == ParamSource::Random) p.random_words = words;
    }
  }

 private:
  std::vector<ParamSource>& params_;
};

// The benchmark's "bare PJRT" baseline: the executable and buffers of one real kernel call.
struct CapturedExecution {
  rt::ExecutablePtr exe;
  std::vector<rt::BufferPtr> inputs;
  int device = 0;
};
std::atomic<bool> g_capture_next_execution{false};
CapturedExecution g_captured;

struct Entry {
  rt::ExecutablePtr exe;
  std::vector<ParamSource> params;
  // (parameter, result): a written storage's new contents may reuse its buffer (donation).
  std::vector<std::pair<int, int>> aliases;
  CallPlan plan;  // plan.fresh: the emitted call's (a data_dependent op's padded results)
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

std::atomic<bool> g_check_indices{false};

// CPU's message with {value}, {dim}, {size} and {position} filled in.
std::string index_error_text(const char* message, int64_t value, int64_t dim, int64_t size, int64_t position) {
  std::string text;
  for (const char* p = message; *p; ++p) {
    const char* end = *p == '{' ? std::strchr(p, '}') : nullptr;
    if (!end) {
      text += *p;
      continue;
    }
    const std::string name(p + 1, end);
    text += std::to_string(name == "value" ? value : name == "dim" ? dim : name == "size" ? size : position);
    p = end;
  }
  return text;
}

// Raises CPU's error if a value of `index` lies outside [0, size) ([-size, size) where negative counts
// from the end). One flag is computed on the device and read back; only the error path copies the
// index to the CPU, to name the first bad value and its position.
void check_index_values(const IndexCheck& check, const at::Tensor& index, int64_t dim, int64_t size,
                        std::optional<int64_t> ignored) {
  if (!index.defined() || index.numel() == 0) return;
  at::Tensor bad = at::logical_or(at::lt(index, check.negative ? -size : 0), at::ge(index, size));
  if (ignored) bad = at::logical_and(bad, at::ne(index, *ignored));
  if (!at::any(bad).item<bool>()) return;
  const int64_t position = at::argmax(bad.cpu().reshape({-1}).to(at::kByte)).item<int64_t>();
  const int64_t value = index.cpu().reshape({-1})[position].item<int64_t>();
  const std::string text = index_error_text(check.message, value, dim, size, position);
  TORCH_CHECK_INDEX(!check.index_error, text);
  TORCH_CHECK(false, text);
}

void check_indices(const IndexCheck& check, const c10::IValue* args) {
  const at::Tensor& into = args[check.into].toTensor();
  const std::optional<int64_t> ignored =
      check.ignore >= 0 ? std::optional<int64_t>(args[check.ignore].toInt()) : std::nullopt;
  if (!args[check.index].isTensor()) {
    // Tensor?[]: entry k indexes dimension k; CPU's message numbers only the indexed dimensions.
    const auto entries = args[check.index].toListRef();
    int64_t indexed = 0;
    for (size_t k = 0; k < entries.size() && static_cast<int64_t>(k) < into.dim(); ++k) {
      if (entries[k].isTensor() && entries[k].toTensor().defined()) check_index_values(check, entries[k].toTensor(), indexed++, into.size(k), ignored);
    }
    return;
  }
  const at::Tensor& index = args[check.index].toTensor();
  if (check.dim_arg < 0 && check.dim_value == IndexCheck::kFlattened) {
    check_index_values(check, index, 0, into.numel(), ignored);
    return;
  }
  const int64_t dim = at::maybe_wrap_dim(check.dim_arg >= 0 ? args[check.dim_arg].toInt() : check.dim_value, into.dim());
  check_index_values(check, index, dim, into.dim() == 0 ? 1 : into.size(dim), ignored);
}

// Integer division by zero raises, as on CPU (whose message is just "ZeroDivisionError"). Reading
// whether a tpu divisor holds a zero synchronizes.
void check_divisor(const c10::IValue& divisor) {
  bool zero = false;
  if (divisor.isScalar()) {
    zero = divisor.toScalar().equal(0);
  } else if (divisor.isTensor() && divisor.toTensor().defined() && divisor.toTensor().numel() > 0) {
    zero = at::eq(divisor.toTensor(), 0).any().item<bool>();
  }
  TORCH_CHECK(!zero, "ZeroDivisionError");
}

void key_scalar_kind(KeyWriter& key, const c10::IValue& v) {
  key.tag(v.isNone() ? 'N' : v.toScalar().isFloatingPoint() ? 'f' : v.toScalar().isBoolean() ? 'b' : 'i');
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

    if (GraphCapture* capture = GraphCapture::active()) {
      // Fused eager mode records the same calls every iteration: their Meta pass runs once per key.
      std::string key;
      std::shared_ptr<const CallPlan> plan =
          capture->records_repeatedly() && !spec_.data_dependent ? cached_plan(op, args, key) : nullptr;
      if (plan && !plan->resizes.empty()) {  // out= tensors resized as eager resizes them, then planned again
        resize_outs(plan->resizes, args);
        plan = cached_plan(op, args, key);
      }
      if (capture->call(spec_, meta_, op, args, stack, plan.get(), plan ? &key : nullptr)) return;
    }

    int device = -1;
    const rt::Numerics numerics = current_numerics();
    const std::string key = call_key(args, device, numerics);
    TracedCall traced("op", device);
    std::shared_ptr<Entry> entry;  // shared: another thread may clear the caches meanwhile
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = cache_.find(key);
      if (it != cache_.end()) entry = it->second;
    }
    if (entry) {
      traced.set_cache("hit");
    } else {
      make_room_for_an_executable();
      std::shared_ptr<Entry> built = TracedCall::compile([&] { return build(op, args, numerics, device); });
      std::lock_guard<std::mutex> lock(mutex_);
      entry = cache_.emplace(key, std::move(built)).first->second;
    }
    if (!entry->plan.unsupported.empty()) {
      run_on_cpu(op, stack, entry->plan.unsupported);
      return;
    }
    if (!entry->plan.resizes.empty()) {
      resize_outs(entry->plan.resizes, args);
      return (*this)(op, c10::DispatchKeySet(), stack);
    }
    check_call_values(spec_, entry->plan.compute, args);
    std::string shapes = traced.recording() ? describe_args(args, spec_.args.size()) : std::string();  // before run() pops them
    traced.execute("tpu::execute", [&] { run(*entry, args, n, device, stack); });
    if (traced.recording()) traced.record(std::string("aten::") + spec_.overload, std::move(shapes));
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    cache_.clear();
    plans_.clear();
  }
  int64_t calls() const { return calls_.load(std::memory_order_relaxed); }
  const char* overload() const { return spec_.overload; }
  size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return cache_.size();
  }

 private:
  // The op, every argument's view and storage metadata and the compile-time attributes. Sets
  // `device` from the tensors (the current device where there are none).
  std::string call_key(const c10::IValue* args, int& device, const rt::Numerics& numerics) const {
    KeyWriter key;
    key.s.reserve(160);
    key_numerics(key, numerics);
    for (size_t i = 0; i < spec_.args.size(); ++i) {
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
    // Written tensors sharing a storage make a module whose writes build on each other.
    std::unordered_map<const TpuStorage*, int64_t> first_written;
    int64_t position = 0;
    for (int w : spec_.written) {
      for (const at::Tensor& t : written_tensors(args[w])) {
        const auto [it, first] = first_written.emplace(&storage_of(t), position);
        if (!first) key.tag('W'), key.i(position), key.i(it->second);
        ++position;
      }
    }
    if (device < 0) device = current_device();
    return std::move(key.s);
  }

  // The plan of a call with this key (its Meta pass runs on the first); `key`: the call's key.
  std::shared_ptr<const CallPlan> cached_plan(const c10::OperatorHandle& op, const c10::IValue* args, std::string& key) {
    int device = -1;
    key = call_key(args, device, current_numerics());
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = plans_.find(key);
      if (it != plans_.end()) return it->second;
    }
    auto plan = std::make_shared<const CallPlan>(plan_call(spec_, meta_, op, args));
    std::lock_guard<std::mutex> lock(mutex_);
    return plans_.emplace(key, std::move(plan)).first->second;
  }

  void run(const Entry& entry, c10::IValue* args, size_t n, int device, torch::jit::Stack* stack) {
    std::vector<rt::BufferPtr> keep;
    std::vector<PJRT_Buffer*> raw;
    keep.reserve(entry.params.size());
    raw.reserve(entry.params.size());
    at::Tensor holder;
    for (const ParamSource& p : entry.params) {
      if (p.kind == ParamSource::Storage) {
        keep.push_back(storage_of(tensor_arg(spec_, args, p.arg, p.index, holder)).buffer);
      } else if (p.kind == ParamSource::Random) {
        const auto [seed, offset] = reserve_random(
            p.arg < 0 ? std::nullopt : args[p.arg].toOptional<at::Generator>(), device, p.random_words);
        const uint64_t state[2] = {seed, offset};
        keep.push_back(runtime().to_device(state, rt::ElementType::U64, {2}, device));
      } else {
        const c10::IValue& a = args[p.arg];
        const c10::Scalar value = a.isTensor()                 ? a.toTensor().item()
                                  : a.isTensorList()           ? tensor_arg(spec_, args, p.arg, p.index, holder).item()
                                  : p.index >= 0 && a.isList() ? a.toListRef()[p.index].toScalar()
                                                               : a.toScalar();
        keep.push_back(scalar_buffer(value, p.element, device));
      }
      raw.push_back(keep.back()->raw());
    }
    // A captured execution is replayed by the benchmark: its inputs must outlive it (no donation).
    const bool capturing = g_capture_next_execution;
    auto outputs = runtime().execute(*entry.exe, raw, device,
                                     capturing ? std::vector<int64_t>{} : donatable(entry.aliases, keep), &keep);
    int64_t rows = -1;  // data_dependent: the outputs' real row count, read from the module's last result
    if (spec_.data_dependent) {
      runtime().to_host(*outputs.back(), &rows, sizeof rows);  // synchronizes: the shape is the data's
    }
    if (capturing) {
      g_captured = CapturedExecution{entry.exe, keep, device};
      g_capture_next_execution = false;
    }

    // Module results: the fresh returns' tensors (undefined ones have none), then the written
    // storages' new contents (stored before the arguments leave the stack).
    size_t next_written = defined_count(entry.plan.fresh);
    for (int w : spec_.written) {
      for (const at::Tensor& t : written_tensors(args[w])) storage_of(t).buffer = outputs.at(next_written++);
    }
    size_t next = 0;
    push_returns(spec_, entry.plan.fresh, entry.plan.fresh_is_list, args, stack, [&](const OutputPlan& plan) {
      std::vector<int64_t> sizes = plan.sizes;
      // data_dependent: the real rows of a padded return that is cut (one left empty stays empty).
      const auto& cut = spec_.cut_returns;
      if (rows >= 0 && (cut.empty() || std::find(cut.begin(), cut.end(), static_cast<int>(next)) != cut.end())) {
        sizes.at(0) = std::min(sizes.at(0), rows);
      }
      return wrap_buffer(outputs[next++], plan.dtype, sizes, plan.strides, 0, device);
    });
  }

  std::unique_ptr<Entry> build(const c10::OperatorHandle& op, c10::IValue* args, const rt::Numerics& numerics,
                               int device) {
    auto entry = std::make_unique<Entry>();
    entry->plan = plan_call(spec_, meta_, op, args);
    if (!entry->plan.resizes.empty() || !entry->plan.unsupported.empty()) return entry;
    rt::Builder b(numerics);
    EagerInputs inputs(entry->params);
    EmittedCall call = emit_call(spec_, b, entry->plan, args, inputs);
    // Each written storage's new contents (after the fresh results) may take its parameter's place.
    int result = static_cast<int>(defined_count(call.fresh));
    for (int w : spec_.written) {
      const size_t count = written_tensors(args[w]).size();
      for (size_t e = 0; e < count; ++e, ++result) {
        const int index = args[w].isTensorList() ? static_cast<int>(e) : -1;
        for (size_t p = 0; p < entry->params.size(); ++p) {
          const ParamSource& source = entry->params[p];
          if (source.kind == ParamSource::Storage && source.arg == w && source.index == index &&
              b.parameter_type(static_cast<int>(p)) == call.storages[result].type) {
            entry->aliases.emplace_back(static_cast<int>(p), result);
          }
        }
      }
    }
    std::vector<rt::TensorType> types;
    for (const auto& r : call.storages) types.push_back(r.type);
    entry->exe = runtime().compile(b.finish(call.storages, entry->aliases), types, device);
    entry->plan.fresh = std::move(call.fresh);
    entry->plan.fresh_is_list = std::move(call.fresh_is_list);
    return entry;
  }

  const OpSpec& spec_;
  const MetaCallFn meta_;
  std::atomic<int64_t> calls_{0};
  std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<Entry>> cache_;
  std::unordered_map<std::string, std::shared_ptr<const CallPlan>> plans_;  // fused eager mode's
};

}  // namespace

void check_call_values(const OpSpec& spec, at::ScalarType compute, const c10::IValue* args) {
  if (spec.divisor >= 0 && c10::isIntegralType(compute, /*includeBool=*/true)) check_divisor(args[spec.divisor]);
  if (spec.index_check.index >= 0 && g_check_indices.load(std::memory_order_relaxed)) {
    check_indices(spec.index_check, args);
  }
}

std::vector<int64_t> donatable(const std::vector<std::pair<int, int>>& aliases, const std::vector<rt::BufferPtr>& inputs) {
  std::vector<int64_t> donated;
  for (const auto& [parameter, result] : aliases) {
    if (inputs[parameter].use_count() == 2) donated.push_back(parameter);
  }
  return donated;
}

void capture_next_execution() { g_capture_next_execution = true; }

void set_check_indices(bool check) { g_check_indices = check; }

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

std::vector<std::pair<std::string, double>> dispatch_variants_ns(int iterations) {
  auto& rt = runtime();
  const int device = current_device();
  const rt::TensorType type{rt::ElementType::F32, {64, 64}};
  rt::Builder b;
  const std::string text = b.finish({b.add(b.parameter(type), b.parameter(type))});
  const std::vector<float> host(64 * 64, 1.0f);
  const std::vector<rt::BufferPtr> inputs = {rt.to_device(host.data(), type.element, type.dims, device),
                                             rt.to_device(host.data(), type.element, type.dims, device)};
  const std::vector<PJRT_Buffer*> raw = {inputs[0]->raw(), inputs[1]->raw()};
  const rt::ExecutablePtr portable = rt.compile_portable(text, {type});
  const rt::ExecutablePtr assigned = rt.compile(text, {type}, device);
  std::vector<std::pair<std::string, double>> results;
  for (const auto& [name, exe] : {std::pair{"portable", portable}, {"assigned", assigned}}) {
    for (const bool keep_outputs : {false, true}) {
      std::vector<std::vector<rt::BufferPtr>> kept;
      kept.reserve(keep_outputs ? static_cast<size_t>(iterations) : 0);
      for (int i = 0; i < 20; ++i) rt.execute(*exe, raw, device);  // warm
      rt.synchronize();
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < iterations; ++i) {
        auto outputs = rt.execute(*exe, raw, device);
        if (keep_outputs) kept.push_back(std::move(outputs));
      }
      rt.synchronize();
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
      results.emplace_back(std::string(name) + (keep_outputs ? ", outputs kept" : ", outputs dropped"),
                           static_cast<double>(ns.count()) / iterations);
    }
  }
  return results;
}

torch::CppFunction spec_kernel(const OpSpec& spec, MetaCallFn meta) {
  return torch::CppFunction::makeFromBoxedFunctor(std::make_unique<SpecKernel>(spec, meta));
}

void clear_spec_kernel_caches() {
  std::lock_guard<std::mutex> lock(all_kernels_mutex());
  for (auto* k : all_kernels()) k->clear();
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

}  // namespace torchtpu
