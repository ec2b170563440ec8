// The op tracer behind torchtpu.debug.trace(): while it is on, every spec kernel call, CPU
// fallback, copy between devices and compiled-graph run is recorded with its shapes, where its
// executable came from, and its compile and execute times. Off, a kernel pays one relaxed load.
// Every recorded step is also a torch.profiler range ("tpu::compile", "tpu::execute", ...).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pjrt/pjrt_runtime.h"

namespace torchtpu {

// torch.OutOfMemoryError (what CUDA raises) for an allocation the plugin refused, naming what the
// current device holds (torch_storage.cc).
[[noreturn]] void raise_out_of_memory(const rt::OutOfMemoryError& error);

struct TraceEvent {
  std::string name;    // "aten::add.Tensor", "graph 3", "aten::_copy_from tpu->cpu", ...
  const char* kind;    // "op" | "fallback" | "graph" | "copy" | "fused" | "recorded"
  std::string shapes;  // the tensor arguments: "f32[4, 8], f32[8]"
  const char* cache;   // "hit" (kernel cache) | "memory" | "disk" | "compile" | "tape" | "" (nothing compiled)
  int64_t start_ns;    // steady clock
  int64_t compile_ns;  // building and compiling its module, where it had to
  int64_t execute_ns;  // running it (until its results were ready, when the trace synchronizes)
  int64_t live_bytes;  // device memory held after it
  int device;
  int depth;           // 0, or how many recorded steps it ran inside (a fallback's copies: 1)
};

extern std::atomic<bool> g_tracing;
inline bool tracing() { return g_tracing.load(std::memory_order_relaxed); }

// Eager mode "blocking" (torch.tpu.set_eager_mode): every execution and transfer waits for the
// device before its op returns, so a device error surfaces at the op that caused it.
extern std::atomic<bool> g_eager_blocking;
inline bool eager_blocking() { return g_eager_blocking.load(std::memory_order_relaxed); }
void wait_for_device();  // runtime().synchronize(), out of line

// Starts a trace (an error if one is running); `synchronize`: each recorded step waits for its
// results, so execute times are the device's, not the time to enqueue.
// Returns the trace's start (trace_now_ns()).
int64_t trace_start(bool synchronize);
std::vector<TraceEvent> trace_stop();
int64_t trace_now_ns();

// "f32[4, 8]" for a tensor, "" for an undefined one.
std::string describe_tensor(const at::Tensor& t);
// The defined tensors among n arguments (tensor lists included): "f32[4, 8], i64[4]".
std::string describe_args(const c10::IValue* args, size_t n);

// One recorded step: made where a kernel starts, given the compile and execute phases, recorded
// when finished. Each phase is also a torch.profiler range; under the profiler a phase waits for
// its results, so the range's time is the device's.
class TracedCall {
 public:
  TracedCall(const char* kind, int device) : kind_(kind), device_(device) {
    if (tracing()) {
      start_ns_ = trace_now_ns();
      depth_ = t_depth++;
      outer_ = t_current;
      t_current = this;
    }
  }
  ~TracedCall() {
    if (recording()) {
      t_depth--;
      t_current = outer_;
    }
  }
  TracedCall(const TracedCall&) = delete;
  TracedCall& operator=(const TracedCall&) = delete;
  bool recording() const { return start_ns_ >= 0; }

  // Wraps building and compiling a module, wherever that happens: the time counts as compile time
  // of the innermost step being recorded on this thread (not as its execute time). A module too big
  // for the device (a TPU says so when it compiles) is torch.OutOfMemoryError.
  template <typename F>
  static auto compile(F&& build) {
    try {
      return compile_timed(build);
    } catch (const rt::OutOfMemoryError& error) {
      raise_out_of_memory(error);
    }
  }
  // Wraps enqueuing an execution (or a transfer); waits for it while tracing with synchronize or profiling.
  template <typename F>
  void execute(const char* range_name, F&& run) {
    at::RecordFunction range(at::RecordScope::USER_SCOPE);
    if (range.isActive()) range.before(range_name);
    if (!recording() && !range.isActive()) {
      run_reporting_memory(run);
      return;
    }
    const int64_t start = trace_now_ns();
    executing_ = true;
    run_reporting_memory(run);
    wait_if_measuring(range.isActive());
    executing_ = false;
    execute_ns_ += trace_now_ns() - start - compile_in_execute_ns_;
    compile_in_execute_ns_ = 0;
  }
  void set_cache(const char* cache) { cache_ = cache; }
  // Adds the event to the trace; call only while recording() (names and shapes cost strings).
  void record(std::string name, std::string shapes);
  // Adds an op fused eager mode recorded (kind "recorded"; cache "tape" where its emission was
  // replayed): its execute time is the host's time recording it, from start_ns.
  static void record_recorded_op(std::string name, std::string shapes, const char* cache, int64_t start_ns,
                                 int device);

 private:
  template <typename F>
  static auto compile_timed(F& build) {
    at::RecordFunction range(at::RecordScope::USER_SCOPE);
    if (range.isActive()) range.before("tpu::compile");
    TracedCall* call = t_current;
    if (!call) return build();
    const int64_t start = trace_now_ns();
    auto result = build();
    const int64_t ns = trace_now_ns() - start;
    call->compile_ns_ += ns;
    if (call->executing_) call->compile_in_execute_ns_ += ns;
    call->compiled_ = true;
    return result;
  }

  template <typename F>
  static void run_reporting_memory(F& run) {
    try {
      run();
      if (eager_blocking()) wait_for_device();
    } catch (const rt::OutOfMemoryError& error) {
      raise_out_of_memory(error);
    }
  }
  void wait_if_measuring(bool profiling);

  static thread_local int t_depth;               // recorded steps running on this thread
  static thread_local TracedCall* t_current;  // the innermost of them

  const char* kind_;
  int device_;
  int depth_ = 0;
  TracedCall* outer_ = nullptr;
  bool executing_ = false;
  int64_t compile_in_execute_ns_ = 0;
  int64_t start_ns_ = -1;
  int64_t compile_ns_ = 0;
  int64_t execute_ns_ = 0;
  bool compiled_ = false;
  const char* cache_ = nullptr;
};

}  // namespace torchtpu
