#include "pjrt/pjrt_runtime.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "pjrt/compile_cache.h"
#include "pjrt_c_api.h"

namespace torchtpu::rt {
namespace {

// Zeroed args struct with its size set: the contract that lets one client run on
// plugins of older and newer API minor versions.
template <typename T>
T make_args(size_t struct_size) {
  T args;
  std::memset(&args, 0, sizeof args);
  args.struct_size = struct_size;
  return args;
}
#define PJRT_ARGS(type) make_args<type>(type##_STRUCT_SIZE)

// Every compile's xla.CompileOptionsProto ends with env_option_overrides {key:
// "xla_allow_excess_precision" value {bool_field: false}}: PyTorch rounds each op's result to its
// dtype, and with XLA's default a TPU deletes an f32 -> bf16 -> f32 pair of converts that a module
// joining several ops holds (fused eager mode's `x.to(bfloat16)` then read as float32 by the next op
// gave the unrounded values; the stored tensor held the rounded ones).
const std::string kNoExcessPrecision =
    std::string("\x3a\x20\x0a\x1a", 4) + "xla_allow_excess_precision" + std::string("\x12\x02\x10\x00", 4);

// executable_build_options {num_replicas: 1, num_partitions: 1} plus compile_portable_executable:
// true, so one executable runs on any device we name at execute time (only the dispatch
// measurement's baseline: launching a portable executable costs more).
const std::string kCompileOptions = std::string("\x1a\x04\x20\x01\x28\x01\x20\x01", 8) + kNoExcessPrecision;

// The same build options with device_assignment {replica_count: 1, computation_count: 1,
// computation_devices {replica_device_ids: id}} and not portable: an executable for that device only.
std::string compile_options_for_device(int64_t id) {
  if (id < 0 || id > 127) throw RuntimeError("torchtpu: device ids past 127 are not encoded here");
  const char c = static_cast<char>(id);
  const char bytes[] = {'\x1a', '\x0e', '\x20', '\x01', '\x28', '\x01', '\x4a', '\x08',
                        '\x08', '\x01', '\x10', '\x01', '\x1a', '\x02', '\x08', c};
  return std::string(bytes, sizeof bytes) + kNoExcessPrecision;
}

PJRT_Buffer_Type to_pjrt(ElementType t) {
  switch (t) {
    case ElementType::Pred: return PJRT_Buffer_Type_PRED;
    case ElementType::S8: return PJRT_Buffer_Type_S8;
    case ElementType::S16: return PJRT_Buffer_Type_S16;
    case ElementType::S32: return PJRT_Buffer_Type_S32;
    case ElementType::S64: return PJRT_Buffer_Type_S64;
    case ElementType::U8: return PJRT_Buffer_Type_U8;
    case ElementType::U16: return PJRT_Buffer_Type_U16;
    case ElementType::U32: return PJRT_Buffer_Type_U32;
    case ElementType::U64: return PJRT_Buffer_Type_U64;
    case ElementType::F16: return PJRT_Buffer_Type_F16;
    case ElementType::BF16: return PJRT_Buffer_Type_BF16;
    case ElementType::F32: return PJRT_Buffer_Type_F32;
    case ElementType::F64: return PJRT_Buffer_Type_F64;
    case ElementType::C64: return PJRT_Buffer_Type_C64;
    case ElementType::C128: return PJRT_Buffer_Type_C128;
    case ElementType::F8E4M3FN: return PJRT_Buffer_Type_F8E4M3FN;
    case ElementType::F8E5M2: return PJRT_Buffer_Type_F8E5M2;
    case ElementType::F8E4M3FNUZ: return PJRT_Buffer_Type_F8E4M3FNUZ;
    case ElementType::F8E5M2FNUZ: return PJRT_Buffer_Type_F8E5M2FNUZ;
  }
  return PJRT_Buffer_Type_INVALID;
}

Runtime* g_runtime = nullptr;

// TORCHTPU_DUMP_DIR: every module compiled (not loaded from a cache) is written there for reading.
void dump_module(const std::string& module_text) {
  static const char* dir = std::getenv("TORCHTPU_DUMP_DIR");
  if (!dir || !*dir || !make_dirs(dir)) return;
  const std::string path = std::string(dir) + "/" + hex_digest(module_text) + ".mlir";
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    std::fwrite(module_text.data(), 1, module_text.size(), f);
    std::fclose(f);
  }
}

}  // namespace

