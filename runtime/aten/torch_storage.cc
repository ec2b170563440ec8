// tpu storages, the allocator, the device guard and the metadata-only ops (views, empty, resize_).
#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/strides.h>
#include <torch/library.h>
#include <ATen/ops/set_native.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>

#include "aten/graph.h"
#include "aten/spec_call.h"
#include "aten/torch_tpu.h"

namespace torchtpu {
namespace {

thread_local int g_current_device = 0;
std::string g_init_error = "torchtpu: the runtime was not initialized (import torchtpu first)";

void delete_storage(void* ctx) { delete static_cast<TpuStorage*>(ctx); }

// A DeviceAllocator so torch.accelerator's memory functions (and torch.tpu's, built on them)
// report the runtime's per-device counts. Nothing is cached: a PJRT buffer is made when a storage
// is first written and freed when its last owner lets go.
struct TpuAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    auto* storage = new TpuStorage{nbytes, current_device(), nullptr};
    // The data pointer is the handle itself: unique, never dereferenced as memory.
    return {storage, storage, &delete_storage, c10::Device(c10::DeviceType::PrivateUse1, storage->device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_storage; }
  void copy_data(void*, const void*, std::size_t) const override {
    TORCH_CHECK(false, "torchtpu: tpu storages are not host memory and cannot be copied bytewise");
  }
  bool initialized() override { return rt::Runtime::get_if_installed() != nullptr; }
  void emptyCache(c10::MempoolId_t) override {}                  // nothing is cached
  void recordStream(const c10::DataPtr&, c10::Stream) override {}  // one ordered queue per device
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    const rt::DeviceMemory& m = memory(device);
    const auto fill = [](c10::CachingDeviceAllocator::StatArray& stat, const std::atomic<int64_t>& current,
                         const std::atomic<int64_t>& peak, const std::atomic<int64_t>& made,
                         const std::atomic<int64_t>& freed) {
      auto& all = stat[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)];
      all.current = current.load();
      all.peak = peak.load();
      all.allocated = made.load();
      all.freed = freed.load();
    };
    c10::CachingDeviceAllocator::DeviceStats stats;
    for (auto* bytes : {&stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes, &stats.requested_bytes}) {
      fill(*bytes, m.live_bytes, m.peak_bytes, m.allocated_bytes, m.freed_bytes);
    }
    for (auto* count : {&stats.allocation, &stats.active, &stats.segment}) {
      fill(*count, m.live_buffers, m.peak_buffers, m.allocations, m.frees);
    }
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override { memory(device).reset_totals(); }
  void resetPeakStats(c10::DeviceIndex device) override { memory(device).reset_peaks(); }

 private:
  static rt::DeviceMemory& memory(c10::DeviceIndex device) {
    rt::Runtime& rt = runtime();
    if (device < 0) device = static_cast<c10::DeviceIndex>(current_device());
    TORCH_CHECK_INDEX(device < rt.device_count(), "Invalid device argument ", static_cast<int>(device),
                      ": did you call init?");
    return rt.device_memory(device);
  }
};

TpuAllocator g_allocator;

std::string gib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  return text;
}

struct TpuGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    if (d.index() >= 0) g_current_device = d.index();
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(c10::DeviceType::PrivateUse1, g_current_device); }
  void setDevice(c10::Device d) const override {
    if (d.index() >= 0) g_current_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0) g_current_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const override { return c10::Stream(c10::Stream::DEFAULT, s.device()); }
  c10::DeviceIndex deviceCount() const noexcept override {
    auto* rt = rt::Runtime::get_if_installed();
    return rt ? static_cast<c10::DeviceIndex>(rt->device_count()) : 0;
  }
  // A device has one ordered PJRT queue: every stream is that queue, so events between streams
  // need not wait for anything, and waiting for a stream or event waits for the device.
  c10::Stream getNewStream(c10::Device d, int priority) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override { runtime().synchronize(); }
  void synchronizeEvent(void*) const override { runtime().synchronize(); }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  void synchronizeDevice(const c10::DeviceIndex) const override { runtime().synchronize(); }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuard);

void resize_storage(const c10::Storage& handle, size_t nbytes);

