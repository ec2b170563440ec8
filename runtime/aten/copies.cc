// Modules the runtime builds itself (copies, view reads and writes, storage growth) and the
// host <-> device copies and scalar reads PyTorch routes to the backend.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/strides.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "aten/graph.h"
#include "aten/op_trace.h"
#include "aten/spec_call.h"

namespace torchtpu {
namespace {

// A storage's contents as a parameter of a runtime module (none where it is lazy).
std::optional<rt::Value> stored(rt::Builder& b, const rt::TensorType& type, bool lazy) {
  if (lazy) return std::nullopt;
  return b.parameter(type);
}

std::mutex g_modules_mutex;
std::unordered_map<std::string, rt::ExecutablePtr> g_modules;

std::mutex g_scalars_mutex;
std::unordered_map<std::string, rt::BufferPtr> g_scalars;

// All of t's storage as a CPU tensor of t's dtype (zeros where lazy); `type`: its device buffer's type.
at::Tensor storage_on_host(const at::Tensor& t, rt::TensorType& type) {
  const TpuStorage& s = storage_of(t);
  bool lazy = false;
  type = storage_type(t, &lazy);
  at::Tensor host = at::zeros({static_cast<int64_t>(s.nbytes / t.element_size())},
                              at::TensorOptions().dtype(t.scalar_type()));
  if (!lazy) runtime().to_host(*s.buffer, host.data_ptr(), s.nbytes);
  return host;
}

void copy_eagerly(const at::Tensor& self, const at::Tensor& dst);

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (dst.numel() == 0) return dst;
  if (GraphCapture* capture = GraphCapture::active(); capture && capture->copy(self, dst)) return dst;
  TracedCall traced("copy", (is_tpu(dst) ? dst : self).device().index());
  traced.execute("tpu::copy", [&] { copy_eagerly(self, dst); });
  if (traced.recording()) {
    traced.record("aten::_copy_from " + self.device().str() + "->" + dst.device().str(),
                  describe_tensor(self) + " -> " + describe_tensor(dst));
  }
  return dst;
}

void copy_eagerly(const at::Tensor& self, const at::Tensor& dst) {
  if (is_tpu(self) && is_tpu(dst)) {
    if (self.device() != dst.device() || complex128_on_host(self) || complex128_on_host(dst)) {
      dst.copy_(self.cpu());
      return;
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
          const rt::Value src = read_for_copy(b, stored(b, src_type, src_lazy), src_type, self, dst);
          return std::vector<rt::Value>{write_tensor(b, stored(b, dst_type, dst_lazy), dst_type, src, dst)};
        },
        dst.device().index());
    storage_of(dst).buffer = out[0];
    return;
  }
  if (is_tpu(dst)) {
    write_into(dst, upload_for_copy(self, dst));
    return;
  }
  TORCH_CHECK(is_tpu(self), "torchtpu: _copy_from between ", self.device(), " and ", dst.device());
  at::Tensor host;
  if (complex128_on_host(self)) {  // the view of the storage's bytes, without a trip back to the device
    rt::TensorType type;
    host = storage_on_host(self, type).as_strided(self.sizes(), self.strides(), self.storage_offset());
  } else {
    auto buffer = read_contiguous(self, element_type(self.scalar_type()));
    host = at::empty(self.sizes(), self.options().device(c10::kCPU));
    runtime().to_host(*buffer, host.data_ptr(), host.nbytes());
  }
  dst.copy_(self.is_conj() ? host.conj() : host);  // host holds the storage's (unconjugated) values
}

}  // namespace

bool complex128_on_host(const at::Tensor& t) {
  return t.scalar_type() == at::kComplexDouble && platform_lacks_complex128();
}

rt::Value read_for_copy(rt::Builder& b, const std::optional<rt::Value>& storage, const rt::TensorType& storage_type,
                        const at::Tensor& src, const at::Tensor& dst) {
  const rt::Value value = read_tensor(b, storage, storage_type, src);
  return src.is_conj() != dst.is_conj() ? b.conj_of(value) : value;
}

rt::BufferPtr upload_for_copy(const at::Tensor& src, const at::Tensor& dst) {
  const at::Tensor values = (dst.is_conj() ? src.conj() : src).resolve_conj();
  const at::Tensor host = values.to(dst.scalar_type()).expand(dst.sizes()).contiguous();
  return runtime().to_device(host.data_ptr(), element_type(dst.scalar_type()), dst.sizes().vec(), dst.device().index());
}

namespace {

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  if (GraphCapture* capture = GraphCapture::active()) capture->refuse("reads a value on the host (.item())");
  at::Tensor host = at::empty({}, self.options().device(c10::kCPU));
  TracedCall traced("copy", self.device().index());
  traced.execute("tpu::copy", [&] {
    auto buffer = read_contiguous(self, element_type(self.scalar_type()));
    runtime().to_host(*buffer, host.data_ptr(), host.nbytes());
  });
  if (traced.recording()) traced.record("aten::_local_scalar_dense (.item())", describe_tensor(self));
  return host.item();
}

// torchtpu::upload_with_layout(Tensor self, int[] minor_to_major) -> Tensor: a tpu copy of a CPU
// tensor whose buffer has the given device layout (tests: a TPU stores some shapes in another dim
// order, and every read must still see row-major elements).
at::Tensor upload_with_layout(const at::Tensor& self, at::IntArrayRef minor_to_major) {
  const at::Tensor host = self.contiguous();
  const std::vector<int64_t> order = minor_to_major.vec();
  auto buffer = runtime().to_device(host.data_ptr(), element_type(host.scalar_type()), host.sizes().vec(),
                                    current_device(), &order);
  return wrap_buffer(buffer, host.scalar_type(), host.sizes(), host.strides(), 0, current_device());
}