namespace {
void raise_to(std::atomic<int64_t>& peak, int64_t value) {
  int64_t seen = peak.load();
  while (value > seen && !peak.compare_exchange_weak(seen, value)) {
  }
}
thread_local CompileOutcome t_last_compile;
}  // namespace

CompileOutcome last_compile_outcome() { return t_last_compile; }

// ---------------------------------------------------------------------------------------------
// DeviceBuffer / Executable

DeviceBuffer::DeviceBuffer(Runtime* runtime, PJRT_Buffer* buffer, ElementType type, std::vector<int64_t> dims,
                           int device)
    : runtime_(runtime), buffer_(buffer), type_(type), dims_(std::move(dims)), device_(device) {
  runtime_->note_buffer_made(nbytes(), device_);
}

DeviceBuffer::~DeviceBuffer() {
  auto args = PJRT_ARGS(PJRT_Buffer_Destroy_Args);
  args.buffer = buffer_;
  PJRT_Error* error = runtime_->api()->PJRT_Buffer_Destroy(&args);
  if (error) {
    auto destroy = PJRT_ARGS(PJRT_Error_Destroy_Args);
    destroy.error = error;
    runtime_->api()->PJRT_Error_Destroy(&destroy);
  }
  if (counted) runtime_->note_buffer_freed(nbytes(), device_);
}

int64_t DeviceBuffer::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

int64_t process_memory_mappings() {
  std::FILE* maps = std::fopen("/proc/self/maps", "r");
  if (!maps) return 0;
  int64_t lines = 0;
  char chunk[65536];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof chunk, maps)) > 0) lines += std::count(chunk, chunk + n, '\n');
  std::fclose(maps);
  return lines;
}

Executable::~Executable() {
  if (loaded && runtime) {
    runtime->metrics().live_executables--;
    auto args = PJRT_ARGS(PJRT_LoadedExecutable_Destroy_Args);
    args.executable = loaded;
    runtime->check(runtime->api()->PJRT_LoadedExecutable_Destroy(&args), "destroying an executable");
  }
}

// ---------------------------------------------------------------------------------------------
// Runtime

std::string Runtime::take_error(PJRT_Error* error) {
  auto message = PJRT_ARGS(PJRT_Error_Message_Args);
  message.error = error;
  api_->PJRT_Error_Message(&message);
  std::string text(message.message, message.message_size);
  auto destroy = PJRT_ARGS(PJRT_Error_Destroy_Args);
  destroy.error = error;
  api_->PJRT_Error_Destroy(&destroy);
  return text;
}

void Runtime::check(PJRT_Error* error, const char* what) {
  if (!error) return;
  auto code = PJRT_ARGS(PJRT_Error_GetCode_Args);
  code.error = error;
  const bool exhausted = !api_->PJRT_Error_GetCode(&code) && code.code == PJRT_Error_Code_RESOURCE_EXHAUSTED;
  const std::string text = take_error(error);
  std::string message = std::string("torchtpu: PJRT error while ") + what + ": " + text;
  // libtpu reports a module whose buffers cannot fit when it compiles it, with another code.
  if (exhausted || text.find("Ran out of memory") != std::string::npos) throw OutOfMemoryError(message);
  throw RuntimeError(message);
}

void Runtime::uncount_donated(const std::vector<BufferPtr>& owners, const std::vector<int64_t>& donated) {
  for (int64_t i : donated) {
    DeviceBuffer& buffer = *owners.at(static_cast<size_t>(i));
    if (!buffer.counted) continue;
    auto args = PJRT_ARGS(PJRT_Buffer_IsDeleted_Args);
    args.buffer = buffer.raw();
    if (PJRT_Error* error = api_->PJRT_Buffer_IsDeleted(&args)) {
      take_error(error);
      continue;
    }
    if (args.is_deleted) {
      note_buffer_freed(buffer.nbytes(), buffer.device());
      buffer.counted = false;
    }
  }
}

