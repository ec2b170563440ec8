// Graph capture and compiled graphs (torch.compile, backend "tpu"). Python (torchtpu/_compile.py)
// runs an AOTAutograd graph once on the real inputs with a capture active on its thread: each node
// dispatches to the spec kernel as in eager mode, which plans and emits the call into the capture's
// builder (spec_plan.cc, spec_emit.cc) instead of running it. Storages the graph computes hold
// builder values, kept in the capture's map. The finished module is compiled through the same
// two-tier cache, and later calls with inputs of the same layout run it as one executable.
#include "aten/graph.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/strides.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "aten/op_trace.h"
#include "aten/spec_call.h"
#include "pjrt_c_api.h"

namespace torchtpu {
namespace {

// The marker Python looks for in an error to split the graph around the node being captured.
constexpr const char* kRefusal = "torchtpu-graph-split: ";

// Whether anyone besides `own` references of a capture holds a storage (a block writes back only
// such storages). A Python wrapper once made for it (`untyped_storage()`, which dynamo's tracing
// calls on a compiled function's inputs) holds a reference of its own for as long as C++ references
// keep it alive (PyTorch's PyObject preservation): it counts only where Python still holds it, or a
// gradient that died inside the block would be written back on a torch.compile graph's first call.
bool held_elsewhere(const c10::Storage& storage, size_t own) {
  // The wrapper's count is read without the GIL (PyObjectSlot::has_unique_reference takes it, and a
  // block runs under the recorder's lock, which a thread holding the GIL may be waiting for); the
  // storage we keep keeps the wrapper alive.
  PyObject* wrapper = storage.unsafeGetStorageImpl()->pyobj_slot()->load_pyobj();
  const bool unheld_wrapper = wrapper != nullptr && Py_REFCNT(wrapper) == 1;
  return storage.use_count() > own + (unheld_wrapper ? 1 : 0);
}

// Where a compiled graph's module parameters come from on each call.
struct GraphParam {
  enum Kind : uint8_t { Input, InputScalar, Constant, Random, Storage } kind;
  int input = -1;              // Input, InputScalar: the graph input; Storage: the graph's storage
  rt::ElementType element{};   // InputScalar: the value's type in the module
  rt::BufferPtr constant;      // Constant: a tpu tensor the graph reads that is not an input
  uint64_t random_words = 0;   // Random: counter values one call consumes
};

// A graph output: a view of a module result's storage, of an input's storage, or an input itself.
struct GraphOutput {
  int result = -1;  // the module result holding its storage
  int input = -1;   // an input whose storage it views (result < 0)
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  bool host = false;  // a host tensor among the inputs, returned as it is
};

struct CompiledGraph {
  int64_t id = 0;  // names the graph to Python (which keeps its non-tensor outputs)
  // Compiled when the graph first runs on its own: in fused eager mode its calls join the pending
  // block as calls of `function` (its module as a private function), and it may never run alone.
  rt::ExecutablePtr exe;
  std::string module, function;
  std::vector<rt::TensorType> param_types, result_types;
  int64_t ops = 0;  // the calls and copies captured: what a call of it adds to a fused block's size
  std::vector<GraphParam> params;
  std::vector<std::pair<int, int>> written_inputs;  // (input, module result): new contents of its storage
  std::vector<std::pair<int, int>> aliases;         // (parameter, module result) that may share a buffer
  std::vector<GraphOutput> outputs;
  int device = 0;
  // A whole-step graph (torch.tpu.graph) reads and writes storages by identity, not inputs.
  std::vector<c10::Storage> storages;
  std::vector<std::pair<int, int>> written_storages;  // (storage, module result): its new contents
};

std::mutex g_graphs_mutex;
std::unordered_map<std::string, std::shared_ptr<CompiledGraph>> g_graphs;  // (family, input layout) -> graph
std::atomic<int64_t> g_next_graph_id{1};

// A graph's executable, compiled the first time it runs on its own (its module text goes then);
// `compiled`, where given, says whether this call compiled it.
std::mutex g_compile_alone_mutex;
const rt::Executable& compile_alone(CompiledGraph& graph, bool* compiled = nullptr) {
  std::lock_guard<std::mutex> lock(g_compile_alone_mutex);
  if (compiled) *compiled = !graph.exe;
  if (!graph.exe) {
    make_room_for_an_executable();
    graph.exe = TracedCall::compile([&] { return runtime().compile(graph.module, graph.result_types, graph.device); });
    graph.module.clear();
    graph.module.shrink_to_fit();
  }
  return *graph.exe;
}

// A compiled graph's outputs for a call on `inputs`: host inputs returned as they are, views of input
// storages, and views of the storages `storage_for(result)` makes for its module results (one per
// result, shared by the outputs that view it).
template <typename StorageFor>
std::vector<at::Tensor> graph_outputs(const CompiledGraph& graph, const std::vector<at::Tensor>& inputs,
                                      StorageFor&& storage_for) {
  std::vector<at::Tensor> outputs;
  std::unordered_map<int, c10::Storage> made;  // module result -> the storage its outputs share
  for (const GraphOutput& o : graph.outputs) {
    if (o.host) {
      outputs.push_back(inputs[o.input]);
      continue;
    }
    if (o.result < 0) {
      outputs.push_back(tensor_on_storage(inputs[o.input].storage(), o.dtype, o.sizes, o.strides, o.offset));
      continue;
    }
    auto it = made.find(o.result);
    if (it == made.end()) it = made.emplace(o.result, storage_for(o.result)).first;
    outputs.push_back(tensor_on_storage(it->second, o.dtype, o.sizes, o.strides, o.offset));
  }
  return outputs;
}

// Tensor?[] arguments as tensors (None: undefined).
std::vector<at::Tensor> tensors_of(const std::vector<std::optional<at::Tensor>>& list) {
  std::vector<at::Tensor> tensors;
  tensors.reserve(list.size());
  for (const auto& t : list) tensors.push_back(t.value_or(at::Tensor()));
  return tensors;
}

rt::Value constant_scalar(rt::Builder& b, const c10::Scalar& s, rt::ElementType element) {
  if (rt::is_float(element)) return b.constant(s.toDouble(), element);
  return b.constant_int(s.isBoolean() ? static_cast<int64_t>(s.toBool()) : s.toLong(), element);
}

// Calls fn on every tensor argument of a call, lists' elements included, in order (an absent one
// as an undefined tensor).
template <typename Fn>
void for_each_tensor_arg(const OpSpec& spec, const c10::IValue* args, Fn&& fn) {
  for (size_t i = 0; i < spec.args.size(); ++i) {
    switch (spec.args[i]) {
      case ArgKind::Tensor:
        fn(args[i].isTensor() ? args[i].toTensor() : at::Tensor());
        break;
      case ArgKind::TensorList:
        for (const at::Tensor& t : args[i].toTensorList()) fn(t);
        break;
      case ArgKind::OptionalTensorList:
        for (const c10::IValue& e : args[i].toListRef()) fn(e.isTensor() ? e.toTensor() : at::Tensor());
        break;
      default:
        break;
    }
  }
}

// What a capture's module is for.
enum class CaptureKind : uint8_t {
  Compiled,  // a torch.compile graph: its inputs are given to begin(), its outputs to finish()
  Step,      // torch.tpu.graph: a whole step whose inputs and outputs are the storages it reads and
             // writes (made before it began, or alive after it ended)
  Fused,     // a fused eager block: runs once, on the buffers and values its ops were recorded with
};

// A fused block's module and what it runs on: the buffers and scalars its ops were recorded with,
// and the storages (alive when it was finished) that take its results.
struct FusedRun {
  rt::ExecutablePtr exe;
  std::vector<rt::BufferPtr> params;
  std::vector<std::pair<int, int>> aliases;                 // (parameter, result) that may share a buffer
  std::vector<std::pair<c10::Storage, int>> written;        // (storage, result): its new contents
  int device = 0;
  bool reused = false;  // the executable of the same block met before: no module printed or looked up
};

// Fused eager mode's memory of the blocks it recorded: a tree whose paths are a block's calls in
// order, each keyed by the op, its arguments' metadata and attributes, and which of the block's
// storages it reads. The same calls at the same point of a block find the builder in the same state,
// so a training loop's next iteration replays each call's emission (its inputs asked for again,
// with this call's buffers and scalars) instead of emitting it, and a block that ends where one
// ended before runs that one's executable.
struct TapeStep {
  struct Input {  // one InputSource request of the call, in order
    enum Kind : uint8_t { Storage, CpuScalar, Scalar, RandomState, RandomUsed } kind;
    int arg = -1, index = -1;
    rt::ElementType element{};
    int id = 0;          // the builder's next value id when it was asked
    uint64_t words = 0;  // RandomUsed: the counter values the draws used
  };
  std::vector<Input> inputs;
  rt::Builder::Emitted emitted;
  EmittedCall call;
};

struct TapeNode {
  std::unique_ptr<TapeStep> step;  // the call that leads here (null: a copy, emitted each time)
  std::unordered_map<std::string, std::unique_ptr<TapeNode>> next;
  std::map<std::vector<int64_t>, rt::ExecutablePtr> runs;  // a block that ended here, by the storages it returned
};

// The tape's roots (one per device) and its size; dropped whole past a bound (a program whose
// blocks never repeat).
struct Tape {
  std::unordered_map<int, TapeNode> roots;
  size_t nodes = 0;
  static constexpr size_t kMaxNodes = 200000;
};

// The type of the value the pending fused block holds for a storage with no buffer yet, if it does.
std::optional<rt::TensorType> fused_pending_type(const TpuStorage& storage);

class Capture final : public GraphCapture {
 public:
  Capture(std::string key, int device, CaptureKind kind = CaptureKind::Compiled)
      : key_(std::move(key)),
        device_(device),
        by_storage_(kind == CaptureKind::Step),
        fused_(kind == CaptureKind::Fused),
        first_serial_(next_storage_serial()),
        builder_(current_numerics()) {}

