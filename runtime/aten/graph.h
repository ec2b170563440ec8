// Graph mode: while a graph is captured on this thread, every spec'd call, device copy and view
// is emitted into ONE module (by the same emission the eager kernel uses) instead of running; the
// module then runs as one executable per call of the compiled graph.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <string>

#include "aten/op_spec.h"
#include "aten/torch_meta_call.h"
#include "aten/torch_tpu.h"

namespace torchtpu {

class GraphCapture {
 public:
  virtual ~GraphCapture() = default;
  static GraphCapture* active();  // this thread's capture, or null

  // A spec'd op: planned and emitted into the graph; its results are tensors whose storages hold
  // graph values (the stack gets them as the kernel would return them).
  virtual void call(const OpSpec& spec, MetaCallFn meta, const c10::OperatorHandle& op, c10::IValue* args,
                    torch::jit::Stack* stack) = 0;
  virtual void copy(const at::Tensor& src, const at::Tensor& dst) = 0;
  // Something that cannot be part of a graph (a host read, an op without a spec): throws the
  // error that makes the graph split around the op being captured.
  [[noreturn]] virtual void refuse(const std::string& what) = 0;
  // Whether the storage holds a value of the graph (not a buffer).
  virtual bool holds(const TpuStorage& storage) const = 0;
};

}  // namespace torchtpu