PluginMemoryStats Runtime::plugin_memory_stats(int device) {
  PluginMemoryStats stats;
  auto args = PJRT_ARGS(PJRT_Device_MemoryStats_Args);
  args.device = devices_.at(static_cast<size_t>(device));
  if (PJRT_Error* error = api_->PJRT_Device_MemoryStats(&args)) {
    take_error(error);  // UNIMPLEMENTED on some plugins: the stats are diagnostics
    return stats;
  }
  stats.available = true;
  stats.bytes_in_use = args.bytes_in_use;
  if (args.peak_bytes_in_use_is_set) stats.peak_bytes_in_use = args.peak_bytes_in_use;
  if (args.bytes_limit_is_set) stats.bytes_limit = args.bytes_limit;
  if (args.largest_alloc_size_is_set) stats.largest_alloc_size = args.largest_alloc_size;
  return stats;
}

void Runtime::await_event(PJRT_Event* event, const char* what) {
  if (!event) return;
  auto await = PJRT_ARGS(PJRT_Event_Await_Args);
  await.event = event;
  PJRT_Error* error = api_->PJRT_Event_Await(&await);
  auto destroy = PJRT_ARGS(PJRT_Event_Destroy_Args);
  destroy.event = event;
  api_->PJRT_Event_Destroy(&destroy);
  check(error, what);
}

void Runtime::note_buffer_made(int64_t nbytes, int device) {
  metrics_.live_buffers++;
  raise_to(metrics_.peak_live_bytes, metrics_.live_bytes += nbytes);
  DeviceMemory& d = device_memory(device);
  raise_to(d.peak_bytes, d.live_bytes += nbytes);
  raise_to(d.peak_buffers, ++d.live_buffers);
  d.allocations++;
  d.allocated_bytes += nbytes;
}

void Runtime::keep_running(PJRT_Event* event) {
  auto is_ready = [&](PJRT_Event* e) {
    auto query = PJRT_ARGS(PJRT_Event_IsReady_Args);
    query.event = e;
    if (PJRT_Error* error = api_->PJRT_Event_IsReady(&query)) take_error(error);
    return query.is_ready;
  };
  // Finished without an error (a failed execution's event stays for synchronize() to raise).
  auto finished_well = [&](PJRT_Event* e) {
    if (!is_ready(e)) return false;
    auto error = PJRT_ARGS(PJRT_Event_Error_Args);
    error.event = e;
    if (PJRT_Error* failed = api_->PJRT_Event_Error(&error)) {
      take_error(failed);
      return false;
    }
    return true;
  };
  auto destroy = [&](PJRT_Event* e) {
    auto args = PJRT_ARGS(PJRT_Event_Destroy_Args);
    args.event = e;
    api_->PJRT_Event_Destroy(&args);
  };
  std::lock_guard<std::mutex> lock(running_mutex_);
  if (running_.size() >= 1024) {  // keep the list short: most have finished by now
    running_.erase(std::remove_if(running_.begin(), running_.end(),
                                  [&](PJRT_Event* e) { return finished_well(e) ? (destroy(e), true) : false; }),
                   running_.end());
  }
  running_.push_back(event);
}

void Runtime::note_buffer_freed(int64_t nbytes, int device) {
  metrics_.live_buffers--;
  metrics_.live_bytes -= nbytes;
  DeviceMemory& d = device_memory(device);
  d.live_bytes -= nbytes;
  d.live_buffers--;
  d.frees++;
  d.freed_bytes += nbytes;
}