  // Registers the real inputs; returns tensors over the same storages (with their own version
  // counters and no autograd history) for the graph to run on.
  std::vector<at::Tensor> begin(const std::vector<at::Tensor>& inputs) {
    std::vector<at::Tensor> aliases;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const at::Tensor& t = inputs[i];
      if (!is_tpu(t)) {
        aliases.push_back(t.defined() ? t.detach() : t);
        input_of_.emplace(aliases.back().unsafeGetTensorImpl(), static_cast<int>(i));
        continue;
      }
      at::Tensor alias = tensor_on_storage(t.storage(), t.scalar_type(), t.sizes(), t.strides(), t.storage_offset());
      input_of_.emplace(alias.unsafeGetTensorImpl(), static_cast<int>(i));
      const TpuStorage& s = storage_of(t);
      if (!storages_.count(&s)) {
        // A lazy (never written) storage reads as zeros; the graph's writes still go back to it. One
        // the fused block computes is an input of the type the block gives it (the block goes on).
        bool lazy = false;
        rt::TensorType type = storage_type(t, &lazy);
        if (lazy) {
          if (const std::optional<rt::TensorType> pending = fused_pending_type(s)) type = *pending, lazy = false;
        }
        if (!lazy) graph_.params.push_back(GraphParam{GraphParam::Input, static_cast<int>(i)});
        add_slot(t.storage(), lazy ? builder_.full(0, type) : builder_.parameter(type), static_cast<int>(i));
      }
      aliases.push_back(std::move(alias));
    }
    return aliases;
  }

  // Module results: the new contents of every written input storage, then every output storage.
  std::shared_ptr<CompiledGraph> finish(const std::vector<at::Tensor>& outputs) {
    if (by_storage_) return finish_by_storage();
    std::vector<rt::Value> results;
    std::vector<const Slot*> written;
    for (const auto& entry : storages_) {
      if (entry.second.input >= 0 && entry.second.written) written.push_back(&entry.second);
    }
    // In input order, so that the same graph always prints the same module text.
    std::sort(written.begin(), written.end(), [](const Slot* a, const Slot* b) { return a->input < b->input; });
    for (const Slot* slot : written) {
      graph_.written_inputs.emplace_back(slot->input, static_cast<int>(results.size()));
      results.push_back(slot->value);
    }
    std::unordered_map<const TpuStorage*, int> result_of;
    for (const at::Tensor& t : outputs) {
      GraphOutput out;
      const auto input = input_of_.find(t.unsafeGetTensorImpl());
      if (!is_tpu(t)) {
        if (input == input_of_.end()) fail("returns a tensor on the host");
        out.input = input->second;
        out.host = true;
        graph_.outputs.push_back(out);
        continue;
      }
      out.dtype = t.scalar_type();
      out.sizes = t.sizes().vec();
      out.strides = t.strides().vec();
      out.offset = t.storage_offset();
      const TpuStorage* storage = &storage_of(t);
      const auto slot = storages_.find(storage);
      if (slot != storages_.end() && slot->second.input >= 0) {
        out.input = slot->second.input;  // a view of an input's storage (written back, if written)
      } else {
        auto [it, added] = result_of.emplace(storage, static_cast<int>(results.size()));
        if (added) {
          results.push_back(slot != storages_.end() ? slot->second.value
                                                    : builder_.full(0, storage_type_of(t)));  // never written
        }
        out.result = it->second;
      }
      graph_.outputs.push_back(std::move(out));
    }
    add_aliases(graph_.written_inputs, GraphParam::Input, results);
    return compiled(results);
  }

  // A whole-step graph's results: the new contents of every storage it wrote that is still alive
  // (parameters, gradients, optimizer state, the tensors the block kept), in the order they were
  // first met, so the same block always prints the same module text.
  std::shared_ptr<CompiledGraph> finish_by_storage() {
    std::vector<const Slot*> written;
    for (const auto& entry : storages_) {
      const Slot& slot = entry.second;
      // Alive: someone besides this capture (and the graph's own list of read storages) holds it.
      if (slot.written && held_elsewhere(slot.keep, 1 + (slot.input >= 0 ? 1 : 0))) written.push_back(&slot);
    }
    std::sort(written.begin(), written.end(), [](const Slot* a, const Slot* b) { return a->order < b->order; });
    std::vector<rt::Value> results;
    for (const Slot* slot : written) {
      int storage = slot->input;
      if (storage < 0) {
        storage = static_cast<int>(graph_.storages.size());
        graph_.storages.push_back(slot->keep);
      }
      graph_.written_storages.emplace_back(storage, static_cast<int>(results.size()));
      results.push_back(slot->value);
    }
    add_aliases(graph_.written_storages, GraphParam::Storage, results);
    return compiled(results);
  }

  // A fused block's results: the new contents of every storage it wrote that is still alive (held
  // by someone besides this capture), in the order the block met them.
  FusedRun finish_fused() {
    std::vector<const Slot*> written;
    for (const auto& entry : storages_) {
      if (entry.second.written && held_elsewhere(entry.second.keep, 1)) written.push_back(&entry.second);
    }
    std::sort(written.begin(), written.end(), [](const Slot* a, const Slot* b) { return a->order < b->order; });
    FusedRun run;
    std::vector<rt::Value> results;
    std::vector<int64_t> orders;
    for (const Slot* slot : written) {
      const int result = static_cast<int>(results.size());
      run.written.emplace_back(slot->keep, result);
      results.push_back(slot->value);
      orders.push_back(slot->order);
      if (slot->param >= 0 && builder_.parameter_type(slot->param) == slot->value.type) {
        run.aliases.emplace_back(slot->param, result);
      }
    }
    rt::ExecutablePtr* known = tape_ ? &tape_->runs[orders] : nullptr;
    run.reused = known && *known;
    if (run.reused) {
      run.exe = *known;
    } else {
      if (make_room_for_an_executable()) {  // the tape went with the caches: this block is off it
        known = nullptr;
        tape_ = nullptr;
      }
      std::vector<rt::TensorType> types;
      for (const rt::Value& r : results) types.push_back(r.type);
      run.exe = runtime().compile(builder_.finish(results, run.aliases), types, device_);
      if (known) *known = run.exe;
    }
    for (GraphParam& p : graph_.params) {
      if (!p.constant) {  // the random state of an op whose emission failed after asking for it: unused
        const uint64_t unused[2] = {0, 0};
        p.constant = runtime().to_device(unused, rt::ElementType::U64, {2}, device_);
      }
      run.params.push_back(std::move(p.constant));
    }
    run.device = device_;
    return run;
  }
  bool empty() const { return graph_.params.empty() && storages_.empty(); }

