// The "tpu" c10d backend's C++ face: a c10d::Backend whose collectives call a Python transport
// (torchtpu/distributed.py). ProcessGroup dispatches c10d ops on tpu tensors (from Python, DDP's
// reducer, functional collectives) to the backend registered for PrivateUse1, so every caller
// reaches the same transport. PyTorch lets Python subclass ProcessGroup but not Backend, hence this
// trampoline.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace torchtpu {
namespace {

// A collective the transport finished before returning: waiting is free and the future holds
// the tensors the collective wrote.
class FinishedWork final : public c10d::Work {
 public:
  FinishedWork(c10d::OpType type, std::vector<at::Tensor> outputs)
      : Work(-1, type),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
    future_->markCompleted(c10::IValue(std::move(outputs)));
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> all;
  for (const auto& list : lists) all.insert(all.end(), list.begin(), list.end());
  return all;
}

bool python_is_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

int reduce_op(const c10d::ReduceOp& op) {
  TORCH_CHECK(op.op_ != c10d::ReduceOp::PREMUL_SUM, "torchtpu: the tpu backend does not take PREMUL_SUM");
  return static_cast<int>(op.op_);
}

class PythonTransportBackend final : public c10d::Backend {
 public:
  PythonTransportBackend(int rank, int size, py::object transport)
      : Backend(rank, size), transport_(std::move(transport)) {}

  ~PythonTransportBackend() override {
    // A process that never destroyed its group drops the backend while or after Python finalizes:
    // the transport is left to the OS then. (Taking the GIL on another thread during finalization
    // ends that thread by a forced unwind, which a destructor turns into std::terminate.)
    if (!Py_IsInitialized() || python_is_finalizing()) {
      transport_.release();
      return;
    }
    py::gil_scoped_acquire gil;
    transport_ = py::object();
  }

  const std::string getBackendName() const override { return "tpu"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& o) override {
    return call(c10d::OpType::BROADCAST, tensors, "broadcast", tensors, o.rootRank);
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& o) override {
    return call(c10d::OpType::ALLREDUCE, tensors, "allreduce", tensors, reduce_op(o.reduceOp));
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& o) override {
    return call(c10d::OpType::ALLREDUCE_COALESCED, tensors, "allreduce", tensors, reduce_op(o.reduceOp));
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& o) override {
    return call(c10d::OpType::REDUCE, tensors, "reduce", tensors, o.rootRank, reduce_op(o.reduceOp));
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    return call(c10d::OpType::ALLGATHER, flat(outputs), "allgather", outputs, inputs);
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    return call(c10d::OpType::_ALLGATHER_BASE, {output}, "allgather_into_tensor", std::vector<at::Tensor>{output},
                std::vector<at::Tensor>{input});
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions&) override {
    return call(c10d::OpType::ALLGATHER_COALESCED, flat(outputs), "allgather", outputs, inputs);
  }
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions&) override {
    return call(c10d::OpType::COALESCED, outputs, "allgather_into_tensor", outputs, inputs);
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& o) override {
    return call(c10d::OpType::GATHER, flat(outputs), "gather", outputs, inputs, o.rootRank);
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& o) override {
    return call(c10d::OpType::SCATTER, outputs, "scatter", outputs, inputs, o.rootRank);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& o) override {
    return call(c10d::OpType::REDUCE_SCATTER, outputs, "reduce_scatter", outputs, inputs, reduce_op(o.reduceOp));
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& o) override {
    return call(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, "reduce_scatter_tensor", std::vector<at::Tensor>{output},
                std::vector<at::Tensor>{input}, reduce_op(o.reduceOp));
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& o) override {
    return call(c10d::OpType::COALESCED, outputs, "reduce_scatter_tensor", outputs, inputs, reduce_op(o.reduceOp));
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits, const c10d::AllToAllOptions&) override {
    return call(c10d::OpType::ALLTOALL_BASE, {output}, "alltoall_base", output, input, output_splits, input_splits);
  }
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
    return call(c10d::OpType::ALLTOALL, outputs, "alltoall", outputs, inputs);
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return call(c10d::OpType::SEND, {}, "send", tensors, dst, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return call(c10d::OpType::RECV, tensors, "recv", tensors, src, tag);
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    return call(c10d::OpType::RECVANYSOURCE, tensors, "recv", tensors, -1, tag);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return call(c10d::OpType::BARRIER, {}, "barrier");
  }

 private:
  // Runs transport.<method>(args...) with the GIL (DDP's reducer calls from autograd threads).
  template <typename... Args>
  c10::intrusive_ptr<c10d::Work> call(c10d::OpType type, std::vector<at::Tensor> outputs, const char* method,
                                      Args&&... args) {
    {
      py::gil_scoped_acquire gil;
      transport_.attr(method)(std::forward<Args>(args)...);
    }
    return c10::make_intrusive<FinishedWork>(type, std::move(outputs));
  }

  py::object transport_;
};

}  // namespace

// torchtpu._C._tpu_backend(rank, size, transport) -> torch.distributed.Backend
void bind_distributed(py::module& m) {
  m.def("_tpu_backend", [](int rank, int size, py::object transport) -> c10::intrusive_ptr<c10d::Backend> {
    return c10::make_intrusive<PythonTransportBackend>(rank, size, std::move(transport));
  });
}

}  // namespace torchtpu