// Host memory for `pin_memory=True` and the staging of `non_blocking` copies to the CPU. PJRT
// copies between host and device from any host address (the CPU plugin has nothing to pin), so
// "pinned" here means only what PyTorch asks of it: page-aligned host memory this allocator made,
// which is_pinned() recognises by address. Copies from it are no faster than from other memory.
struct PinnedHostAllocator final : c10::Allocator {
  static constexpr size_t kAlignment = 4096;

  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return {nullptr, nullptr, &release, c10::Device(c10::DeviceType::CPU)};
    void* data = std::aligned_alloc(kAlignment, (nbytes + kAlignment - 1) / kAlignment * kAlignment);
    TORCH_CHECK(data != nullptr, "torchtpu: could not allocate ", nbytes, " bytes of pinned host memory");
    {
      const std::lock_guard<std::mutex> lock(mutex());
      blocks()[reinterpret_cast<uintptr_t>(data)] = nbytes;
    }
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // Whether `data` lies inside a block this allocator made.
  static bool owns(const void* data) {
    const auto address = reinterpret_cast<uintptr_t>(data);
    const std::lock_guard<std::mutex> lock(mutex());
    auto it = blocks().upper_bound(address);
    if (it == blocks().begin()) return false;
    --it;
    return address < it->first + std::max<size_t>(it->second, 1);
  }

 private:
  static void release(void* data) {
    if (data == nullptr) return;
    {
      const std::lock_guard<std::mutex> lock(mutex());
      blocks().erase(reinterpret_cast<uintptr_t>(data));
    }
    std::free(data);
  }
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<uintptr_t, size_t>& blocks() {  // start address -> size
    static std::map<uintptr_t, size_t> b;
    return b;
  }
};

PinnedHostAllocator g_pinned_allocator;