  // A written input's new contents may take its buffer's place (donation).
  void add_aliases(const std::vector<std::pair<int, int>>& written, GraphParam::Kind kind,
                   const std::vector<rt::Value>& results) {
    for (const auto& [input, result] : written) {
      for (size_t p = 0; p < graph_.params.size(); ++p) {
        if (graph_.params[p].kind == kind && graph_.params[p].input == input &&
            builder_.parameter_type(static_cast<int>(p)) == results[result].type) {
          graph_.aliases.emplace_back(static_cast<int>(p), result);
        }
      }
    }
  }

  std::shared_ptr<CompiledGraph> compiled(const std::vector<rt::Value>& results) {
    graph_.id = g_next_graph_id++;
    graph_.device = device_;
    graph_.ops = ops_;
    for (const rt::Value& r : results) graph_.result_types.push_back(r.type);
    graph_.module = builder_.finish(results, graph_.aliases);
    if (by_storage_) {  // a whole-step graph always runs alone
      compile_alone(graph_);
    } else if (fused_eager()) {  // its calls will join fused blocks
      for (int p = 0; p < builder_.num_parameters(); ++p) graph_.param_types.push_back(builder_.parameter_type(p));
      graph_.function = builder_.function_text("graph_" + std::to_string(graph_.id), results);
    }
    return std::make_shared<CompiledGraph>(std::move(graph_));
  }

  const std::string& key() const { return key_; }
  int device() const { return device_; }

  // A fused block follows the tape from its device's root (calls met before replay their emission).
  void follow_tape(Tape& tape) {
    tape_ = &tape.roots[device_];
    tape_nodes_ = &tape.nodes;
  }
  void leave_tape() { tape_ = nullptr; }

  bool call(const OpSpec& spec, MetaCallFn meta, const c10::OperatorHandle& op, c10::IValue* args,
            torch::jit::Stack* stack, const CallPlan*, const std::string*) override {
    if (spec.data_dependent) fail("has an output shape that depends on the data (" + std::string(spec.overload) + ")");
    const CallPlan plan = plan_call(spec, meta, op, args);
    if (!plan.unsupported.empty()) {
      run_on_cpu(op, stack, plan.unsupported);  // refuses: the graph splits
      return true;
    }
    if (!plan.resizes.empty()) {  // as eager: resize the outs (a storage the graph computes refuses), plan again
      resize_outs(plan.resizes, args);
      return call(spec, meta, op, args, stack, nullptr, nullptr);
    }
    record(spec, plan, args, stack);
    return true;
  }

  // Emits a planned call (or, on the tape, replays its emission: `call_key` is its plan's key):
  // written storages get their new values, fresh results are new tensors whose storages hold
  // theirs. True where the call was replayed.
  bool record(const OpSpec& spec, const CallPlan& plan, c10::IValue* args, torch::jit::Stack* stack,
              const std::string* call_key = nullptr) {
    TapeNode* node = tape_ && call_key ? &tape_child(tape_call_key(spec, *call_key, args)) : nullptr;
    tape_ = nullptr;  // off the tape until this call is recorded (an error leaves the block off it)
    Inputs inputs(*this);
    EmittedCall emitted;
    const bool replayed = node && node->step;
    if (replayed) {
      replay(spec, *node->step, args, inputs);
    } else {
      std::unique_ptr<TapeStep> step = node ? std::make_unique<TapeStep>() : nullptr;
      inputs.log = step ? &step->inputs : nullptr;
      const rt::Builder::Mark mark = builder_.mark();
      emitted = emit_call(spec, builder_, plan, args, inputs);
      if (step) {
        step->emitted = builder_.emitted_since(mark);
        step->call = emitted;
        node->step = std::move(step);
      }
    }
    tape_ = node;
    ++ops_;
    const EmittedCall& call = replayed ? node->step->call : emitted;
    size_t next_written = defined_count(call.fresh);
    for (int w : spec.written) {
      for (const at::Tensor& t : written_tensors(args[w])) set_value(t, call.storages.at(next_written++));
    }
    size_t next = 0;
    push_returns(spec, call.fresh, call.fresh_is_list, args, stack, [&](const OutputPlan& p) {
      at::Tensor t = at::empty_strided(p.sizes, p.strides,
                                       at::TensorOptions().dtype(p.dtype).device(c10::DeviceType::PrivateUse1, device_));
      set_value(t, call.storages.at(next++));
      return t;
    });
    return replayed;
  }

  bool copy(const at::Tensor& src, const at::Tensor& dst) override {
    if (!is_tpu(dst)) fail("copies a value to the host");
    if (tape_) {  // a copy is emitted each time; the tape goes on past it
      KeyWriter k;
      k.tag('c');
      tape_key_tensor(k, src);
      tape_key_tensor(k, dst);
      tape_ = &tape_child(std::move(k.s));
    }
    TORCH_CHECK(!is_tpu(src) || src.device() == dst.device(), kRefusal, "copies between two tpu devices");
    rt::Value value;
    if (is_tpu(src)) {
      value = read_for_copy(builder_, contents(src), storage_type_of(src), src, dst);
    } else if (const auto input = input_of_.find(src.unsafeGetTensorImpl());
               input != input_of_.end() && src.dim() == 0) {
      // A host scalar the graph takes as an input (an optimizer's step count).
      value = builder_.broadcast_to(input_scalar(input->second, element_type(dst.scalar_type())), dst.sizes().vec());
    } else {  // a host tensor the graph uploads: a constant of this capture
      value = constant_param(upload_for_copy(src, dst));
    }
    set_value(dst, write_tensor(builder_, contents(dst), storage_type_of(dst), value, dst));
    ++ops_;
    return true;
  }

  // A compiled graph called in fused eager mode: a call of its function on the block's values of its
  // inputs, whose results become its written inputs' new values and its outputs' storages. Null
  // where an input's value here is not of the type the graph was compiled for: nothing is recorded.
  std::optional<std::vector<at::Tensor>> record_graph(const CompiledGraph& graph, const std::vector<at::Tensor>& inputs) {
    if (graph.function.empty()) return std::nullopt;  // captured in strict mode: it runs alone
    for (size_t p = 0; p < graph.params.size(); ++p) {
      if (graph.params[p].kind == GraphParam::Input && storage_type_of(inputs[graph.params[p].input]) != graph.param_types[p]) {
        return std::nullopt;
      }
    }
    TapeNode* node = nullptr;  // emitted each time, as a copy; the tape goes on past it
    if (tape_) {
      KeyWriter k;
      k.tag('G');
      k.i(graph.id);
      for (const at::Tensor& t : inputs) t.defined() ? tape_key_tensor(k, t) : k.tag('N');
      node = &tape_child(std::move(k.s));
    }
    tape_ = nullptr;  // off the tape until the call is recorded (an error leaves the block off it)
    std::vector<rt::Value> args;
    for (const GraphParam& p : graph.params) {
      switch (p.kind) {
        case GraphParam::Input:
          args.push_back(*contents(inputs[p.input]));
          break;
        case GraphParam::InputScalar:
          args.push_back(constant_param(scalar_buffer(inputs[p.input].item(), p.element, device_)));
          break;
        case GraphParam::Constant:
          args.push_back(constant_param(p.constant));
          break;
        case GraphParam::Random: {  // drawn when recorded, in the order strict mode runs the graphs
          const auto [seed, offset] = reserve_random(std::nullopt, device_, p.random_words);
          const uint64_t state[2] = {seed, offset};
          args.push_back(constant_param(runtime().to_device(state, rt::ElementType::U64, {2}, device_)));
          break;
        }
        case GraphParam::Storage:
          TORCH_CHECK(false, "torchtpu: a whole-step graph cannot join a fused block");
      }
    }
    const std::vector<rt::Value> results =
        builder_.call_function("graph_" + std::to_string(graph.id), graph.function, args, graph.result_types);
    tape_ = node;
    ops_ += graph.ops;
    for (const auto& [input, result] : graph.written_inputs) set_value(inputs[input], results[result]);
    return graph_outputs(graph, inputs, [&](int result) {  // a new storage holding the block's value
      const rt::TensorType& type = results[result].type;
      at::Tensor holder = at::empty({type.numel() * rt::element_size(type.element)},
                                    at::TensorOptions().dtype(at::kByte).device(c10::DeviceType::PrivateUse1, device_));
      set_value(holder, results[result]);
      return holder.storage();
    });
  }

