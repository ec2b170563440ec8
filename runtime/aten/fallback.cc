// The CPU fallback for ops without a spec: warned once per op, counted, or an error under
// TORCHTPU_FALLBACK=error. Inside a graph capture it refuses, so the graph splits around the op.
#include <ATen/native/CPUFallback.h>
#include <torch/library.h>

#include <mutex>
#include <unordered_map>

#include "aten/graph.h"
#include "aten/op_trace.h"
#include "aten/torch_tpu.h"

namespace torchtpu {
namespace {

std::mutex g_fallback_mutex;
std::unordered_map<std::string, int64_t> g_fallbacks;
bool g_fallback_is_error = false;

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) { run_on_cpu(op, stack, "has no spec"); }

}  // namespace

void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::string& why) {
  const auto& name = op.schema().operator_name();
  const std::string full = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
  // A graph being captured splits here; the op then runs (or is refused) eagerly.
  if (GraphCapture* capture = GraphCapture::active()) capture->refuse(why + " (" + full + ")");
  // ATen ops get a spec (or another dtype in theirs); another library's op gets a tpu kernel from
  // that library's side.
  const bool has_spec = why.rfind("has no spec", 0) != 0;
  const char* remedy = has_spec ? "Add the dtype to its spec where the lowering computes it as the CPU does."
                       : full.rfind("aten::", 0) == 0
                           ? "Add it to a file in specs/ and run `python -m codegen.gen`."
                           : "Register a tpu kernel for it (torch.library.register_kernel(..., \"tpu\")) written "
                             "with ops that run on tpu.";
  TORCH_CHECK_NOT_IMPLEMENTED(!g_fallback_is_error, "torchtpu: ", full, " ", why,
                              ", and TORCHTPU_FALLBACK=error forbids running it on the CPU. ", remedy);
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(g_fallback_mutex);
    first = g_fallbacks[full]++ == 0;
  }
  if (first) {
    TORCH_WARN("torchtpu: ", full, " ", why, has_spec ? ", so it runs on the CPU (slow). " : " yet, so it runs on the CPU (slow). ", remedy);
  }
  TracedCall traced("fallback", current_device());
  std::string shapes;
  if (traced.recording()) {
    const size_t n = op.schema().arguments().size();
    shapes = describe_args(stack->data() + (stack->size() - n), n);
  }
  traced.execute("tpu::cpu_fallback", [&] { at::native::cpu_fallback(op, stack); });
  if (traced.recording()) traced.record(full, std::move(shapes));
}

std::vector<std::pair<std::string, int64_t>> fallback_counts() {
  std::lock_guard<std::mutex> lock(g_fallback_mutex);
  return {g_fallbacks.begin(), g_fallbacks.end()};
}

void set_fallback_is_error(bool error) { g_fallback_is_error = error; }

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
}

}  // namespace torchtpu