struct TpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return rt::Runtime::get_if_installed() != nullptr; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override {
    return default_tpu_generator(device < 0 ? current_device() : device);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device) const override { return new_tpu_generator(device); }
  at::Device getDeviceFromPtr(void* data) const override {
    return c10::Device(c10::DeviceType::PrivateUse1, static_cast<TpuStorage*>(data)->device);
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  bool isPinnedPtr(const void* data) const override { return PinnedHostAllocator::owns(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage(storage, newsize);
  }
};

bool register_hooks() {
  at::RegisterPrivateUse1HooksInterface(new TpuHooks());
  c10::SetAllocator(c10::DeviceType::PrivateUse1, &g_allocator);
  return true;
}
const bool g_hooks_registered = register_hooks();

// --- metadata-only ops ------------------------------------------------------------------------

at::Tensor empty_memory_format(at::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory, std::optional<at::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(device.value_or(c10::Device(c10::DeviceType::PrivateUse1, current_device())));
  return at::detail::empty_generic(size, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(at::IntArrayRef size, at::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> pin_memory) {
  const c10::DeviceGuard guard(device.value_or(c10::Device(c10::DeviceType::PrivateUse1, current_device())));
  return at::detail::empty_strided_generic(size, stride, &g_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

// Sets the storage's size to `nbytes`, keeping the contents that fit (PyTorch's resize_
// semantics; new bytes read as zeros). Size 0 frees the buffer: FSDP2 frees unsharded parameters
// by resizing their storages to 0 and regrows them before all-gathering into them.
void resize_storage(const c10::Storage& handle, size_t nbytes) {
  c10::StorageImpl* impl = handle.unsafeGetStorageImpl();
  auto& storage = *static_cast<TpuStorage*>(handle.data_ptr().get_context());
  if (nbytes == storage.nbytes) return;
  if (GraphCapture* capture = GraphCapture::active(); capture && capture->holds(storage)) {
    capture->refuse("resizes a storage the graph computes");
  }
  if (nbytes == 0) {
    storage.buffer.reset();
  } else if (storage.buffer) {
    rt::BufferPtr old = storage.buffer;
    const rt::ElementType element = old->type();
    const int64_t new_numel = (static_cast<int64_t>(nbytes) + rt::element_size(element) - 1) / rt::element_size(element);
    std::string dims;
    for (int64_t d : old->dims()) dims += std::to_string(d) + ",";
    auto resized = run_module(
        std::string("resize:") + rt::mlir_name(element) + ":" + dims + ":" + std::to_string(new_numel), {old},
        [&](rt::Builder& b) {
          rt::Value flat = b.reshape(b.parameter(rt::TensorType{element, old->dims()}), {old->numel()});
          if (new_numel <= old->numel()) return std::vector<rt::Value>{b.slice(flat, {0}, {new_numel}, {1})};
          rt::Value zeros = b.full(0, rt::TensorType{element, {new_numel - old->numel()}});
          return std::vector<rt::Value>{b.concatenate({flat, zeros}, 0)};
        },
        storage.device);
    storage.buffer = resized[0];
  }
  storage.nbytes = nbytes;
  impl->set_nbytes(nbytes);
}

void grow_storage(const at::Tensor& self, size_t nbytes) {
  if (nbytes > storage_of(self).nbytes) resize_storage(self.storage(), nbytes);
}

const at::Tensor& resize_(const at::Tensor& self, at::IntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  // Same sizes: a no-op that keeps the strides (PyTorch's resize_; views written back by the
  // CPU fallback rely on it).
  if (self.sizes() == size && !memory_format.has_value()) return self;
  auto* impl = self.unsafeGetTensorImpl();
  const int64_t old_numel = self.numel();
  impl->set_sizes_contiguous(size);
  const auto format = memory_format.value_or(at::MemoryFormat::Contiguous);
  if (format != at::MemoryFormat::Preserve) impl->empty_tensor_restride(format);
  if (self.numel() > 0 || old_numel > 0) {
    const size_t needed =
        at::detail::computeStorageNbytes(self.sizes(), self.strides(), self.dtype().itemsize(), self.storage_offset());
    grow_storage(self, needed);
  }
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t offset, at::IntArrayRef size,
                        at::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == c10::DeviceType::PrivateUse1,
              "Attempted to set the storage of a tpu tensor to a storage on ", source.device());
  const auto strides = stride.empty() ? c10::contiguous_strides(size) : c10::DimVector(stride.begin(), stride.end());
  const size_t needed = at::detail::computeStorageNbytes(size, strides, self.dtype().itemsize(), offset);
  TORCH_CHECK(size.empty() || c10::multiply_integers(size) == 0 || needed <= source.nbytes(),
              "setStorage: sizes ", size, ", strides ", c10::IntArrayRef(strides), ", storage offset ", offset,
              ", and itemsize ", self.dtype().itemsize(), " requiring a storage size of ", needed,
              " are out of bounds for storage of size ", source.nbytes());
  self.unsafeGetTensorImpl()->set_storage_keep_dtype(std::move(source));
  self.unsafeGetTensorImpl()->set_sizes_and_strides(size, strides, offset);
  return self;
}

}  // namespace

TpuStorage& storage_of(const at::Tensor& t) { return storage_of(t.storage()); }

TpuStorage& storage_of(const c10::Storage& s) {
  auto* ctx = static_cast<TpuStorage*>(s.data_ptr().get_context());
  TORCH_CHECK(ctx != nullptr && s.device_type() == c10::DeviceType::PrivateUse1,
              "torchtpu: expected a tpu storage, got one on ", s.device());
  return *ctx;
}

uint64_t next_storage_serial() {
  static std::atomic<uint64_t> serial{1};
  return serial.fetch_add(1, std::memory_order_relaxed);
}

at::Tensor wrap_buffer(rt::BufferPtr buffer, at::ScalarType dtype, at::IntArrayRef sizes, at::IntArrayRef strides,
                       int64_t offset, int device) {
  const size_t nbytes = static_cast<size_t>(buffer->nbytes());
  auto* storage = new TpuStorage{nbytes, device, std::move(buffer)};
  c10::DataPtr data(storage, storage, &delete_storage, c10::Device(c10::DeviceType::PrivateUse1, device));
  c10::Storage s(c10::Storage::use_byte_size_t(), nbytes, std::move(data), &g_allocator, /*resizable=*/true);
  return tensor_on_storage(s, dtype, sizes, strides, offset);
}

at::Tensor tensor_on_storage(const c10::Storage& storage, at::ScalarType dtype, at::IntArrayRef sizes,
                             at::IntArrayRef strides, int64_t offset) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage),
                                                    c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                    c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  return t;
}

rt::ViewGeometry geometry_of(const at::Tensor& t) {
  return rt::ViewGeometry{t.sizes().vec(), t.strides().vec(), t.storage_offset()};
}

rt::TensorType storage_type(const at::Tensor& t, bool* lazy) {
  const TpuStorage& s = storage_of(t);
  *lazy = s.buffer == nullptr;
  if (s.buffer) return rt::TensorType{s.buffer->type(), s.buffer->dims()};
  const int64_t itemsize = static_cast<int64_t>(t.dtype().itemsize());
  // A storage exactly covered by a contiguous tensor takes its shape, as an upload of it would: a
  // flat buffer read or written in the tensor's shape is a relayout on a TPU (tiles are 2-D).
  if (t.storage_offset() == 0 && t.is_contiguous() && t.numel() * itemsize == static_cast<int64_t>(s.nbytes)) {
    return rt::TensorType{element_type(t.scalar_type()), t.sizes().vec()};
  }
  return rt::TensorType{element_type(t.scalar_type()), {static_cast<int64_t>(s.nbytes) / itemsize}};
}

int current_device() { return g_current_device; }
void set_current_device(int device) { g_current_device = device; }

rt::Runtime& runtime() {
  auto* rt = rt::Runtime::get_if_installed();
  TORCH_CHECK(rt != nullptr, g_init_error);
  return *rt;
}

void set_init_error(const std::string& message) { g_init_error = message; }

namespace {
std::atomic<bool> g_accurate_math{true};
}

void set_accurate_math(bool accurate) { g_accurate_math = accurate; }
bool accurate_math() { return g_accurate_math.load(std::memory_order_relaxed); }

rt::Numerics current_numerics() {
  rt::Numerics n;
  switch (at::globalContext().float32MatmulPrecision()) {
    case at::Float32MatmulPrecision::HIGHEST: n.matmul = rt::MatmulPrecision::Highest; break;
    case at::Float32MatmulPrecision::HIGH: n.matmul = rt::MatmulPrecision::High; break;
    case at::Float32MatmulPrecision::MEDIUM: n.matmul = rt::MatmulPrecision::Default; break;
  }
  n.accurate_math = accurate_math();
  return n;
}

void key_numerics(KeyWriter& k, const rt::Numerics& n) {
  k.tag(static_cast<char>('0' + static_cast<int>(n.matmul) * 2 + (n.accurate_math ? 1 : 0)));
}

rt::ElementType element_type(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBool: return rt::ElementType::Pred;
    case at::kChar: return rt::ElementType::S8;
    case at::kShort: return rt::ElementType::S16;
    case at::kInt: return rt::ElementType::S32;
    case at::kLong: return rt::ElementType::S64;
    case at::kByte: return rt::ElementType::U8;
    case at::kUInt16: return rt::ElementType::U16;
    case at::kUInt32: return rt::ElementType::U32;
    case at::kUInt64: return rt::ElementType::U64;
    case at::kHalf: return rt::ElementType::F16;
    case at::kBFloat16: return rt::ElementType::BF16;
    case at::kFloat: return rt::ElementType::F32;
    case at::kDouble: return rt::ElementType::F64;
    case at::kComplexFloat: return rt::ElementType::C64;
    case at::kComplexDouble: return rt::ElementType::C128;
    case at::kFloat8_e4m3fn: return rt::ElementType::F8E4M3FN;
    case at::kFloat8_e5m2: return rt::ElementType::F8E5M2;
    case at::kFloat8_e4m3fnuz: return rt::ElementType::F8E4M3FNUZ;
    case at::kFloat8_e5m2fnuz: return rt::ElementType::F8E5M2FNUZ;
    case at::kComplexHalf:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "torchtpu: dtype ", dtype,
                                  " (complex32) is not supported on tpu: XLA has no complex type with float16 parts; "
                                  "use torch.complex64");
    default: TORCH_CHECK_NOT_IMPLEMENTED(false, "torchtpu: dtype ", dtype, " is not supported on tpu");
  }
}