  // The type of the value this capture holds for a storage that has no buffer yet, or null.
  const rt::TensorType* pending_contents(const TpuStorage& s) const {
    if (s.buffer) return nullptr;
    const auto it = storages_.find(&s);
    return it == storages_.end() ? nullptr : &it->second.value.type;
  }
  int64_t ops() const { return ops_; }

  void refuse(const std::string& what) override { fail(what); }
  [[noreturn]] void fail(const std::string& what) {
    if (by_storage_) TORCH_CHECK(false, "torch.tpu.graph cannot capture a block that ", what);
    TORCH_CHECK(false, kRefusal, what);
  }

  bool holds(const TpuStorage& storage) const override { return storages_.count(&storage) > 0; }

 private:
  struct Slot {
    c10::Storage keep;  // keeps the storage (and so its address, the map's key) alive while capturing
    rt::Value value;
    int input = -1;     // the graph input whose storage this is (by_storage: the graph's storage), or -1
    int param = -1;     // the module parameter its buffer was read as (a constant), or -1
    bool written = false;
    int64_t order = 0;  // when the capture met it
  };

  Slot& add_slot(const c10::Storage& storage, const rt::Value& value, int input = -1) {
    const TpuStorage* s = &storage_of(storage);
    return storages_.emplace(s, Slot{storage, value, input, /*param=*/-1, /*written=*/false, next_order_++}).first->second;
  }

  // A graph's inputs: storages hold their values so far; a tpu tensor that is no input (a constant
  // the graph reads) becomes a parameter fed its buffer; scalars are constants of the module,
  // except a CPU 0-d tensor that is a graph input (fed its value on every call).
  class Inputs final : public InputSource {
   public:
    explicit Inputs(Capture& capture) : c_(capture) {}
    std::vector<TapeStep::Input>* log = nullptr;  // where a call recorded for the tape notes its requests

    rt::TensorType storage_type(const at::Tensor& t) override { return c_.storage_type_of(t); }
    std::optional<rt::Value> storage(rt::Builder&, const at::Tensor& t, int arg, int index) override {
      note(TapeStep::Input::Storage, arg, index);
      return c_.contents(t);
    }
    // A fused block is a module many iterations share: its scalars are parameters, as in eager.
    rt::Value cpu_scalar(rt::Builder& b, const at::Tensor& t, int arg, int index, rt::ElementType element) override {
      note(TapeStep::Input::CpuScalar, arg, index, element);
      if (c_.fused_) return c_.constant_param(scalar_buffer(t.item(), element, c_.device_));
      const auto input = c_.input_of_.find(t.unsafeGetTensorImpl());
      if (input == c_.input_of_.end()) return constant_scalar(b, t.item(), element);
      return c_.input_scalar(input->second, element);
    }
    rt::Value scalar(rt::Builder& b, const c10::IValue& v, int arg, int index, rt::ElementType element) override {
      note(TapeStep::Input::Scalar, arg, index, element);
      if (c_.fused_) return c_.constant_param(scalar_buffer(v.toScalar(), element, c_.device_));
      return constant_scalar(b, v.toScalar(), element);
    }
    rt::Value random_state(rt::Builder& b, const c10::IValue* args, int arg) override {
      note(TapeStep::Input::RandomState, arg, -1);
      if (arg >= 0) generator_ = args[arg].toOptional<at::Generator>();
      if (generator_ && !c_.fused_) c_.fail("draws from an explicit torch.Generator");
      random_param_ = c_.graph_.params.size();
      c_.graph_.params.push_back(GraphParam{GraphParam::Random});
      return b.parameter(rt::TensorType{rt::ElementType::U64, {2}});
    }
    void random_used(uint64_t words) override {
      note(TapeStep::Input::RandomUsed, -1, -1);
      if (log) log->back().words = words;
      GraphParam& p = c_.graph_.params.at(random_param_);
      p.random_words = words;
      if (!c_.fused_) return;
      // Drawn when recorded, so the generator advances in the order strict mode draws.
      const auto [seed, offset] = reserve_random(generator_, c_.device_, words);
      const uint64_t state[2] = {seed, offset};
      p.kind = GraphParam::Constant;
      p.constant = runtime().to_device(state, rt::ElementType::U64, {2}, c_.device_);
    }

   private:
    void note(TapeStep::Input::Kind kind, int arg, int index, rt::ElementType element = {}) {
      if (log) log->push_back(TapeStep::Input{kind, arg, index, element, c_.builder_.next_id()});
    }

    Capture& c_;
    size_t random_param_ = 0;
    std::optional<at::Generator> generator_;
  };

  // A recorded call's emission again, for this call's arguments: its requests for inputs (new
  // parameters take this call's buffers, scalars and random states), then what it added.
  void replay(const OpSpec& spec, const TapeStep& step, const c10::IValue* args, Inputs& inputs) {
    at::Tensor holder;
    for (const TapeStep::Input& in : step.inputs) {
      builder_.advance_ids(in.id);
      switch (in.kind) {
        case TapeStep::Input::Storage:
          inputs.storage(builder_, tensor_arg(spec, args, in.arg, in.index, holder), in.arg, in.index);
          break;
        case TapeStep::Input::CpuScalar:
          inputs.cpu_scalar(builder_, tensor_arg(spec, args, in.arg, in.index, holder), in.arg, in.index, in.element);
          break;
        case TapeStep::Input::Scalar:
          inputs.scalar(builder_, in.index < 0 ? args[in.arg] : args[in.arg].toListRef()[in.index], in.arg, in.index,
                        in.element);
          break;
        case TapeStep::Input::RandomState:
          inputs.random_state(builder_, args, in.arg);
          break;
        case TapeStep::Input::RandomUsed:
          inputs.random_used(in.words);
          break;
      }
    }
    builder_.replay(step.emitted);
  }

  // The tape's next node for a call: the op, its plan's key, and which storages of the block (by
  // the order the block met them) or which new ones (by first position in the call) it reads.
  std::string tape_call_key(const OpSpec& spec, const std::string& call_key, const c10::IValue* args) {
    KeyWriter k;
    k.s.reserve(call_key.size() + 64);
    k.i(static_cast<int64_t>(reinterpret_cast<intptr_t>(&spec)));
    k.s += call_key;
    std::vector<const TpuStorage*> new_storages;
    for_each_tensor_arg(spec, args, [&](const at::Tensor& t) {
      if (!is_tpu(t)) {
        k.tag('n');
        return;
      }
      const TpuStorage* s = &storage_of(t);
      if (const auto it = storages_.find(s); it != storages_.end()) {
        k.tag('B');
        k.i(it->second.order);
        return;
      }
      const auto first = std::find(new_storages.begin(), new_storages.end(), s);
      // A never-written storage reads as zeros the emission makes, a written one as a parameter. The
      // plan's key cannot tell: it was taken before a deferred flush gave the storage its buffer.
      k.tag(s->buffer ? 'X' : 'Z');
      k.i(first - new_storages.begin());
      if (first == new_storages.end()) new_storages.push_back(s);
    });
    return std::move(k.s);
  }

  // A copy's tensor on the tape: its view, and the block's storage it is (or its storage's metadata).
  void tape_key_tensor(KeyWriter& k, const at::Tensor& t) {
    if (!is_tpu(t)) {
      k.tag('H');
      k.i(static_cast<int64_t>(t.scalar_type()));
      k.ints(t.sizes());
      k.ints(t.strides());
      return;
    }
    int device = -1;
    key_tensor(k, t, device);
    const TpuStorage& s = storage_of(t);
    if (const auto it = storages_.find(&s); it != storages_.end()) {
      k.tag('B');
      k.i(it->second.order);
    } else if (!s.buffer) {
      k.tag('Z');  // never written: reads as zeros (tape_call_key)
    }
  }

