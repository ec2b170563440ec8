// Graph mode: while a graph is captured on this thread, every spec'd call, device copy and view
// is emitted into ONE module (by the same emission the eager kernel uses) instead of running; the
// module then runs as one executable per call of the compiled graph. Fused eager mode records ops
// through the same machinery into a pending block, run as one module when something needs its values.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <string>

#include "aten/op_spec.h"
#include "aten/spec_call.h"
#include "aten/torch_meta_call.h"
#include "aten/torch_tpu.h"

namespace torchtpu {

class GraphCapture {
 public:
  virtual ~GraphCapture() = default;
  // This thread's capture, else the fused eager block (fused mode), or null.
  static GraphCapture* active();

  // A spec'd op: planned and emitted into the graph; its results are tensors whose storages hold
  // graph values (the stack gets them as the kernel would return them). `planned`: the kernel's
  // cached plan of an identical call (null: the Meta pass runs), `planned_key` its key (the op's
  // arguments' metadata and attributes). False: not recorded (the fused block ran what it held
  // first): the caller runs the op eagerly.
  virtual bool call(const OpSpec& spec, MetaCallFn meta, const c10::OperatorHandle& op, c10::IValue* args,
                    torch::jit::Stack* stack, const CallPlan* planned = nullptr,
                    const std::string* planned_key = nullptr) = 0;
  // Whether calls recur (fused eager mode), so that the kernel's cached plans are worth handing in.
  virtual bool records_repeatedly() const { return false; }
  virtual bool copy(const at::Tensor& src, const at::Tensor& dst) = 0;  // false as call()
  // Something that cannot be part of a graph (a host read, an op without a spec): a graph throws
  // the error that makes it split around the op being captured; the fused block runs what it holds
  // and returns, and the caller goes on eagerly.
  virtual void refuse(const std::string& what) = 0;
  // Whether the storage holds a value of the graph (not a buffer).
  virtual bool holds(const TpuStorage& storage) const = 0;
};

// The checks a call makes of its values before it runs (integer division by
// zero; TORCHTPU_CHECK_INDICES): the eager kernel's and the fused block's (spec_kernel.cc).
void check_call_values(const OpSpec& spec, at::ScalarType compute, const c10::IValue* args);

}  // namespace torchtpu
