// The PJRT runtime: loads one PJRT C API plugin, owns its client and devices,
// moves buffers, compiles StableHLO text (through the compile cache) and executes.
// Knows no torch and no particular op.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "pjrt/element_type.h"

struct PJRT_Api;
struct PJRT_Client;
struct PJRT_Device;
struct PJRT_Buffer;
struct PJRT_LoadedExecutable;
struct PJRT_Error;
struct PJRT_Event;

namespace torchtpu::rt {

// Every failure of the runtime surfaces as this exception (never a crash).
class RuntimeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The plugin could not allocate (PJRT's RESOURCE_EXHAUSTED); torch's layer raises torch.OutOfMemoryError.
class OutOfMemoryError : public RuntimeError {
 public:
  using RuntimeError::RuntimeError;
};

// The plugin allocator's own counts for one device (PJRT_Device_MemoryStats): unlike DeviceMemory they
// include XLA's temporaries and every client's buffers. -1 where the plugin does not say.
struct PluginMemoryStats {
  bool available = false;  // false where the plugin does not implement the query
  int64_t bytes_in_use = -1;
  int64_t peak_bytes_in_use = -1;
  int64_t bytes_limit = -1;
  int64_t largest_alloc_size = -1;
};

class Runtime;

// One device buffer. Destroyed (and uncounted) when the last owner lets go.
class DeviceBuffer {
 public:
  DeviceBuffer(Runtime* runtime, PJRT_Buffer* buffer, ElementType type, std::vector<int64_t> dims, int device);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  PJRT_Buffer* raw() const { return buffer_; }
  ElementType type() const { return type_; }
  const std::vector<int64_t>& dims() const { return dims_; }
  int device() const { return device_; }
  int64_t numel() const;
  int64_t nbytes() const { return numel() * element_size(type_); }
  // Counted in the device's memory; false once an execution consumed it (donated: its memory is
  // now an output's, which is counted).
  bool counted = true;

 private:
  Runtime* runtime_;
  PJRT_Buffer* buffer_;
  ElementType type_;
  std::vector<int64_t> dims_;
  int device_;
};
using BufferPtr = std::shared_ptr<DeviceBuffer>;

// A loaded executable plus what we need to call it.
// Loaded executables cost memory mappings (the CPU plugin maps 3-20 regions of JIT code each) and
// Linux allows ~65k per process; past that the plugin's JIT fails and its unwinder state is corrupt
// (the next C++ throw crashes). Before compiling a new executable (an eager kernel's, a fused block's,
// a graph's, a runtime module's), torchtpu::make_room_for_an_executable drops the in-process caches
// when a process holds more than kMaxLiveExecutables executables or kMaxMemoryMappings mappings.
constexpr int64_t kMaxLiveExecutables = 2048;
constexpr int64_t kMaxMemoryMappings = 40000;
int64_t process_memory_mappings();  // Linux: lines of /proc/self/maps; elsewhere 0

// Compiled for one device (a device assignment, as jax compiles: launched without naming a device);
// the first launch on another device compiles the module for that one too (kept in `variants`).
struct Executable {
  PJRT_LoadedExecutable* loaded = nullptr;
  size_t num_outputs = 0;
  std::vector<TensorType> output_types;
  Runtime* runtime = nullptr;
  int assigned_device = -1;  // -1: portable (the dispatch measurement's baseline), named per launch
  std::string module_text;   // to compile it for another device
  std::mutex variants_mutex;
  std::unordered_map<int, std::shared_ptr<Executable>> variants;  // device -> the module compiled for it
  ~Executable();
};
using ExecutablePtr = std::shared_ptr<Executable>;

// Counters for tools and tests (bench, metrics_report, leak tests).
struct Metrics {
  std::atomic<int64_t> executions{0};
  std::atomic<int64_t> live_executables{0};
  std::atomic<int64_t> compiles{0};
  std::atomic<int64_t> compile_ns{0};
  std::atomic<int64_t> memory_cache_hits{0};
  std::atomic<int64_t> disk_cache_hits{0};
  std::atomic<int64_t> disk_cache_writes{0};
  std::atomic<int64_t> disk_cache_rejected{0};
  std::atomic<int64_t> bytes_to_device{0};
  std::atomic<int64_t> bytes_to_host{0};
  std::atomic<int64_t> live_buffers{0};
  std::atomic<int64_t> live_bytes{0};
  std::atomic<int64_t> peak_live_bytes{0};
};

// Memory of one device, as torch.cuda's allocator statistics count it (no caching allocator here:
// a buffer is allocated by the plugin when made and freed when its last owner lets go).
struct DeviceMemory {
  std::atomic<int64_t> live_bytes{0};
  std::atomic<int64_t> peak_bytes{0};
  std::atomic<int64_t> live_buffers{0};
  std::atomic<int64_t> peak_buffers{0};
  std::atomic<int64_t> allocations{0};      // buffers made so far
  std::atomic<int64_t> frees{0};            // buffers freed so far
  std::atomic<int64_t> allocated_bytes{0};  // bytes of every buffer made so far
  std::atomic<int64_t> freed_bytes{0};
  void reset_peaks() {
    peak_bytes = live_bytes.load();
    peak_buffers = live_buffers.load();
  }
  void reset_totals() {
    allocations = 0;
    frees = 0;
    allocated_bytes = 0;
    freed_bytes = 0;
  }
};

// Where the last Runtime::compile call on this thread found its executable, and how long it took.
struct CompileOutcome {
  enum Tier : uint8_t { Memory, Disk, Compiled } tier = Memory;
  int64_t ns = 0;
};
CompileOutcome last_compile_outcome();

class CompileCache;

class Runtime {
 public:
  // Loads the plugin at `plugin_path` and creates a client. Throws RuntimeError naming the path.
  // `cache_dir` empty = no persistent cache.
  Runtime(const std::string& plugin_path, const std::string& cache_dir);
  ~Runtime();

  // The process-wide runtime (set by install()); throws if none was installed.
  static Runtime& get();
  static Runtime* get_if_installed();
  static void install(std::unique_ptr<Runtime> runtime);

  int device_count() const { return static_cast<int>(devices_.size()); }
  const std::string& plugin_path() const { return plugin_path_; }
  const std::string& platform_name() const { return platform_name_; }
  const std::string& platform_version() const { return platform_version_; }
  std::string device_kind(int device) const;
  int api_major() const { return api_major_; }
  int api_minor() const { return api_minor_; }
  // Plugin file hash + API version + platform: what a serialized executable depends on.
  const std::string& identity();

  // `data` is dense row-major. `minor_to_major` (tests): the buffer's device layout instead of the
  // plugin's default, as a TPU picks for some shapes.
  BufferPtr to_device(const void* data, ElementType type, const std::vector<int64_t>& dims, int device,
                      const std::vector<int64_t>* minor_to_major = nullptr);
  // Copies the buffer to `dst` dense row-major, whatever its device layout.
  void to_host(const DeviceBuffer& buffer, void* dst, size_t nbytes);
  // The buffer's device dim order (minor to major; empty where the plugin does not say).
  std::vector<int64_t> device_layout(const DeviceBuffer& buffer);

  // Compiles (or fetches from the two cache tiers) a StableHLO module in text form.
  // For `device` (launching it on another device compiles it for that one on first use).
  ExecutablePtr compile(const std::string& module_text, const std::vector<TensorType>& output_types, int device = 0);
  // A portable executable (any device, named at each launch), bypassing both caches: the dispatch
  // measurements compare launching it with launching a device's own.
  ExecutablePtr compile_portable(const std::string& module_text, const std::vector<TensorType>& output_types);

  // Enqueues an execution; returns the output buffers at once (they become ready later).
  // `donated`: argument indices whose buffers the executable may consume (aliased to an output in
  // the module; the caller holds the only reference). Every other argument stays intact.
  // `owners`: the BufferPtrs of `args` where some are donated; those the plugin consumed stop counting
  // as held memory before the outputs (which now hold it) are counted.
  std::vector<BufferPtr> execute(const Executable& exe, const std::vector<PJRT_Buffer*>& args, int device,
                                 const std::vector<int64_t>& donated = {},
                                 const std::vector<BufferPtr>* owners = nullptr);

  // Waits for everything enqueued so far (outputs already dropped included).
  void synchronize();

  // Drops the in-process tier (tests use it to prove the disk tier works).
  void clear_in_process_cache();

  Metrics& metrics() { return metrics_; }
  DeviceMemory& device_memory(int device) { return device_memory_[static_cast<size_t>(device)]; }
  PluginMemoryStats plugin_memory_stats(int device);

  int64_t device_id(int device);  // the plugin's global id of our device index
  CompileCache& cache() { return *cache_; }

  // Internal plumbing shared with DeviceBuffer/Executable.
  const PJRT_Api* api() const { return api_; }
  void check(PJRT_Error* error, const char* what);
  std::string take_error(PJRT_Error* error);  // its message; destroys it
  // Waits for and destroys `event` (may be null); throws its error.
  void await_event(PJRT_Event* event, const char* what);
  void note_buffer_made(int64_t nbytes, int device);
  void note_buffer_freed(int64_t nbytes, int device);
  // Keeps `event` (an execution's completion) for synchronize() to await; past 1,024 kept, the ones
  // that finished without an error are dropped first.
  void keep_running(PJRT_Event* event);

 private:
  ExecutablePtr compile_through_disk(const std::string& module_text, const std::vector<TensorType>& output_types,
                                     int device);
  const Executable& for_device(const Executable& exe, int device);
  void uncount_donated(const std::vector<BufferPtr>& owners, const std::vector<int64_t>& donated);
  // `options` compile for `assigned_device` (-1: portable).
  ExecutablePtr compile_uncached(const std::string& module_text, const std::vector<TensorType>& output_types,
                                 int assigned_device, const std::string& options);
  // Null (and why in `refusal`) where the plugin refuses the blob.
  ExecutablePtr load_serialized(const std::string& blob, const std::vector<TensorType>& output_types, int device,
                                std::string* refusal);
  std::string serialize(const Executable& exe);  // empty where the plugin cannot

  std::string plugin_path_;
  void* library_ = nullptr;
  const PJRT_Api* api_ = nullptr;
  PJRT_Client* client_ = nullptr;
  std::vector<PJRT_Device*> devices_;
  std::string platform_name_;
  std::string platform_version_;
  std::string identity_;
  int api_major_ = 0;
  int api_minor_ = 0;
  Metrics metrics_;
  std::unique_ptr<DeviceMemory[]> device_memory_;  // one per device
  std::unique_ptr<CompileCache> cache_;
  std::mutex compiled_mutex_;
  std::unordered_map<std::string, ExecutablePtr> compiled_;  // module text -> executable
  std::mutex running_mutex_;
  // One completion event per execution synchronize() has not awaited (outputs need none of their own:
  // synchronize() awaited a ready event per output before, ~1 us each on the CPU plugin).
  std::vector<PJRT_Event*> running_;
};

}  // namespace torchtpu::rt