Runtime::Runtime(const std::string& plugin_path, const std::string& cache_dir)
    : plugin_path_(plugin_path), cache_(std::make_unique<CompileCache>(cache_dir)) {
  library_ = dlopen(plugin_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library_) {
    throw RuntimeError("torchtpu: cannot load the PJRT plugin '" + plugin_path + "': " + dlerror() +
                       " (choose one with TORCHTPU_PJRT_PLUGIN=cpu|tpu|cuda|<path to a PJRT plugin .so>)");
  }
  using GetApi = const PJRT_Api* (*)();
  auto get_api = reinterpret_cast<GetApi>(dlsym(library_, "GetPjrtApi"));
  if (!get_api) {
    throw RuntimeError("torchtpu: '" + plugin_path + "' exports no GetPjrtApi: it is not a PJRT plugin " +
                       "(set TORCHTPU_PJRT_PLUGIN to a PJRT plugin)");
  }
  api_ = get_api();
  api_major_ = api_->pjrt_api_version.major_version;
  api_minor_ = api_->pjrt_api_version.minor_version;
  if (api_major_ != PJRT_API_MAJOR) {
    throw RuntimeError("torchtpu: the PJRT plugin '" + plugin_path + "' speaks PJRT C API " +
                       std::to_string(api_major_) + "." + std::to_string(api_minor_) + ", this build speaks " +
                       std::to_string(PJRT_API_MAJOR) + ".x");
  }
  auto init = PJRT_ARGS(PJRT_Plugin_Initialize_Args);
  check(api_->PJRT_Plugin_Initialize(&init), "initializing the plugin");

  auto create = PJRT_ARGS(PJRT_Client_Create_Args);
  check(api_->PJRT_Client_Create(&create), "creating the client");
  client_ = create.client;

  auto devices = PJRT_ARGS(PJRT_Client_AddressableDevices_Args);
  devices.client = client_;
  check(api_->PJRT_Client_AddressableDevices(&devices), "listing devices");
  devices_.assign(devices.addressable_devices, devices.addressable_devices + devices.num_addressable_devices);
  device_memory_ = std::make_unique<DeviceMemory[]>(devices_.size());

  auto name = PJRT_ARGS(PJRT_Client_PlatformName_Args);
  name.client = client_;
  check(api_->PJRT_Client_PlatformName(&name), "reading the platform name");
  platform_name_.assign(name.platform_name, name.platform_name_size);
  auto version = PJRT_ARGS(PJRT_Client_PlatformVersion_Args);
  version.client = client_;
  check(api_->PJRT_Client_PlatformVersion(&version), "reading the platform version");
  platform_version_.assign(version.platform_version, version.platform_version_size);
}

Runtime::~Runtime() {
  if (client_) {
    auto args = PJRT_ARGS(PJRT_Client_Destroy_Args);
    args.client = client_;
    PJRT_Error* error = api_->PJRT_Client_Destroy(&args);
    if (error) {
      auto destroy = PJRT_ARGS(PJRT_Error_Destroy_Args);
      destroy.error = error;
      api_->PJRT_Error_Destroy(&destroy);
    }
  }
  // The library stays loaded: plugins commonly leave threads and atexit hooks behind.
}

Runtime& Runtime::get() {
  if (!g_runtime) throw RuntimeError("torchtpu: the PJRT runtime is not initialized");
  return *g_runtime;
}

Runtime* Runtime::get_if_installed() { return g_runtime; }

void Runtime::install(std::unique_ptr<Runtime> runtime) {
  // Deliberately leaked at exit: tensors may outlive any static destructor order.
  g_runtime = runtime.release();
}

int64_t Runtime::device_id(int device) {
  auto desc = PJRT_ARGS(PJRT_Device_GetDescription_Args);
  desc.device = devices_.at(static_cast<size_t>(device));
  check(api_->PJRT_Device_GetDescription(&desc), "describing a device");
  auto id = PJRT_ARGS(PJRT_DeviceDescription_Id_Args);
  id.device_description = desc.device_description;
  check(api_->PJRT_DeviceDescription_Id(&id), "reading a device id");
  return id.id;
}

std::string Runtime::device_kind(int device) const {
  auto desc = PJRT_ARGS(PJRT_Device_GetDescription_Args);
  desc.device = devices_.at(device);
  const_cast<Runtime*>(this)->check(api_->PJRT_Device_GetDescription(&desc), "describing a device");
  auto kind = PJRT_ARGS(PJRT_DeviceDescription_Kind_Args);
  kind.device_description = desc.device_description;
  const_cast<Runtime*>(this)->check(api_->PJRT_DeviceDescription_Kind(&kind), "reading a device kind");
  return std::string(kind.device_kind, kind.device_kind_size);
}

const std::string& Runtime::identity() {
  if (identity_.empty()) {
    identity_ = "plugin=" + file_digest(plugin_path_) + ";api=" + std::to_string(api_major_) + "." +
                std::to_string(api_minor_) + ";platform=" + platform_name_ + " " + platform_version_;
  }
  return identity_;
}