  TapeNode& tape_child(std::string key) {
    std::unique_ptr<TapeNode>& child = tape_->next[std::move(key)];
    if (!child) {
      child = std::make_unique<TapeNode>();
      ++*tape_nodes_;
    }
    return *child;
  }

  // A buffer a fused block's module reads.
  rt::Value constant_param(rt::BufferPtr buffer) {
    const rt::TensorType type{buffer->type(), buffer->dims()};
    graph_.params.push_back(GraphParam{GraphParam::Constant});
    graph_.params.back().constant = std::move(buffer);
    return builder_.parameter(type);
  }

  // A host scalar that is a graph input: a module parameter fed its value on every call.
  rt::Value input_scalar(int input, rt::ElementType element) {
    graph_.params.push_back(GraphParam{GraphParam::InputScalar, input, element});
    return builder_.parameter(rt::TensorType{element, {}});
  }

  rt::TensorType storage_type_of(const at::Tensor& t) {
    const auto it = storages_.find(&storage_of(t));
    if (it != storages_.end()) return it->second.value.type;
    settle(storage_of(t));
    bool lazy = false;
    return storage_type(t, &lazy);
  }

  std::optional<rt::Value> contents(const at::Tensor& t) {
    TpuStorage& s = storage_of(t);
    const auto it = storages_.find(&s);
    if (it != storages_.end()) return it->second.value;
    if (by_storage_ && s.serial < first_serial_) return storage_parameter(t, s);
    settle(s);
    if (!s.buffer) return std::nullopt;  // lazy: never written
    TORCH_CHECK(s.device == device_, kRefusal, "reads a tensor on another tpu device");
    const int param = static_cast<int>(graph_.params.size());
    rt::Value v = constant_param(s.buffer);
    add_slot(t.storage(), v).param = param;
    return v;
  }

  // A storage made before a whole-step capture began: a parameter fed its contents on each replay.
  rt::Value storage_parameter(const at::Tensor& t, TpuStorage& s) {
    TORCH_CHECK(s.device == device_, "torch.tpu.graph: the captured block reads a tensor on tpu:", s.device,
                " while capturing on tpu:", device_);
    bool lazy = false;
    const rt::TensorType type = storage_type(t, &lazy);
    if (lazy) {  // never written: reads as zeros, and a replay reads what the last one wrote
      const std::vector<uint8_t> zeros(s.nbytes, 0);
      s.buffer = runtime().to_device(zeros.data(), type.element, type.dims, device_);
    }
    const int storage = static_cast<int>(graph_.storages.size());
    graph_.storages.push_back(t.storage());
    graph_.params.push_back(GraphParam{GraphParam::Storage, storage});
    rt::Value v = builder_.parameter(type);
    add_slot(t.storage(), v, storage);
    return v;
  }

  // A compiled graph's capture reading a tensor that is no input, whose value the fused block computes:
  // the block runs first, so that the graph reads its buffer as a constant.
  void settle(const TpuStorage& s) {
    if (!s.buffer && !fused_ && !by_storage_ && fused_pending_type(s)) {
      flush_fused("a graph capture reads a value the block computes");
    }
  }

  void set_value(const at::Tensor& t, const rt::Value& v) {
    const TpuStorage* s = &storage_of(t);
    auto it = storages_.find(s);
    Slot& slot = it == storages_.end() ? add_slot(t.storage(), v) : it->second;
    slot.value = v;
    slot.written = true;
  }

  std::string key_;
  int device_;
  bool by_storage_;
  bool fused_;
  uint64_t first_serial_;  // storages with a smaller serial were made before the capture began
  int64_t next_order_ = 0;
  rt::Builder builder_;
  CompiledGraph graph_;
  std::unordered_map<const TpuStorage*, Slot> storages_;
  std::unordered_map<const c10::TensorImpl*, int> input_of_;
  TapeNode* tape_ = nullptr;  // fused: where the block's calls so far lead on the tape (null: off it)
  size_t* tape_nodes_ = nullptr;
  int64_t ops_ = 0;  // calls and copies recorded (a compiled graph's call counts its own)
};

// The layout a compiled graph was captured for: each input's view and storage (a CPU 0-d tensor
// by dtype), and which inputs share a storage. `block`: the pending fused block, whose values of
// storages with no buffer yet key as the buffers it will give them.
std::string input_key(int64_t family, const std::vector<at::Tensor>& inputs, int& device, const Capture* block) {
  KeyWriter k;
  k.i(family);
  key_numerics(k, current_numerics());  // a graph called under another matmul precision or math mode is captured anew
  std::unordered_map<const void*, int64_t> first_with_storage;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    if (!is_tpu(t)) {
      k.tag(t.defined() ? 'C' : 'N');
      if (t.defined()) k.i(static_cast<int64_t>(t.scalar_type())), k.ints(t.sizes());
      continue;
    }
    key_tensor(k, t, device, block ? block->pending_contents(storage_of(t)) : nullptr);
    const void* storage = &storage_of(t);
    k.i(first_with_storage.emplace(storage, static_cast<int64_t>(i)).first->second);
  }
  if (device < 0) device = current_device();
  return std::move(k.s);
}

std::shared_ptr<CompiledGraph> find_graph(const std::string& key) {
  std::lock_guard<std::mutex> lock(g_graphs_mutex);
  const auto it = g_graphs.find(key);
  return it == g_graphs.end() ? nullptr : it->second;
}

// The device a call's tpu tensors are on (the current device where there are none); -1 where they
// are on several (the eager kernel raises PyTorch's error).
int device_of_call(const OpSpec& spec, const c10::IValue* args) {
  int device = -1;
  bool mixed = false;
  for_each_tensor_arg(spec, args, [&](const at::Tensor& t) {
    if (!t.defined() || is_cpu_scalar(t)) return;
    mixed |= !is_tpu(t);
    if (!is_tpu(t)) return;
    const int d = t.device().index();
    mixed |= device >= 0 && d != device;
    device = d;
  });
  if (mixed) return -1;
  return device >= 0 ? device : current_device();
}

// Fused eager mode: spec'd calls and device copies are planned (Meta: errors raise at the call) and
// emitted into one pending block, whose results are storages holding module values; the block runs
// as one module when something needs a value (a host read, a CPU fallback, a data-dependent shape,
// synchronize, a copy to another device, a graph, a size bound, an optimizer step, exit). One block
// for the process: the autograd engine's device thread records into the block the caller began.
constexpr const char* kCompiledGraphName = "a torch.compile graph";  // among a block's ops, for errors

class FusedRecorder final : public GraphCapture {
  using FirstOp = std::pair<const OpSpec*, std::string>;  // a call's spec and loop_signature

 public:
  bool records_repeatedly() const override { return true; }

  bool call(const OpSpec& spec, MetaCallFn meta, const c10::OperatorHandle& op, c10::IValue* args,
            torch::jit::Stack* stack, const CallPlan* planned, const std::string* planned_key) override {
    run_deferred_flush();
    if (spec.data_dependent) {
      flush("an output shape that depends on the data");
      return false;
    }
    const int device = device_of_call(spec, args);
    if (device < 0) {
      flush("tensors on two devices");
      return false;
    }
    CallPlan own;
    const CallPlan& plan = planned ? *planned : (own = plan_call(spec, meta, op, args));
    if (!plan.unsupported.empty()) {
      run_on_cpu(op, stack, plan.unsupported);  // refuses: runs the block first
      return true;
    }
    if (!plan.resizes.empty()) {
      resize_outs(plan.resizes, args);  // a storage of the block is resized after the block ran
      return call(spec, meta, op, args, stack, nullptr, nullptr);
    }
    check_call_values(spec, plan.compute, args);  // may read values: runs the block first
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    cut_where_a_loop_repeats(spec, args);
    Capture& block = block_on(device);
    note_block_op(block, &spec, args);
    const int64_t start = tracing() ? trace_now_ns() : -1;
    std::string shapes = start >= 0 ? describe_args(args, spec.args.size()) : std::string();  // before record() pops them
    const bool replayed = block.record(spec, plan, args, stack, planned ? planned_key : nullptr);
    if (start >= 0) {
      TracedCall::record_recorded_op(std::string("aten::") + spec.overload, std::move(shapes), replayed ? "tape" : "",
                                     start, device);
    }
    names_.push_back(spec.overload);
    ops_recorded_.fetch_add(1, std::memory_order_relaxed);
    ops_replayed_ += replayed;
    if (block.ops() >= hard_max_ops()) flush("size bound");
    return true;
  }

