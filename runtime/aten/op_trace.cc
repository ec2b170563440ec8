#include "aten/op_trace.h"

#include <mutex>
#include <sstream>

#include "aten/torch_tpu.h"

namespace torchtpu {

std::atomic<bool> g_tracing{false};
std::atomic<bool> g_eager_blocking{false};

void wait_for_device() { runtime().synchronize(); }
thread_local int TracedCall::t_depth = 0;
thread_local TracedCall* TracedCall::t_current = nullptr;

namespace {

std::mutex g_trace_mutex;
std::vector<TraceEvent> g_events;
bool g_synchronize = false;

const char* short_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "f32";
    case at::kDouble: return "f64";
    case at::kHalf: return "f16";
    case at::kBFloat16: return "bf16";
    case at::kLong: return "i64";
    case at::kInt: return "i32";
    case at::kShort: return "i16";
    case at::kChar: return "i8";
    case at::kByte: return "u8";
    case at::kBool: return "bool";
    case at::kComplexFloat: return "c64";
    case at::kComplexDouble: return "c128";
    default: return c10::toString(dtype);
  }
}

void append_event(TraceEvent event) {
  std::lock_guard<std::mutex> lock(g_trace_mutex);
  if (g_tracing.load()) g_events.push_back(std::move(event));  // a trace stopped meanwhile keeps nothing
}

}  // namespace

int64_t trace_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t trace_start(bool synchronize) {
  std::lock_guard<std::mutex> lock(g_trace_mutex);
  TORCH_CHECK(!g_tracing.load(), "torchtpu: a trace is already running (traces do not nest)");
  g_events.clear();
  g_synchronize = synchronize;
  g_tracing = true;
  return trace_now_ns();
}

std::vector<TraceEvent> trace_stop() {
  std::lock_guard<std::mutex> lock(g_trace_mutex);
  g_tracing = false;
  return std::move(g_events);
}

std::string describe_tensor(const at::Tensor& t) {
  if (!t.defined()) return "";
  std::ostringstream s;
  s << short_dtype(t.scalar_type()) << "[";
  for (int64_t d = 0; d < t.dim(); ++d) s << (d ? ", " : "") << t.size(d);
  s << "]";
  return s.str();
}

std::string describe_args(const c10::IValue* args, size_t n) {
  std::string out;
  const auto add = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    if (!out.empty()) out += ", ";
    out += describe_tensor(t);
  };
  for (size_t i = 0; i < n; ++i) {
    if (args[i].isTensor()) add(args[i].toTensor());
    if (args[i].isTensorList()) {
      for (const at::Tensor& t : args[i].toTensorList()) add(t);
    }
  }
  return out;
}

void TracedCall::wait_if_measuring(bool profiling) {
  bool synchronize = profiling;
  if (recording()) {
    std::lock_guard<std::mutex> lock(g_trace_mutex);
    synchronize |= g_synchronize;
  }
  if (synchronize) runtime().synchronize();
}

void TracedCall::record(std::string name, std::string shapes) {
  const char* cache = cache_;
  if (!cache && compiled_) {
    switch (rt::last_compile_outcome().tier) {
      case rt::CompileOutcome::Memory: cache = "memory"; break;
      case rt::CompileOutcome::Disk: cache = "disk"; break;
      case rt::CompileOutcome::Compiled: cache = "compile"; break;
    }
  }
  append_event({std::move(name), kind_, std::move(shapes), cache ? cache : "", start_ns_, compile_ns_, execute_ns_,
                runtime().metrics().live_bytes.load(), device_, depth_});
}

void TracedCall::record_recorded_op(std::string name, std::string shapes, const char* cache, int64_t start_ns,
                                    int device) {
  append_event({std::move(name), "recorded", std::move(shapes), cache, start_ns, 0, trace_now_ns() - start_ns,
                runtime().metrics().live_bytes.load(), device, t_depth});
}

}  // namespace torchtpu