namespace {
// A dense layout in the given dim order (PJRT_Buffer_MemoryLayout points into `minor_to_major`).
PJRT_Buffer_MemoryLayout dense_layout(const std::vector<int64_t>& minor_to_major) {
  auto layout = PJRT_ARGS(PJRT_Buffer_MemoryLayout);
  layout.type = PJRT_Buffer_MemoryLayout_Type_Tiled;
  layout.tiled = PJRT_ARGS(PJRT_Buffer_MemoryLayout_Tiled);
  layout.tiled.minor_to_major = minor_to_major.data();
  layout.tiled.minor_to_major_size = minor_to_major.size();
  return layout;
}
}  // namespace

BufferPtr Runtime::to_device(const void* data, ElementType type, const std::vector<int64_t>& dims, int device,
                             const std::vector<int64_t>* minor_to_major) {
  PJRT_Buffer_MemoryLayout layout;
  auto args = PJRT_ARGS(PJRT_Client_BufferFromHostBuffer_Args);
  if (minor_to_major) {
    layout = dense_layout(*minor_to_major);
    args.device_layout = &layout;
  }
  args.client = client_;
  args.data = data;
  args.type = to_pjrt(type);
  args.dims = dims.data();
  args.num_dims = dims.size();
  args.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
  args.device = devices_.at(device);
  check(api_->PJRT_Client_BufferFromHostBuffer(&args), "copying to the device");
  await_event(args.done_with_host_buffer, "copying to the device");
  auto buffer = std::make_shared<DeviceBuffer>(this, args.buffer, type, dims, device);
  metrics_.bytes_to_device += buffer->nbytes();
  return buffer;
}

void Runtime::to_host(const DeviceBuffer& buffer, void* dst, size_t nbytes) {
  if (nbytes == 0) return;
  // The host copy is dense row-major whatever the device layout: without a host layout PJRT copies
  // in the buffer's own dim order, and a TPU picks other orders for some shapes ((2, 5, 5) is stored
  // with dim 1 outermost), so a view read back would hold permuted elements.
  std::vector<int64_t> minor_to_major(buffer.dims().size());
  for (size_t i = 0; i < minor_to_major.size(); ++i) minor_to_major[i] = static_cast<int64_t>(minor_to_major.size() - 1 - i);
  auto layout = dense_layout(minor_to_major);
  auto args = PJRT_ARGS(PJRT_Buffer_ToHostBuffer_Args);
  args.src = buffer.raw();
  args.host_layout = &layout;
  args.dst = dst;
  args.dst_size = nbytes;
  check(api_->PJRT_Buffer_ToHostBuffer(&args), "copying to the host");
  await_event(args.event, "copying to the host");
  metrics_.bytes_to_host += static_cast<int64_t>(nbytes);
}

std::vector<int64_t> Runtime::device_layout(const DeviceBuffer& buffer) {
  auto args = PJRT_ARGS(PJRT_Buffer_GetMemoryLayout_Args);
  args.buffer = buffer.raw();
  if (PJRT_Error* error = api_->PJRT_Buffer_GetMemoryLayout(&args)) {
    take_error(error);
    return {};
  }
  if (args.layout.type != PJRT_Buffer_MemoryLayout_Type_Tiled) return {};
  return std::vector<int64_t>(args.layout.tiled.minor_to_major,
                              args.layout.tiled.minor_to_major + args.layout.tiled.minor_to_major_size);
}

void Runtime::clear_in_process_cache() {
  std::lock_guard<std::mutex> lock(compiled_mutex_);
  compiled_.clear();
}

ExecutablePtr Runtime::compile(const std::string& module_text, const std::vector<TensorType>& output_types,
                               int device) {
  const auto start = std::chrono::steady_clock::now();
  t_last_compile = CompileOutcome{};
  {
    std::lock_guard<std::mutex> lock(compiled_mutex_);
    auto it = compiled_.find(module_text);
    if (it != compiled_.end()) {
      metrics_.memory_cache_hits++;
      return it->second;  // perhaps for another device: execute() finds or makes this one's
    }
  }
  auto exe = compile_through_disk(module_text, output_types, device);  // sets the tier
  t_last_compile.ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard<std::mutex> lock(compiled_mutex_);
  compiled_.emplace(module_text, exe);
  return exe;
}