// torchtpu::device_layout(Tensor self) -> int[]: the dim order (minor to major) the device stores
// the tensor's storage in ([] for a lazy storage or a plugin that does not say).
std::vector<int64_t> device_layout(const at::Tensor& self) {
  flush_fused("a host read");
  const TpuStorage& storage = storage_of(self);
  return storage.buffer ? runtime().device_layout(*storage.buffer) : std::vector<int64_t>{};
}

}  // namespace

std::vector<rt::BufferPtr> run_module(const std::string& key, const std::vector<rt::BufferPtr>& inputs,
                                      const std::function<std::vector<rt::Value>(rt::Builder&)>& build, int device) {
  rt::ExecutablePtr exe;
  {
    std::lock_guard<std::mutex> lock(g_modules_mutex);
    auto it = g_modules.find(key);
    if (it != g_modules.end()) exe = it->second;
  }
  if (!exe) {
    make_room_for_an_executable();
    exe = TracedCall::compile([&] {
      rt::Builder b;
      auto results = build(b);
      std::vector<rt::TensorType> types;
      for (const auto& r : results) types.push_back(r.type);
      return runtime().compile(b.finish(results), types, device);
    });
    std::lock_guard<std::mutex> lock(g_modules_mutex);
    g_modules.emplace(key, exe);
  }
  std::vector<PJRT_Buffer*> raw;
  for (const auto& in : inputs) raw.push_back(in->raw());
  return runtime().execute(*exe, raw, device);
}

rt::BufferPtr scalar_buffer(const c10::Scalar& value, rt::ElementType element, int device) {
  unsigned char bytes[16] = {0};
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
    case rt::ElementType::C64: { c10::complex<float> v = value.toComplexFloat(); std::memcpy(bytes, &v, 8); break; }
    case rt::ElementType::C128: { c10::complex<double> v = value.toComplexDouble(); std::memcpy(bytes, &v, 16); break; }
    case rt::ElementType::F8E4M3FN: { c10::Float8_e4m3fn v(value.toFloat()); std::memcpy(bytes, &v, 1); break; }
    case rt::ElementType::F8E5M2: { c10::Float8_e5m2 v(value.toFloat()); std::memcpy(bytes, &v, 1); break; }
    case rt::ElementType::F8E4M3FNUZ: { c10::Float8_e4m3fnuz v(value.toFloat()); std::memcpy(bytes, &v, 1); break; }
    case rt::ElementType::F8E5M2FNUZ: { c10::Float8_e5m2fnuz v(value.toFloat()); std::memcpy(bytes, &v, 1); break; }
  }
  std::string key(reinterpret_cast<const char*>(bytes), 16);
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
  if (complex128_on_host(dst)) {
    rt::TensorType type;
    at::Tensor host = storage_on_host(dst, type);
    at::Tensor value = at::empty(value_buffer->dims(), at::TensorOptions().dtype(scalar_type(value_buffer->type())));
    runtime().to_host(*value_buffer, value.data_ptr(), value.nbytes());
    host.as_strided(dst.sizes(), dst.strides(), dst.storage_offset()).copy_(value);
    storage.buffer = runtime().to_device(host.data_ptr(), type.element, type.dims, storage.device);
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
        return std::vector<rt::Value>{write_tensor(b, stored(b, st, lazy), st, v, dst)};
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
  if (complex128_on_host(src)) {
    rt::TensorType type;
    const at::Tensor view = storage_on_host(src, type)
                                .as_strided(src.sizes(), src.strides(), src.storage_offset())
                                .to(scalar_type(element))
                                .contiguous();
    return runtime().to_device(view.data_ptr(), element, src.sizes().vec(), storage.device);
  }
  bool lazy = false;
  const rt::TensorType st = storage_type(src, &lazy);
  std::vector<rt::BufferPtr> inputs;
  if (!lazy) inputs.push_back(storage.buffer);
  auto out = run_module(
      "read:" + geometry_key(src) + rt::mlir_name(element), inputs,
      [&](rt::Builder& b) {
        return std::vector<rt::Value>{b.convert(read_tensor(b, stored(b, st, lazy), st, src), element)};
      },
      storage.device);
  return out[0];
}

void clear_kernel_caches() {
  clear_spec_kernel_caches();
  clear_compiled_graphs();
  std::lock_guard<std::mutex> lock(g_modules_mutex);
  g_modules.clear();
}

void clear_in_process_caches() {
  clear_kernel_caches();
  runtime().clear_in_process_cache();
}

namespace {
std::atomic<int64_t> g_max_live_executables{rt::kMaxLiveExecutables};
}  // namespace

int64_t set_max_live_executables(int64_t count) { return g_max_live_executables.exchange(count); }

bool make_room_for_an_executable() {
  // The mappings are counted every 64th call (reading /proc/self/maps costs about a millisecond).
  static std::atomic<int64_t> calls{0};
  if (runtime().metrics().live_executables.load() < g_max_live_executables.load() &&
      (++calls % 64 != 0 || rt::process_memory_mappings() < rt::kMaxMemoryMappings)) {
    return false;
  }
  clear_in_process_caches();
  return true;
}

// PyTorch's Conjugate fallback would hand _copy_from a resolved clone of a conjugated dst (its
// schema does not mark dst as written), and the copy would be lost: copy_eagerly handles the bits.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_FRAGMENT(torchtpu, m) {
  m.def("upload_with_layout(Tensor self, int[] minor_to_major) -> Tensor", TORCH_FN(upload_with_layout));
  m.def("device_layout(Tensor self) -> int[]", TORCH_FN(device_layout));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
}

}  // namespace torchtpu
