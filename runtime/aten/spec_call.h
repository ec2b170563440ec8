// One call of a spec'd op, in three pieces the eager kernel and graph capture share:
//   plan     the Meta pass (PyTorch's shapes, dtypes and errors) and the compute dtype;
//   emission the op into a builder: inputs from an InputSource, promotion, the spec's lowering,
//            conversion to each output's dtype, and the new contents of every storage it writes;
//   (execution is the caller's: the eager kernel compiles and runs a one-op module, a graph
//            capture keeps the values for the next node).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "aten/op_spec.h"
#include "aten/torch_meta_call.h"
#include "aten/torch_tpu.h"

namespace torchtpu {

inline bool is_tpu(const at::Tensor& t) { return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1; }
inline bool is_cpu_scalar(const at::Tensor& t) { return t.defined() && t.device().is_cpu() && t.dim() == 0; }

// Cache keys: the bytes of everything a module depends on.
struct KeyWriter {
  std::string s;
  void tag(char c) { s.push_back(c); }
  void i(int64_t v) { s.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void ints(c10::IntArrayRef v) {
    i(static_cast<int64_t>(v.size()));
    s.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
  }
  void str(const std::string& v) {
    i(static_cast<int64_t>(v.size()));
    s += v;
  }
};
// A tensor argument's view and storage; checks that every tpu tensor is on `device` (-1: the first sets it).
// `contents`: the type of the value a fused block holds for a storage with no buffer yet (keyed as
// the buffer the block will give it).
void key_tensor(KeyWriter& k, const at::Tensor& t, int& device, const rt::TensorType* contents = nullptr);
void key_attr(KeyWriter& k, const c10::IValue& v);
void key_numerics(KeyWriter& k, const rt::Numerics& n);
std::string geometry_key(const at::Tensor& t);

const char* dtype_name(at::ScalarType t);

// A result tensor as the Meta pass gave it.
struct OutputPlan {
  at::ScalarType dtype;
  std::vector<int64_t> sizes, strides;
  bool defined = true;  // false: Meta returned an undefined tensor (an output an output_mask turns off)
};

// An out= tensor the Meta pass resized: resized for real before the call is keyed again.
struct OutResize {
  int arg;
  std::vector<int64_t> sizes, strides;
};

struct CallPlan {
  std::vector<std::vector<OutputPlan>> fresh;  // per fresh (non-aliasing) return: its tensor(s)
  std::vector<bool> fresh_is_list;             // that return is a Tensor[]
  std::vector<OutputPlan> written;             // the written tensors, flattened
  std::vector<OutResize> resizes;              // non-empty: resize these outs, then key again
  at::ScalarType compute = at::kFloat;         // the dtype the lowering computes in
  // Non-empty where the spec does not list the compute dtype: why the call runs on the CPU instead.
  std::string unsupported;
};

// The Meta pass and the compute dtype (throws PyTorch's error for bad arguments; a dtype the spec
// does not list sets `unsupported`).
CallPlan plan_call(const OpSpec& spec, MetaCallFn meta, const c10::OperatorHandle& op, const c10::IValue* args);

// Resizes the out= tensors as the Meta pass did (PyTorch's resize of a wrongly sized out=).
void resize_outs(const std::vector<OutResize>& resizes, const c10::IValue* args);

// Where an op's inputs come from while it is emitted: the eager kernel makes each storage a
// parameter of a one-op module; a graph capture hands out what the graph computed for it so far.
class InputSource {
 public:
  virtual ~InputSource() = default;
  // The storage's type as a module value and its current contents (nullopt: lazy, no contents yet).
  virtual rt::TensorType storage_type(const at::Tensor& t) = 0;
  virtual std::optional<rt::Value> storage(rt::Builder& b, const at::Tensor& t, int arg, int index) = 0;
  // A CPU 0-d tensor argument, as a 0-d value of `element`.
  virtual rt::Value cpu_scalar(rt::Builder& b, const at::Tensor& t, int arg, int index, rt::ElementType element) = 0;
  // A Scalar argument (element `index` of a Scalar[], or -1) as a 0-d value of `element`.
  virtual rt::Value scalar(rt::Builder& b, const c10::IValue& v, int arg, int index, rt::ElementType element) = 0;
  // The (seed, offset) state of generator argument `arg` (-1: the device's default generator), and
  // afterwards the counter values the op's draws used.
  virtual rt::Value random_state(rt::Builder& b, const c10::IValue* args, int arg) = 0;
  virtual void random_used(uint64_t words) = 0;
};

// The elements `t` sees, in t's dtype, given its storage's contents (zeros where lazy).
rt::Value read_tensor(rt::Builder& b, const std::optional<rt::Value>& storage, const rt::TensorType& storage_type,
                      const at::Tensor& t);
// The new contents of t's storage after writing `value` (converted to t's dtype, broadcast to t's
// shape) through t. `old`: the storage's current contents, nullopt where lazy.
rt::Value write_tensor(rt::Builder& b, const std::optional<rt::Value>& old, const rt::TensorType& storage_type,
                       const rt::Value& value, const at::Tensor& t);

// A copy's source as dst receives it: src's elements read from its storage's contents, conjugated
// where the two conj bits differ (a conjugated view's storage holds the unconjugated values).
rt::Value read_for_copy(rt::Builder& b, const std::optional<rt::Value>& storage, const rt::TensorType& storage_type,
                        const at::Tensor& src, const at::Tensor& dst);
// True where the platform's complex128 cannot be compiled reliably (a TPU): calls that compute in it
// run on the CPU, and its view reads and writes move bytes through the host (copies.cc).
bool platform_lacks_complex128();
// Whether t is a complex128 tensor on such a platform: libtpu's emulated complex128 fails to compile
// layout changes (a transposed view read, the zeros of a never-written storage: layout RET_CHECKs on a
// v5e), so there its views are read, written and copied byte for byte through the host.
bool complex128_on_host(const at::Tensor& t);

// A host tensor uploaded for a copy into dst: what dst's storage takes (the values, conjugated where
// dst carries the conj bit) in dst's dtype and shape.
rt::BufferPtr upload_for_copy(const at::Tensor& src, const at::Tensor& dst);

struct EmittedCall {
  // New storage contents: one per defined fresh result tensor (a storage laid out as its plan), then
  // one per written tensor (`written_tensors` order), then for a data_dependent op its 0-d row count.
  std::vector<rt::Value> storages;
  std::vector<std::vector<OutputPlan>> fresh;  // the plan's, or for a data_dependent op the padded results
  std::vector<bool> fresh_is_list;
  bool has_count = false;
};

EmittedCall emit_call(const OpSpec& spec, rt::Builder& b, const CallPlan& plan, const c10::IValue* args,
                      InputSource& source);

// Tensor argument `arg` of a call (element `index` of a list, or -1), set into `holder`.
const at::Tensor& tensor_arg(const OpSpec& spec, const c10::IValue* args, int arg, int index, at::Tensor& holder);

// The tensors a written argument holds: itself, the elements of a list, none for an absent Tensor?.
std::vector<at::Tensor> written_tensors(const c10::IValue& v);

// How many of the fresh results are defined tensors (the module has a result for each).
size_t defined_count(const std::vector<std::vector<OutputPlan>>& fresh);

// Replaces a call's arguments on the stack by its returns: each fresh result as `make` builds it
// from its plan (in order; undefined where the plan is), each aliasing return as its argument.
void push_returns(const OpSpec& spec, const std::vector<std::vector<OutputPlan>>& fresh,
                  const std::vector<bool>& fresh_is_list, const c10::IValue* args, torch::jit::Stack* stack,
                  const std::function<at::Tensor(const OutputPlan&)>& make);

// The aliased parameters (parameter, result) a module may consume: those whose buffer nothing but
// its storage and this call's `inputs` holds, so no other tensor can still read it.
std::vector<int64_t> donatable(const std::vector<std::pair<int, int>>& aliases, const std::vector<rt::BufferPtr>& inputs);

// Tensor?[] indices as PyTorch's expandTensors: bool masks become nonzero() columns (synchronizes).
c10::IValue expand_indices(const c10::IValue& v, const at::Tensor& self);

}  // namespace torchtpu