ExecutablePtr Runtime::compile_through_disk(const std::string& module_text,
                                            const std::vector<TensorType>& output_types, int device) {
  // Everything a serialized executable depends on; stored in the entry and compared on load.
  const std::string options = compile_options_for_device(device_id(device));
  const std::string key_material = identity() + "\noptions=" + hex_digest(options) + "\n" + module_text;
  std::string blob;
  switch (cache_->load(key_material, &blob)) {
    case CompileCache::LoadResult::Hit: {
      std::string refusal;
      if (auto exe = load_serialized(blob, output_types, device, &refusal)) {
        exe->module_text = module_text;  // to compile it for another device
        metrics_.disk_cache_hits++;
        t_last_compile.tier = CompileOutcome::Disk;
        return exe;
      }
      // The plugin refused the blob: drop it and compile afresh. (No C++ exception on this path:
      // after a failed load the CPU plugin's JIT can leave the unwinder's frame tables unusable.)
      std::fprintf(stderr, "torchtpu: the PJRT plugin refused a cached executable (%s); recompiling\n",
                   refusal.c_str());
      std::remove(cache_->entry_path(key_material).c_str());
      metrics_.disk_cache_rejected++;
      break;
    }
    case CompileCache::LoadResult::Rejected:
      metrics_.disk_cache_rejected++;
      break;
    case CompileCache::LoadResult::Missing:
      break;
  }
  auto exe = compile_uncached(module_text, output_types, device, options);
  exe->module_text = module_text;
  t_last_compile.tier = CompileOutcome::Compiled;
  if (cache_->enabled()) {
    const std::string blob = serialize(*exe);
    if (!blob.empty() && cache_->store(key_material, blob)) metrics_.disk_cache_writes++;
  }
  return exe;
}

ExecutablePtr Runtime::compile_portable(const std::string& module_text, const std::vector<TensorType>& output_types) {
  return compile_uncached(module_text, output_types, -1, kCompileOptions);
}

const Executable& Runtime::for_device(const Executable& exe, int device) {
  if (exe.assigned_device < 0 || exe.assigned_device == device) return exe;
  auto& mutable_exe = const_cast<Executable&>(exe);  // the variants are a cache beside it
  std::lock_guard<std::mutex> lock(mutable_exe.variants_mutex);
  auto& variant = mutable_exe.variants[device];
  if (!variant) variant = compile_through_disk(exe.module_text, exe.output_types, device);
  return *variant;
}

ExecutablePtr Runtime::compile_uncached(const std::string& module_text,
                                        const std::vector<TensorType>& output_types, int assigned_device,
                                        const std::string& options) {
  const auto start = std::chrono::steady_clock::now();
  auto program = PJRT_ARGS(PJRT_Program);
  std::string code = module_text;
  program.code = code.data();
  program.code_size = code.size();
  program.format = "mlir";
  program.format_size = 4;
  auto args = PJRT_ARGS(PJRT_Client_Compile_Args);
  args.client = client_;
  args.program = &program;
  args.compile_options = options.data();
  args.compile_options_size = options.size();
  PJRT_Error* error = api_->PJRT_Client_Compile(&args);
  if (error) {
    try {
      check(error, "compiling");
    } catch (const OutOfMemoryError&) {
      throw;  // stays an out-of-memory error (torch.OutOfMemoryError), whose text names the sizes
    } catch (const RuntimeError& e) {
      throw RuntimeError(std::string(e.what()) + "\nmodule:\n" + module_text);
    }
  }
  dump_module(module_text);
  auto exe = std::make_shared<Executable>();
  exe->loaded = args.executable;
  metrics_.live_executables++;
  exe->runtime = this;
  exe->output_types = output_types;
  exe->num_outputs = output_types.size();
  exe->assigned_device = assigned_device;
  metrics_.compiles++;
  metrics_.compile_ns +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  return exe;
}

std::string Runtime::serialize(const Executable& exe) {
  auto get = PJRT_ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
  get.loaded_executable = exe.loaded;
  check(api_->PJRT_LoadedExecutable_GetExecutable(&get), "reading an executable");
  auto args = PJRT_ARGS(PJRT_Executable_Serialize_Args);
  args.executable = get.executable;
  PJRT_Error* error = api_->PJRT_Executable_Serialize(&args);
  auto destroy = PJRT_ARGS(PJRT_Executable_Destroy_Args);
  destroy.executable = get.executable;
  api_->PJRT_Executable_Destroy(&destroy);
  if (error) {  // not cached then; no exception (see load_serialized)
    std::fprintf(stderr, "torchtpu: the PJRT plugin could not serialize an executable (%s); not cached on disk\n",
                 take_error(error).c_str());
    return std::string();
  }
  std::string blob(args.serialized_bytes, args.serialized_bytes_size);
  if (args.serialized_executable_deleter) args.serialized_executable_deleter(args.serialized_executable);
  return blob;
}

