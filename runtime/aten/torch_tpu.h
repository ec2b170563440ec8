// The bridge between PyTorch and the runtime: tpu storages, tensors and executing modules.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <functional>
#include <string>

#include "hlo/hlo_builder.h"
#include "pjrt/pjrt_runtime.h"

namespace torchtpu {

uint64_t next_storage_serial();

// The context of a tpu storage's DataPtr: a handle to one PJRT buffer holding the storage's
// elements in row-major order. `buffer` is null until first written (empty is lazy).
struct TpuStorage {
  size_t nbytes = 0;
  int device = 0;
  rt::BufferPtr buffer;
  // Storages in the order they were made: a whole-step capture tells the storages it found from
  // those made while it ran.
  uint64_t serial = next_storage_serial();
};

TpuStorage& storage_of(const at::Tensor& t);
TpuStorage& storage_of(const c10::Storage& s);

rt::ElementType element_type(at::ScalarType dtype);
at::ScalarType scalar_type(rt::ElementType element);

// A tensor viewing `storage` (another view of it: both see every write).
at::Tensor tensor_on_storage(const c10::Storage& storage, at::ScalarType dtype, at::IntArrayRef sizes,
                             at::IntArrayRef strides, int64_t offset);

// A new tpu tensor whose storage holds `buffer`.
at::Tensor wrap_buffer(rt::BufferPtr buffer, at::ScalarType dtype, at::IntArrayRef sizes, at::IntArrayRef strides,
                       int64_t offset, int device);

rt::ViewGeometry geometry_of(const at::Tensor& t);

// The storage's contents as the module parameter type it is passed as (its buffer's type, or for
// a lazy storage the flat type of the view's dtype), and whether it is lazy.
rt::TensorType storage_type(const at::Tensor& t, bool* lazy);

// Compiles (once per key, then from the in-process map) and runs a module built by `build`,
// which receives the Builder and returns its results.
std::vector<rt::BufferPtr> run_module(const std::string& key, const std::vector<rt::BufferPtr>& inputs,
                                      const std::function<std::vector<rt::Value>(rt::Builder&)>& build, int device);

// Uploads a host scalar as a 0-d buffer; repeated values come from a small cache.
rt::BufferPtr scalar_buffer(const c10::Scalar& value, rt::ElementType element, int device);

// Replaces a tensor view's elements with `value_buffer` (a buffer of the view's sizes and dtype).
void write_into(const at::Tensor& dst, const rt::BufferPtr& value_buffer);

// Reads a view into a new buffer of its sizes (contiguous), in dtype `element`.
rt::BufferPtr read_contiguous(const at::Tensor& src, rt::ElementType element);

// Eager modes (torch.tpu.set_eager_mode): strict, blocking (op_trace.h) and fused (graph.cc: ops
// are recorded into a pending block that runs as one module when a value is needed).
bool fused_eager();
void set_fused_eager(bool fused);  // leaving fused mode runs the pending block
// Runs the pending fused block (if any) as one module; `reason` is counted in the metrics.
void flush_fused(const char* reason);

int current_device();
void set_current_device(int device);

// The numerics a module built now computes with: PyTorch's float32 matmul precision and the math
// mode (torch.tpu.set_math_mode; accurate by default). Every cache key that leads to emission
// carries them (key_numerics in spec_call.h).
rt::Numerics current_numerics();
void set_accurate_math(bool accurate);
bool accurate_math();

rt::Runtime& runtime();  // throws the reason init failed, if it did
void set_init_error(const std::string& message);

// Runs the op on the CPU (PyTorch's CPU fallback) because `why` (it "has no spec", or its spec
// "does not support dtype ..."): warned once per op, counted; raises under TORCHTPU_FALLBACK=error,
// and makes a graph being captured split around the op.
void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::string& why);
// CPU fallbacks by op (metrics) and whether they are allowed.
std::vector<std::pair<std::string, int64_t>> fallback_counts();
void set_fallback_is_error(bool error);
// TORCHTPU_CHECK_INDICES=1: eager kernels with a spec index_check raise CPU's error for out-of-range
// positions (each such call synchronizes).
void set_check_indices(bool check);
void clear_kernel_caches();       // the executables of spec kernels, runtime modules and graphs
void clear_in_process_caches();   // those and the runtime's in-process module cache (the disk tier stays)
// Called before compiling an executable that is not cached in the process: executables hold memory
// mappings of JIT code (rt::kMaxMemoryMappings), so past the budget this drops the in-process caches
// (the disk tier reloads what is used again). True where it dropped them.
bool make_room_for_an_executable();
int64_t set_max_live_executables(int64_t count);  // tests: a smaller budget; returns the one before
void clear_spec_kernel_caches();  // the spec kernels' alone
int64_t compiled_graphs();        // graphs captured and compiled so far (layouts of their inputs)
void clear_compiled_graphs();
int64_t kernel_cache_size();
// Calls of each spec'd overload so far (those called at least once).
std::vector<std::pair<std::string, int64_t>> spec_op_calls();

// Random numbers: one generator per device (hooks' default), fresh ones for torch.Generator("tpu").
const at::Generator& default_tpu_generator(int device);
at::Generator new_tpu_generator(int device);
// Reserves `words` counter values of `generator` (or the device's default): the (seed, offset) to start at.
std::pair<uint64_t, uint64_t> reserve_random(const std::optional<at::Generator>& generator, int device,
                                             uint64_t words);
// The device's default generator: (seed, offset), for torch.tpu.manual_seed / get_rng_state.
std::pair<uint64_t, uint64_t> generator_state(int device);
void set_generator_state(int device, uint64_t seed, uint64_t offset);
uint64_t reseed_randomly(int device);

// Benchmark support: remember the next spec kernel's executable and inputs, then re-execute
// them bare (no dispatch, no key) and return nanoseconds per execution.
void capture_next_execution();
double repeat_captured_execution_ns(int iterations);
// The bare launch of a 64x64 float32 add in variants (portable executable or one compiled for the
// device; outputs dropped at once or kept until the loop ends): nanoseconds per launch of each.
std::vector<std::pair<std::string, double>> dispatch_variants_ns(int iterations);

}  // namespace torchtpu