at::ScalarType scalar_type(rt::ElementType element) {
  switch (element) {
    case rt::ElementType::Pred: return at::kBool;
    case rt::ElementType::S8: return at::kChar;
    case rt::ElementType::S16: return at::kShort;
    case rt::ElementType::S32: return at::kInt;
    case rt::ElementType::S64: return at::kLong;
    case rt::ElementType::U8: return at::kByte;
    case rt::ElementType::U16: return at::kUInt16;
    case rt::ElementType::U32: return at::kUInt32;
    case rt::ElementType::U64: return at::kUInt64;
    case rt::ElementType::F16: return at::kHalf;
    case rt::ElementType::BF16: return at::kBFloat16;
    case rt::ElementType::F32: return at::kFloat;
    case rt::ElementType::F64: return at::kDouble;
    case rt::ElementType::C64: return at::kComplexFloat;
    case rt::ElementType::C128: return at::kComplexDouble;
    case rt::ElementType::F8E4M3FN: return at::kFloat8_e4m3fn;
    case rt::ElementType::F8E5M2: return at::kFloat8_e5m2;
    case rt::ElementType::F8E4M3FNUZ: return at::kFloat8_e4m3fnuz;
    case rt::ElementType::F8E5M2FNUZ: return at::kFloat8_e5m2fnuz;
  }
  return at::kFloat;
}