  std::optional<rt::TensorType> pending_type(const TpuStorage& storage) const {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    const rt::TensorType* type = block_ ? block_->pending_contents(storage) : nullptr;
    return type ? std::optional<rt::TensorType>(*type) : std::nullopt;
  }
  std::string key_for(int64_t family, const std::vector<at::Tensor>& inputs, int& device) const {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    return input_key(family, inputs, device, block_.get());
  }

  // A torch.compile graph called in fused mode joins the pending block as one call (XLA inlines it:
  // a training step's forward, backward and optimizer graphs run as one module, with no buffers for
  // what passes between them and dies in the block). Null where no graph was captured for this
  // layout of the inputs (`captured` false: the caller captures it, and the block goes on), or where
  // it cannot join (the caller runs the block, then the graph).
  std::optional<std::tuple<int64_t, std::vector<at::Tensor>>> record_graph(int64_t family,
                                                                           const std::vector<at::Tensor>& inputs,
                                                                           bool& captured) {
    run_deferred_flush();
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    int device = -1;
    const std::shared_ptr<CompiledGraph> graph = find_graph(input_key(family, inputs, device, block_.get()));
    captured = graph != nullptr;
    if (!graph || graph->function.empty()) return std::nullopt;
    const int64_t start = tracing() ? trace_now_ns() : -1;
    Capture& block = block_on(device);
    note_block_op(block, nullptr, nullptr);
    std::optional<std::vector<at::Tensor>> outputs = block.record_graph(*graph, inputs);
    if (!outputs) return std::nullopt;
    if (start >= 0) {
      TracedCall::record_recorded_op("graph " + std::to_string(graph->id), std::to_string(inputs.size()) + " inputs", "",
                                     start, device);
    }
    names_.push_back(kCompiledGraphName);
    ops_recorded_.fetch_add(1, std::memory_order_relaxed);
    graphs_recorded_++;
    if (block.ops() >= hard_max_ops()) flush("size bound");
    return std::make_tuple(graph->id, std::move(*outputs));
  }

  bool copy(const at::Tensor& src, const at::Tensor& dst) override {
    run_deferred_flush();
    if (!is_tpu(dst) || (is_tpu(src) && src.device() != dst.device())) {
      flush(is_tpu(dst) ? "a copy between tpu devices" : "a host read");
      return false;
    }
    if (complex128_on_host(src) || complex128_on_host(dst)) {
      flush("a complex128 copy (through the host on this platform)");
      return false;
    }
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    // An upload into a storage the block has not met is written at once (as strict mode does).
    if (!is_tpu(src) && !(block_ && block_->holds(storage_of(dst)))) return false;
    Capture& block = block_on(dst.device().index());
    note_block_op(block, nullptr, nullptr);
    block.copy(src, dst);
    names_.push_back("_copy_from");
    ops_recorded_.fetch_add(1, std::memory_order_relaxed);
    if (block.ops() >= hard_max_ops()) flush("size bound");
    return true;
  }

  void refuse(const std::string& what) override { flush(what.c_str()); }

  bool holds(const TpuStorage& storage) const override {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    return block_ && block_->holds(storage);
  }

  // Ends the block before the next op or copy, not at once (an optimizer step): what the caller drops
  // in between, zero_grad's gradients, then dies inside the block and is never written to the device.
  // Anything else that flushes (a host read, synchronize) runs it as well.
  void flush_before_next_op(const char* reason) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    if (block_) deferred_reason_ = reason;
  }

  void flush(const char* reason) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    deferred_reason_.clear();
    if (!block_) return;
    std::unique_ptr<Capture> block = std::move(block_);  // a failure drops the block
    std::vector<const char*> names = std::move(names_);
    names_.clear();
    if (block->empty()) return;
    reasons_[reason]++;
    blocks_run_++;
    TracedCall traced("fused", block->device());
    try {
      FusedRun run = TracedCall::compile([&] { return block->finish_fused(); });
      const bool compiled = !run.reused && rt::last_compile_outcome().tier != rt::CompileOutcome::Memory;
      blocks_compiled_ += compiled;
      blocks_reused_ += run.reused;
      traced.set_cache(run.reused ? "tape" : compiled ? "compile" : "memory");
      std::vector<PJRT_Buffer*> raw;
      for (const rt::BufferPtr& b : run.params) raw.push_back(b->raw());
      const std::vector<int64_t> donated = donatable(run.aliases, run.params);
      std::vector<rt::BufferPtr> results;
      traced.execute("tpu::fused", [&] { results = runtime().execute(*run.exe, raw, run.device, donated, &run.params); });
      for (const auto& [storage, result] : run.written) storage_of(storage).buffer = results[result];
    } catch (const c10::OutOfMemoryError&) {
      throw;  // torch.OutOfMemoryError, as the op would raise in strict mode
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "torchtpu: a fused block of ", names.size(), " ops (", describe_ops(names),
                  ") failed when it ran (at: ", reason, "): ", e.what(),
                  "\nThe tensors the block was to compute hold no values (they read as zeros). Run with "
                  "torch.tpu.set_eager_mode(\"blocking\") to raise at the op that fails.");
    }
    if (traced.recording()) traced.record("fused block (" + std::string(reason) + ")", std::to_string(names.size()) + " ops");
  }

  struct Metrics {
    int64_t ops_recorded, ops_replayed, graphs_recorded, blocks_run, blocks_compiled, blocks_reused;
    size_t tape_nodes;
    std::map<std::string, int64_t> reasons;
  };
  Metrics metrics() const {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    return {ops_recorded_.load(), ops_replayed_, graphs_recorded_, blocks_run_, blocks_compiled_, blocks_reused_, tape_.nodes, reasons_};
  }
  void set_max_ops(size_t ops) { max_ops_ = std::max<size_t>(ops, 1); }
  // The tape holds executables: dropped with the kernel caches (the pending block leaves it first).
  void forget_tape() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    if (block_) block_->leave_tape();
    tape_.roots.clear();
    tape_.nodes = 0;
  }

 private:
  // The pending block, begun on `device` under the current numerics (a block on another device or
  // under another matmul precision or math mode runs first).
  Capture& block_on(int device) {
    const rt::Numerics numerics = current_numerics();
    if (block_ && (block_->device() != device || numerics.matmul != numerics_.matmul ||
                   numerics.accurate_math != numerics_.accurate_math)) {
      flush(block_->device() != device ? "an op on another device" : "a change of numerics");
    }
    if (!block_) {
      if (tape_.nodes > Tape::kMaxNodes) {
        tape_.roots.clear();
        tape_.nodes = 0;
      }
      block_ = std::make_unique<Capture>(std::string(), device, CaptureKind::Fused);
      block_->follow_tape(tape_);
      numerics_ = numerics;
    }
    return *block_;
  }

  // A block of inference (every op recorded without grad mode, outside a backward pass, on the thread
  // that began it) that grew past a quarter of the size bound ends before its first op comes again. An
  // inference loop that reads nothing then runs as blocks that start at the same step and replay one
  // executable, where cuts at the size bound fell on every offset of the loop's period and compiled a
  // block for each (tiny Llama, 300 steps, CPU plugin: 3 blocks of 10,000 ops compiled, 24.6 s; now 2
  // compiled and 9 replayed, 3.0 s). Not a training block below the bound: cut there, its gradients and
  // saved activations would get buffers. Past the bound any block is cut anyway: where its first op
  // comes again, up to half the bound later, so that a training loop with no optimizer step to end its
  // blocks (a hand-written update) and no read for many steps repeats a few blocks too, instead of
  // compiling one for every offset (a 30-op step read every 1,000: 4 blocks of 10,000 ops compiled).
  void cut_where_a_loop_repeats(const OpSpec& spec, const c10::IValue* args) {
    if (!block_ || first_op_.first != &spec) return;
    const int64_t ops = block_->ops();
    const bool past_bound = ops >= static_cast<int64_t>(max_ops_);
    if (!past_bound && !(inference_only_ && ops >= static_cast<int64_t>(max_ops_ / 4))) return;
    if (first_op_.second != loop_signature(spec, args)) return;
    flush(past_bound ? "size bound" : "a repeat of the block's first op");
  }
  // Past the bound a block waits for its first op to come again (above) until this many ops.
  int64_t hard_max_ops() const { return static_cast<int64_t>(max_ops_ + max_ops_ / 2); }
  void note_block_op(const Capture& block, const OpSpec* spec, const c10::IValue* args) {
    if (block.ops() == 0) {
      first_op_ = spec ? FirstOp{spec, loop_signature(*spec, args)} : FirstOp{};
      block_thread_ = std::this_thread::get_id();
      inference_only_ = true;
    }
    inference_only_ &= !at::GradMode::is_enabled() && torch::autograd::get_current_graph_task_id() == -1 &&
                       std::this_thread::get_id() == block_thread_;
  }
  // A call as a loop's next step repeats it: the op and its tensors' dtypes, sizes and strides, not
  // whether their storages have buffers (a step's first op reads the step before's results, which have
  // buffers where a block ended before it and not where it goes on).
  static std::string loop_signature(const OpSpec& spec, const c10::IValue* args) {
    KeyWriter k;
    for_each_tensor_arg(spec, args, [&](const at::Tensor& t) {
      if (!t.defined()) return k.tag('N');
      k.i(static_cast<int64_t>(t.scalar_type()));
      k.ints(t.sizes());
      k.ints(t.strides());
      k.i(t.storage_offset());
    });
    return std::move(k.s);
  }

  void run_deferred_flush() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    if (deferred_reason_.empty()) return;
    const std::string reason = deferred_reason_;  // flush clears it
    flush(reason.c_str());
  }

  static std::string describe_ops(const std::vector<const char*>& names) {
    std::string text;
    const size_t shown = std::min<size_t>(names.size(), 8);
    for (size_t i = names.size() - shown; i < names.size(); ++i) {
      text += std::string(text.empty() ? "" : ", ") + (names[i] == kCompiledGraphName ? "" : "aten::") + names[i];
    }
    return names.size() > shown ? "..., " + text : text;
  }

  mutable std::recursive_mutex mutex_;
  std::unique_ptr<Capture> block_;
  rt::Numerics numerics_;
  std::vector<const char*> names_;  // the block's ops, for errors
  size_t max_ops_ = 10000;
  std::atomic<int64_t> ops_recorded_{0};
  int64_t ops_replayed_ = 0, graphs_recorded_ = 0, blocks_run_ = 0, blocks_compiled_ = 0, blocks_reused_ = 0;
  Tape tape_;
  std::map<std::string, int64_t> reasons_;
  std::string deferred_reason_;  // flush_before_next_op's: the block ends at the next op
  FirstOp first_op_;                  // the block's first call
  std::thread::id block_thread_;      // the thread that began the block
  bool inference_only_ = false;       // every op of the block so far: no grad mode, block_thread_
};

