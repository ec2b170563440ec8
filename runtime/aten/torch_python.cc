// torchtpu._C: what the Python package needs from the runtime (init, devices, metrics).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "pjrt/compile_cache.h"
#include "aten/op_spec.h"
#include "aten/op_trace.h"
#include "aten/torch_tpu.h"

namespace py = pybind11;
using torchtpu::rt::Runtime;

namespace {

void init(const std::string& plugin_path, const std::string& cache_dir) {
  if (Runtime::get_if_installed()) return;
  try {
    Runtime::install(std::make_unique<Runtime>(plugin_path, cache_dir));
  } catch (const std::exception& e) {
    torchtpu::set_init_error(e.what());
    throw std::runtime_error(e.what());
  }
}

py::dict metrics() {
  auto& m = torchtpu::runtime().metrics();
  py::dict d;
  d["executions"] = m.executions.load();
  d["live_executables"] = m.live_executables.load();
  d["compiles"] = m.compiles.load();
  d["compile_seconds"] = static_cast<double>(m.compile_ns.load()) / 1e9;
  d["memory_cache_hits"] = m.memory_cache_hits.load();
  d["disk_cache_hits"] = m.disk_cache_hits.load();
  d["disk_cache_writes"] = m.disk_cache_writes.load();
  d["disk_cache_rejected"] = m.disk_cache_rejected.load();
  d["bytes_to_device"] = m.bytes_to_device.load();
  d["bytes_to_host"] = m.bytes_to_host.load();
  d["live_buffers"] = m.live_buffers.load();
  d["live_bytes"] = m.live_bytes.load();
  d["peak_live_bytes"] = m.peak_live_bytes.load();
  d["kernel_cache_entries"] = torchtpu::kernel_cache_size();
  d["compiled_graphs"] = torchtpu::compiled_graphs();
  py::dict fallbacks;
  for (const auto& [op, count] : torchtpu::fallback_counts()) fallbacks[py::str(op)] = count;
  d["cpu_fallbacks"] = fallbacks;
  py::dict ops;
  for (const auto& [op, count] : torchtpu::spec_op_calls()) ops[py::str(op)] = count;
  d["ops"] = ops;
  return d;
}

py::list trace_stop() {
  py::list out;
  for (const auto& e : torchtpu::trace_stop()) {
    out.append(py::make_tuple(e.name, e.kind, e.shapes, e.cache, e.start_ns, e.compile_ns, e.execute_ns,
                              e.live_bytes, e.device, e.depth));
  }
  return out;
}

}  // namespace

namespace torchtpu {
void bind_distributed(py::module& m);  // distributed.cc
void bind_graph(py::module& m);        // graph.cc
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchtpu runtime bindings";
  m.def("_init", &init, py::arg("plugin_path"), py::arg("cache_dir"));
  torchtpu::bind_distributed(m);
  torchtpu::bind_graph(m);
  m.def("_set_init_error", &torchtpu::set_init_error);
  m.def("_is_initialized", [] { return Runtime::get_if_installed() != nullptr; });
  m.def("device_count", [] { return torchtpu::runtime().device_count(); });
  m.def("current_device", &torchtpu::current_device);
  m.def("set_device", &torchtpu::set_current_device);
  m.def("platform_name", [] { return torchtpu::runtime().platform_name(); });
  m.def("platform_version", [] { return torchtpu::runtime().platform_version(); });
  m.def("plugin_path", [] { return torchtpu::runtime().plugin_path(); });
  m.def("device_kind", [](int device) { return torchtpu::runtime().device_kind(device); });
  m.def("plugin_memory_stats", [](int device) {
    py::dict stats;
    const torchtpu::rt::PluginMemoryStats s = torchtpu::runtime().plugin_memory_stats(device);
    if (!s.available) return stats;
    stats["bytes_in_use"] = s.bytes_in_use;
    for (auto [key, value] : {std::pair{"peak_bytes_in_use", s.peak_bytes_in_use}, {"bytes_limit", s.bytes_limit},
                              {"largest_alloc_size", s.largest_alloc_size}}) {
      if (value >= 0) stats[key] = value;
    }
    return stats;
  });
  m.def("api_version", [] {
    auto& rt = torchtpu::runtime();
    return py::make_tuple(rt.api_major(), rt.api_minor());
  });
  m.def("cache_dir", [] { return torchtpu::runtime().cache().dir(); });
  m.def("synchronize", [] {
    py::gil_scoped_release release;
    torchtpu::flush_fused("synchronize");
    torchtpu::runtime().synchronize();
  });
  m.def("metrics", &metrics);
  m.def("_trace_start", &torchtpu::trace_start);
  m.def("_trace_stop", &trace_stop);
  m.def("_trace_now_ns", &torchtpu::trace_now_ns);
  m.def("generator_state", &torchtpu::generator_state);
  m.def("set_generator_state", &torchtpu::set_generator_state);
  m.def("reseed_randomly", &torchtpu::reseed_randomly);
  m.def("spec_overloads", [] {
    // (overload, variant, spec file:line) for every registered spec kernel.
    py::list out;
    for (const auto& spec : torchtpu::op_specs()) {
      const char* variant = spec.variant == torchtpu::Variant::Functional ? "functional"
                            : spec.variant == torchtpu::Variant::Inplace  ? "inplace"
                                                                          : "out";
      out.append(py::make_tuple(spec.overload, variant, spec.source));
    }
    return out;
  });
  m.def("set_fallback_is_error", &torchtpu::set_fallback_is_error);
  m.def("set_check_indices", &torchtpu::set_check_indices);
  m.def("set_accurate_math", &torchtpu::set_accurate_math);
  m.def("accurate_math", &torchtpu::accurate_math);
  m.def("_capture_next_execution", &torchtpu::capture_next_execution);
  m.def("_repeat_captured_execution_ns", [](int iterations) {
    py::gil_scoped_release release;
    return torchtpu::repeat_captured_execution_ns(iterations);
  });
  m.def("_set_eager_blocking", [](bool blocking) { torchtpu::g_eager_blocking = blocking; });
  m.def("_eager_blocking", [] { return torchtpu::eager_blocking(); });
  m.def("_dispatch_variants_ns", [](int iterations) {
    py::gil_scoped_release release;
    return torchtpu::dispatch_variants_ns(iterations);
  });
  m.def("_set_max_live_executables", &torchtpu::set_max_live_executables);
  m.def("clear_in_process_caches", &torchtpu::clear_in_process_caches);
}