// A storage never written reads as zeros (the storage model), so zeros are empty tensors: nothing
// runs until a module reads them (AOT's zero tangents, optimizer state, gradient buffers).
at::Tensor zeros(at::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                 std::optional<at::Device> device, std::optional<bool> pin_memory) {
  return empty_memory_format(size, dtype, layout, device, pin_memory, std::nullopt);
}

// self's options with those given replacing them.
at::TensorOptions options_like(const at::Tensor& self, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory) {
  return self.options().merge_in(
      at::TensorOptions().dtype(dtype).layout(layout).device(device).pinned_memory(pin_memory));
}

at::Tensor fresh_zeros(at::Tensor fresh) {
  if (fresh.device().type() != c10::DeviceType::PrivateUse1) fresh.zero_();  // asked for another device
  return fresh;
}

at::Tensor zeros_like(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                      std::optional<at::Device> device, std::optional<bool> pin_memory,
                      std::optional<at::MemoryFormat> memory_format) {
  const auto options = options_like(self, dtype, layout, device, pin_memory);
  return fresh_zeros(at::empty_like(self, options, memory_format));
}

at::Tensor new_zeros(const at::Tensor& self, at::IntArrayRef size, std::optional<at::ScalarType> dtype,
                     std::optional<at::Layout> layout, std::optional<at::Device> device,
                     std::optional<bool> pin_memory) {
  const auto options = options_like(self, dtype, layout, device, pin_memory);
  return fresh_zeros(at::empty(size, options));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("zeros", TORCH_FN(zeros));
  m.impl("zeros_like", TORCH_FN(zeros_like));
  m.impl("new_zeros", TORCH_FN(new_zeros));
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  // A complex tensor seen as (real, imaginary) float pairs and back: views over the same storage,
  // read and written through the storage's bytes (spec_emit's read_tensor / write_tensor).
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));  // a view (sizes and strides over the same storage)
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage));
  m.impl("set_.source_Storage", TORCH_FN(at::native::set_));
  m.impl("set_.source_Tensor", TORCH_FN(at::native::set_tensor_));
}


void raise_out_of_memory(const rt::OutOfMemoryError& error) {
  rt::Runtime& rt = runtime();
  const int device = current_device();
  const rt::DeviceMemory& held = rt.device_memory(device);
  const rt::PluginMemoryStats plugin = rt.plugin_memory_stats(device);
  std::string limit = plugin.bytes_limit >= 0 ? " of " + gib(plugin.bytes_limit) : "";
  std::string in_use = plugin.available ? "; the device has " + gib(plugin.bytes_in_use) + limit +
                                              " in use (tensors and XLA's temporaries)" : "";
  std::string cause = error.what();
  while (!cause.empty() && cause.back() == '.') cause.pop_back();
  TORCH_CHECK_WITH(OutOfMemoryError, false, "TPU out of memory on tpu:", device, ". ", cause,
                   ". Tensors hold ", gib(held.live_bytes.load()), " in ", held.live_buffers.load(),
                   " buffers on tpu:", device, " (peak ", gib(held.peak_bytes.load()), ")", in_use,
                   ". torch.tpu.memory_summary() shows what is held; free tensors or use smaller batches.");
}

}  // namespace torchtpu