// Never destroyed: the block holds buffers, which must not outlive the runtime at exit (Python's
// exit runs the block first).
FusedRecorder* const g_fused_recorder = new FusedRecorder();

std::optional<rt::TensorType> fused_pending_type(const TpuStorage& storage) {
  return g_fused_recorder->pending_type(storage);
}
std::atomic<bool> g_fused{false};

// This thread's capture while one is active (outside begin(), which must not be captured).
thread_local std::unique_ptr<Capture> g_capture;
// A whole-step capture (torch.tpu.graph) is seen by every thread: loss.backward() runs the tpu
// backward on the autograd engine's device thread while the capturing thread waits for it.
std::unique_ptr<Capture> g_step_capture_owner;
std::atomic<Capture*> g_step_capture{nullptr};
std::mutex g_step_graphs_mutex;
std::unordered_map<int64_t, std::shared_ptr<CompiledGraph>> g_step_graphs;  // id -> whole-step graph

// torchtpu::graph_capture_begin(int family, Tensor?[] inputs) -> Tensor?[]
// The fused block goes on: the graph's inputs it computes are inputs of the types it gives them.
std::vector<std::optional<at::Tensor>> capture_begin(int64_t family, const std::vector<std::optional<at::Tensor>>& in) {
  TORCH_CHECK(!g_capture && !g_step_capture.load(), "torchtpu: a graph is already being captured");
  const std::vector<at::Tensor> inputs = tensors_of(in);
  int device = -1;
  std::string key = g_fused_recorder->key_for(family, inputs, device);
  auto capture = std::make_unique<Capture>(std::move(key), device);
  std::vector<std::optional<at::Tensor>> aliases;
  for (at::Tensor& t : capture->begin(inputs)) {
    aliases.push_back(t.defined() ? std::optional<at::Tensor>(std::move(t)) : std::nullopt);
  }
  g_capture = std::move(capture);
  return aliases;
}

// Finishes a capture (outside it) into a compiled graph with a new id, traced as one step.
std::shared_ptr<CompiledGraph> compile_capture(Capture& capture, const std::vector<at::Tensor>& outputs) {
  TracedCall traced("graph", capture.device());
  std::shared_ptr<CompiledGraph> graph = TracedCall::compile([&] { return capture.finish(outputs); });
  if (traced.recording()) {
    traced.record("graph " + std::to_string(graph->id) + " (captured)", std::to_string(graph->params.size()) + " inputs");
  }
  return graph;
}

// torchtpu::graph_capture_end(Tensor[] outputs) -> int: compiles the module and stores the graph;
// returns its id.
int64_t capture_end(const std::vector<at::Tensor>& outputs) {
  TORCH_CHECK(g_capture, "torchtpu: no graph is being captured");
  std::unique_ptr<Capture> capture = std::move(g_capture);  // compiling and storing run outside the capture
  std::shared_ptr<CompiledGraph> graph = compile_capture(*capture, outputs);
  const int64_t id = graph->id;
  std::lock_guard<std::mutex> lock(g_graphs_mutex);
  g_graphs[capture->key()] = std::move(graph);
  return id;
}

void capture_abort() { g_capture.reset(); }

std::vector<rt::BufferPtr> execute_graph(CompiledGraph& graph, const std::vector<at::Tensor>& inputs, int device);

// torch.tpu.graph: a whole-step capture on the current device, seen by every thread.
void step_capture_begin() {
  flush_fused("a graph capture");
  TORCH_CHECK(!g_capture && !g_step_capture.load(), "torch.tpu.graph: a graph is already being captured");
  g_step_capture_owner = std::make_unique<Capture>(std::string(), current_device(), CaptureKind::Step);
  g_step_capture.store(g_step_capture_owner.get());
}

int64_t step_capture_end() {
  TORCH_CHECK(g_step_capture.load(), "torch.tpu.graph: no graph is being captured");
  g_step_capture.store(nullptr);  // compiling runs outside the capture
  std::unique_ptr<Capture> capture = std::move(g_step_capture_owner);
  std::shared_ptr<CompiledGraph> graph = compile_capture(*capture, {});
  std::lock_guard<std::mutex> lock(g_step_graphs_mutex);
  g_step_graphs[graph->id] = graph;
  return graph->id;
}

void step_capture_abort() {
  g_step_capture.store(nullptr);
  g_step_capture_owner.reset();
}

// Runs a whole-step graph once: its storages get the new contents it wrote.
void step_graph_replay(int64_t id) {
  std::shared_ptr<CompiledGraph> graph;
  {
    std::lock_guard<std::mutex> lock(g_step_graphs_mutex);
    const auto it = g_step_graphs.find(id);
    TORCH_CHECK(it != g_step_graphs.end(), "torch.tpu.graph: graph ", id, " was reset");
    graph = it->second;
  }
  TORCH_CHECK(!g_capture && !g_step_capture.load(), "torch.tpu.graph: a graph cannot be replayed while one is captured");
  flush_fused("a graph replay");
  const std::vector<rt::BufferPtr> results = execute_graph(*graph, {}, graph->device);
  for (const auto& [storage, result] : graph->written_storages) storage_of(graph->storages[storage]).buffer = results[result];
}