ExecutablePtr Runtime::load_serialized(const std::string& blob, const std::vector<TensorType>& output_types,
                                       int device, std::string* refusal) {
  auto args = PJRT_ARGS(PJRT_Executable_DeserializeAndLoad_Args);
  args.client = client_;
  args.serialized_executable = blob.data();
  args.serialized_executable_size = blob.size();
  if (PJRT_Error* error = api_->PJRT_Executable_DeserializeAndLoad(&args)) {
    *refusal = take_error(error);
    return nullptr;
  }
  auto exe = std::make_shared<Executable>();
  exe->loaded = args.loaded_executable;
  exe->assigned_device = device;
  metrics_.live_executables++;
  exe->runtime = this;
  exe->output_types = output_types;
  exe->num_outputs = output_types.size();
  return exe;
}

std::vector<BufferPtr> Runtime::execute(const Executable& compiled, const std::vector<PJRT_Buffer*>& args_in,
                                        int device, const std::vector<int64_t>& donated,
                                        const std::vector<BufferPtr>* owners) {
  const Executable& exe = for_device(compiled, device);
  auto options = PJRT_ARGS(PJRT_ExecuteOptions);
  // Inputs are storages other tensors may still read: only the ones the caller donates may go.
  std::vector<int64_t> keep;
  keep.reserve(args_in.size());
  for (size_t i = 0; i < args_in.size(); ++i) {
    if (std::find(donated.begin(), donated.end(), static_cast<int64_t>(i)) == donated.end()) {
      keep.push_back(static_cast<int64_t>(i));
    }
  }
  options.non_donatable_input_indices = keep.data();
  options.num_non_donatable_input_indices = keep.size();

  std::vector<PJRT_Buffer*> outputs(exe.num_outputs, nullptr);
  PJRT_Buffer* const* arg_list = args_in.data();
  PJRT_Buffer** output_list = outputs.data();
  auto args = PJRT_ARGS(PJRT_LoadedExecutable_Execute_Args);
  args.executable = exe.loaded;
  args.options = &options;
  args.argument_lists = &arg_list;
  args.num_devices = 1;
  args.num_args = args_in.size();
  args.output_lists = &output_list;
  args.execute_device = exe.assigned_device >= 0 ? nullptr : devices_.at(device);
  PJRT_Event* done = nullptr;
  args.device_complete_events = &done;
  check(api_->PJRT_LoadedExecutable_Execute(&args), "executing");
  metrics_.executions++;
  if (owners) uncount_donated(*owners, donated);

  std::vector<BufferPtr> result;
  result.reserve(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    result.push_back(std::make_shared<DeviceBuffer>(this, outputs[i], exe.output_types[i].element,
                                                    exe.output_types[i].dims, device));
  }
  if (done) {
    keep_running(done);
  } else {  // a plugin without completion events: each output's ready event stands in
    for (PJRT_Buffer* output : outputs) {
      auto ready = PJRT_ARGS(PJRT_Buffer_ReadyEvent_Args);
      ready.buffer = output;
      check(api_->PJRT_Buffer_ReadyEvent(&ready), "waiting for the device");
      keep_running(ready.event);
    }
  }
  return result;
}

void Runtime::synchronize() {
  std::vector<PJRT_Event*> running;
  {
    std::lock_guard<std::mutex> lock(running_mutex_);
    running.swap(running_);
  }
  for (size_t i = 0; i < running.size(); ++i) {
    try {
      await_event(running[i], "waiting for the device");
    } catch (...) {  // the rest are still awaited (and destroyed) by the next synchronize
      std::lock_guard<std::mutex> lock(running_mutex_);
      running_.insert(running_.end(), running.begin() + static_cast<std::ptrdiff_t>(i) + 1, running.end());
      throw;
    }
  }
}

}  // namespace torchtpu::rt