void step_graph_release(int64_t id) {
  std::lock_guard<std::mutex> lock(g_step_graphs_mutex);
  g_step_graphs.erase(id);
}

// torchtpu._C._graph_run(family, inputs: list[Tensor | None]) -> (int, list[Tensor]): the id of the
// graph captured for this layout of the inputs and its tensor outputs, or 0 where none was. A plain
// binding, not a torch op: it runs on every compiled call, and the dispatcher's boxing of ~100
// tensors each way cost twice what the call itself does.
std::tuple<int64_t, std::vector<at::Tensor>> graph_run(int64_t family, const std::vector<std::optional<at::Tensor>>& in) {
  TORCH_CHECK(!g_step_capture.load(), "torch.tpu.graph cannot capture a torch.compile'd function: capture the eager code");
  const std::vector<at::Tensor> inputs = tensors_of(in);
  if (fused_eager() && !g_capture) {
    bool captured = false;
    if (auto recorded = g_fused_recorder->record_graph(family, inputs, captured)) return std::move(*recorded);
    if (!captured) return {0, {}};
  }
  flush_fused("a compiled graph");
  int device = -1;
  const std::shared_ptr<CompiledGraph> graph = find_graph(input_key(family, inputs, device, nullptr));
  if (!graph) return {0, {}};
  const std::vector<rt::BufferPtr> results = execute_graph(*graph, inputs, device);
  for (const auto& [input, result] : graph->written_inputs) storage_of(inputs[input]).buffer = results[result];
  return {graph->id, graph_outputs(*graph, inputs, [&](int result) {
            return wrap_buffer(results[result], at::kByte, {}, {}, 0, device).storage();
          })};
}

// Runs a compiled graph's executable on its parameters for this call: the inputs' buffers (or, for a
// whole-step graph, its storages' current buffers), host scalars, constants and random state.
std::vector<rt::BufferPtr> execute_graph(CompiledGraph& graph, const std::vector<at::Tensor>& inputs, int device) {
  TracedCall traced("graph", device);
  bool compiled = false;
  const rt::Executable& exe = compile_alone(graph, &compiled);
  traced.set_cache(compiled ? "compile" : "hit");
  std::vector<rt::BufferPtr> keep;
  std::vector<PJRT_Buffer*> raw;
  keep.reserve(graph.params.size());
  for (const GraphParam& p : graph.params) {
    switch (p.kind) {
      case GraphParam::Input:
        keep.push_back(storage_of(inputs[p.input]).buffer);
        break;
      case GraphParam::Storage:
        keep.push_back(storage_of(graph.storages[p.input]).buffer);
        TORCH_CHECK(keep.back(), "torch.tpu.graph: a storage the graph reads has no contents (it was resized away)");
        break;
      case GraphParam::InputScalar:
        keep.push_back(scalar_buffer(inputs[p.input].item(), p.element, device));
        break;
      case GraphParam::Constant:
        keep.push_back(p.constant);
        break;
      case GraphParam::Random: {
        const auto [seed, offset] = reserve_random(std::nullopt, device, p.random_words);
        const uint64_t state[2] = {seed, offset};
        keep.push_back(runtime().to_device(state, rt::ElementType::U64, {2}, device));
        break;
      }
    }
    raw.push_back(keep.back()->raw());
  }
  std::vector<rt::BufferPtr> results;
  traced.execute("tpu::graph", [&] { results = runtime().execute(exe, raw, device, donatable(graph.aliases, keep), &keep); });
  if (traced.recording()) traced.record("graph " + std::to_string(graph.id), std::to_string(raw.size()) + " inputs");
  return results;
}

int64_t compiled_graph_count() {
  std::lock_guard<std::mutex> lock(g_graphs_mutex);
  return static_cast<int64_t>(g_graphs.size());
}

// torchtpu::device_address(Tensor t) -> int: where the tensor's storage lies in device memory
// (tests: a donated storage is updated where it lies). Waits for the buffer.
int64_t device_address(const at::Tensor& t) {
  flush_fused("a host read");
  const rt::BufferPtr& buffer = storage_of(t).buffer;
  TORCH_CHECK(buffer, "torchtpu: the tensor's storage has not been written yet");
  rt::Runtime& rt = runtime();
  rt.synchronize();
  PJRT_Buffer_UnsafePointer_Args args;
  std::memset(&args, 0, sizeof args);
  args.struct_size = PJRT_Buffer_UnsafePointer_Args_STRUCT_SIZE;
  args.buffer = buffer->raw();
  rt.check(rt.api()->PJRT_Buffer_UnsafePointer(&args), "reading a buffer's device address");
  return static_cast<int64_t>(args.buffer_pointer);
}

}  // namespace

GraphCapture* GraphCapture::active() {
  if (g_capture) return g_capture.get();
  if (Capture* step = g_step_capture.load(std::memory_order_acquire)) return step;
  return g_fused.load(std::memory_order_relaxed) ? g_fused_recorder : nullptr;
}

bool fused_eager() { return g_fused.load(); }

void set_fused_eager(bool fused) {
  if (!fused) flush_fused("the eager mode changed");
  g_fused.store(fused);
}

void flush_fused(const char* reason) { g_fused_recorder->flush(reason); }

int64_t compiled_graphs() { return compiled_graph_count(); }

void clear_compiled_graphs() {
  g_fused_recorder->forget_tape();
  std::lock_guard<std::mutex> lock(g_graphs_mutex);
  g_graphs.clear();  // a graph called again is captured anew
}

// Defined with their kernels (CompositeImplicitAutograd): they run as they are for every dispatch
// key, autograd included, since the tensors they return share storages with their inputs by design.
TORCH_LIBRARY(torchtpu, m) {
  m.def("graph_capture_begin(int family, Tensor?[] inputs) -> Tensor?[]", TORCH_FN(capture_begin));
  m.def("graph_capture_end(Tensor[] outputs) -> int", TORCH_FN(capture_end));
  m.def("graph_capture_abort() -> ()", TORCH_FN(capture_abort));
  m.def("device_address(Tensor t) -> int", TORCH_FN(device_address));
}

void bind_graph(pybind11::module& m) {
  m.def("_graph_run", &graph_run, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("_step_capture_begin", &step_capture_begin);
  m.def("_step_capture_end", &step_capture_end);
  m.def("_step_capture_abort", &step_capture_abort);
  m.def("_step_capturing", [] { return g_step_capture.load() != nullptr; });
  m.def("_step_graph_replay", &step_graph_replay, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("_step_graph_release", &step_graph_release);
  m.def("_set_eager_fused", &set_fused_eager);
  m.def("_eager_fused", &fused_eager);
  m.def("_fused_flush", [](const std::string& reason) {
    flush_fused(reason.c_str());
  }, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("_fused_flush_before_next_op", [](const std::string& reason) {
    g_fused_recorder->flush_before_next_op(reason.c_str());
  });
  m.def("_fused_metrics", [] {
    const FusedRecorder::Metrics m = g_fused_recorder->metrics();
    pybind11::dict d;
    d["ops_recorded"] = m.ops_recorded;
    d["ops_replayed"] = m.ops_replayed;  // recorded without emitting them again (the tape)
    d["graphs_recorded"] = m.graphs_recorded;  // torch.compile graphs that joined a block
    d["blocks_run"] = m.blocks_run;
    d["blocks_compiled"] = m.blocks_compiled;
    d["blocks_reused"] = m.blocks_reused;  // ran the executable the tape kept: no module printed
    d["tape_nodes"] = m.tape_nodes;
    d["flush_reasons"] = m.reasons;
    return d;
  });
  m.def("_set_fused_max_ops", [](int64_t ops) { g_fused_recorder->set_max_ops(static_cast<size_t>(ops)); });
}

}  // namespace torchtpu
