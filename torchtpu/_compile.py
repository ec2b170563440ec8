"""Graph mode: `torch.compile(model, backend="tpu")`.

Dynamo hands the backend an FX graph; AOTAutograd turns it into functional forward and backward
graphs (decomposing only ops that have no spec). Each of those graphs is *captured* on its first
call: it runs once on the real inputs with a capture active in the runtime, so every node goes
through the spec kernel exactly as in eager mode, which emits it into one shared StableHLO module
instead of running it (runtime/aten/graph.cc). Later calls with inputs of the same layout run that
module as one executable; inputs the graph mutates get their storages' new contents (donated
buffers). An op that cannot be captured (no spec, a data-dependent shape, a host read) splits the
graph: the parts around it are captured, it runs eagerly (warned once, counted).
"""

from __future__ import annotations

import itertools
import operator
import threading
import warnings
from collections import Counter

import torch
import torch._dynamo
import torch.fx

import torchtpu

_REFUSAL = "torchtpu-graph-split: "

_families = itertools.count(1)
_lock = threading.Lock()
# What graph mode did, for torchtpu.debug.metrics()["graph"].
_stats = {"graphs": 0, "captures": 0, "recompiles": 0, "executions": 0}
_recompile_reasons: list[str] = []
_splits: Counter = Counter()
_warned_splits: set = set()


def stats() -> dict:
    with _lock:
        return {**_stats, "recompile_reasons": list(_recompile_reasons), "splits": dict(_splits)}


def _count(key: str, n: int = 1) -> None:
    with _lock:
        _stats[key] += n


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    return repr(value)


class _CapturedGraph(torch.nn.Module):
    """An FX graph run as one module per layout of its inputs.

    Non-tensor inputs (SymInts dynamo passes for dynamic sizes, Python numbers) are specialised:
    each distinct tuple of them is a family of its own, captured with those values. Tensor inputs
    key the compiled module by their dtypes, shapes, strides and storages (in C++)."""

    def __init__(self, gm: torch.fx.GraphModule, name: str):
        super().__init__()
        self.gm = gm
        self.name = name
        self._families: dict[tuple, int] = {}  # non-tensor inputs -> family
        self._outputs: dict[int, list] = {}  # captured graph id -> its outputs: tensor slots and values
        self._layouts: dict[int, list[str]] = {}  # family -> the last captured inputs, for recompile reasons
        self._split: torch.fx.GraphModule | None = None  # set once a node refused to be captured
        # A graph returning one value (not a tuple) returns it bare, as split_module's parts do.
        output = next(n for n in gm.graph.nodes if n.op == "output")
        self._bare_output = not isinstance(output.args[0], (tuple, list))
        _count("graphs")
        host = _scalar_math_on_device(gm, _host_nodes(gm))
        if host:
            self._split = _split_around(gm, host, name)

    def forward(self, *args):
        if self._split is not None:
            return self._split(*args)
        statics = tuple(None if isinstance(a, torch.Tensor) else a for a in args)
        tensors = [a if isinstance(a, torch.Tensor) else None for a in args]
        family = self._families.get(statics)
        if family is None:
            family = self._families.setdefault(statics, next(_families))
        graph, outputs = torchtpu._C._graph_run(family, tensors)
        if not graph:
            if not self._capture(family, args, tensors):
                return self._split(*args)
            graph, outputs = torchtpu._C._graph_run(family, tensors)
            assert graph, "torchtpu: a graph captured for these inputs did not run"
        _count("executions")
        results = self._assemble(self._outputs[graph], outputs)
        return results[0] if self._bare_output else results

    @staticmethod
    def _assemble(layout: list, tensors: list) -> list:
        it = iter(tensors)
        return [next(it) if kind == "tensor" else value for kind, value in layout]

    def _capture(self, family: int, args: tuple, tensors: list) -> bool:
        """Captures and compiles the graph for these inputs; False if a node refused (the graph
        is split around it instead)."""
        layout = [_describe(a) for a in args]
        previous = self._layouts.get(family)
        if previous is not None or len(self._families) > 1:
            reason = self._recompile_reason(previous, layout)
            with _lock:
                _stats["recompiles"] += 1
                _recompile_reasons.append(f"{self.name}: {reason}")
        self._layouts[family] = layout
        aliases = torch.ops.torchtpu.graph_capture_begin(family, tensors)
        inputs = [alias if isinstance(a, torch.Tensor) else a for a, alias in zip(args, aliases)]
        runner = _NodeRunner(self.gm)
        try:
            with torch.no_grad():
                outputs = runner.run(*inputs)
            if self._bare_output:
                outputs = [outputs]
            out_tensors = [o for o in outputs if isinstance(o, torch.Tensor)]
            graph = torch.ops.torchtpu.graph_capture_end(out_tensors)
        except Exception as e:
            torch.ops.torchtpu.graph_capture_abort()
            if _REFUSAL not in str(e) or runner.node is None:
                raise
            self._split_at(runner.node, str(e).split(_REFUSAL, 1)[1].splitlines()[0])
            return False
        # Non-tensor outputs (sizes for the backward graph) belong to this capture's input shapes.
        self._outputs[graph] = [("tensor", None) if isinstance(o, torch.Tensor) else ("value", o) for o in outputs]
        _count("captures")
        return True

    @staticmethod
    def _recompile_reason(previous: list[str] | None, layout: list[str]) -> str:
        if previous is None:
            return f"new non-tensor inputs ({', '.join(layout)})"
        changes = [f"input {i}: {a} -> {b}" for i, (a, b) in enumerate(zip(previous, layout)) if a != b]
        return "; ".join(changes) or "input strides or storages changed"

    def _split_at(self, node: torch.fx.Node, why: str) -> None:
        op = str(node.target)
        with _lock:
            _splits[op] += 1
            first = op not in _warned_splits
            _warned_splits.add(op)
        if first:
            warnings.warn(f"torchtpu: {op} {why}, so it cannot be part of a compiled graph: the graph is split "
                          f"around it and it runs eagerly", stacklevel=2)
        self._split = _split_around(self.gm, {node}, self.name)


def _host_nodes(gm: torch.fx.GraphModule) -> set:
    """Nodes that compute on the host (an optimizer's step counts, a bias correction, a CPU tensor
    moved to tpu): a captured module would replay none of it, so they run eagerly on every call
    and their results enter the captured parts as inputs."""
    def on_host(value) -> bool:
        if isinstance(value, (tuple, list)):
            return any(on_host(v) for v in value)
        return isinstance(value, torch.Tensor) and value.device.type == "cpu"

    def reads_host_tensor(node: torch.fx.Node) -> bool:
        return any(isinstance(a, torch.fx.Node) and on_host(a.meta.get("val")) and
                   getattr(a.meta.get("val"), "dim", lambda: 0)() > 0 for a in node.all_input_nodes)

    return {node for node in gm.graph.nodes
            if node.op == "call_function" and (on_host(node.meta.get("val")) or reads_host_tensor(node))}


def _tensor_values(node: torch.fx.Node) -> list:
    value = node.meta.get("val")
    values = value if isinstance(value, (tuple, list)) else [value]
    return [v for v in values if isinstance(v, torch.Tensor)]


def _scalar_math_on_device(gm: torch.fx.GraphModule, host: set) -> set:
    """Moves the host nodes that compute only 0-d values nothing on the host needs (an optimizer's
    bias corrections from its step counts) onto the device: the captured module computes them from
    the host scalars it takes as inputs, instead of every call running a chain of tiny CPU ops.
    What stays on the host: writes into host inputs (the step increment), host outputs, tensors
    that are not 0-d, and whatever those read. Returns the host nodes that stay."""
    device = next((v.device for n in gm.graph.nodes for v in _tensor_values(n) if v.device.type == "tpu"), None)
    if device is None:
        return host

    def must_stay(node: torch.fx.Node) -> bool:
        values = _tensor_values(node)
        mutates = isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable
        return mutates or not values or any(v.dim() != 0 for v in values) or any(u.op == "output" for u in node.users)

    stay = {n for n in host if must_stay(n)}
    pending = list(stay)
    while pending:  # what a staying node reads stays too
        for source in pending.pop().all_input_nodes:
            if source in host and source not in stay:
                stay.add(source)
                pending.append(source)
    moved = {n: None for n in gm.graph.nodes if n in host and n not in stay}  # an ordered set
    if not moved:
        return host
    uploads: dict[torch.fx.Node, torch.fx.Node] = {}  # a host value -> its copy on the device

    def on_device(arg, user: torch.fx.Node):
        if isinstance(arg, (tuple, list)):
            return type(arg)(on_device(a, user) for a in arg)
        if not isinstance(arg, torch.fx.Node) or arg in moved:
            return arg
        if not any(v.device.type == "cpu" for v in _tensor_values(arg)):
            return arg
        if arg not in uploads:
            with gm.graph.inserting_before(user):
                uploads[arg] = gm.graph.call_function(torch.ops.aten._to_copy.default, (arg,), {"device": device})
        return uploads[arg]

    for node in moved:
        node.args = on_device(node.args, node)
        node.kwargs = {k: device if k == "device" else on_device(v, node) for k, v in node.kwargs.items()}
        node.meta.pop("val", None)  # no longer a host value (split parts look again)
    gm.graph.lint()
    gm.recompile()
    return stay


class _NodeRunner(torch.fx.Interpreter):
    """Runs a graph node by node, remembering the node being run (the one that refused)."""

    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__(gm, garbage_collect_values=True)
        self.node: torch.fx.Node | None = None

    def run_node(self, n: torch.fx.Node):
        self.node = n
        return super().run_node(n)


def _hoist(gm: torch.fx.GraphModule, eager: set) -> None:
    """Moves the eager nodes that need nothing the captured nodes compute (an optimizer's step
    counts and bias corrections) to the front, so that the captured nodes form as few runs as the
    data allows."""
    def is_getitem_of(node, nodes) -> bool:
        return node.op == "call_function" and node.target is operator.getitem and node.args[0] in nodes

    hoisted: dict = {}  # an ordered set
    needs_captured: set = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if (node in eager or is_getitem_of(node, hoisted)) and not any(a in needs_captured for a in node.all_input_nodes):
            hoisted[node] = None
        else:
            needs_captured.add(node)
    anchor = next((n for n in gm.graph.nodes if n.op not in ("placeholder", "get_attr") and n not in hoisted), None)
    if anchor is None:
        return
    for node in [n for n in gm.graph.nodes if n.op == "get_attr"]:  # what a hoisted node may read
        anchor.prepend(node)  # (a constant dynamo lifted where it is used, after the anchor)
    for node in hoisted:
        anchor.prepend(node)
    gm.graph.lint()
    gm.recompile()


def _split_around(gm: torch.fx.GraphModule, eager: set, name: str) -> torch.fx.GraphModule:
    """The graph as a sequence of parts: each run of `eager` nodes a part run as plain FX, each run
    of nodes between them a captured graph of its own."""
    from torch.fx.passes.split_module import split_module

    _hoist(gm, eager)
    part = 0
    parts: dict[torch.fx.Node, int] = {}
    eager_parts: set[int] = set()
    previous_eager = None
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        is_eager = node in eager
        # getitem of an eager node's tuple result stays with it.
        if node.op == "call_function" and node.target is operator.getitem and node.args[0] in parts:
            parts[node] = parts[node.args[0]]
            continue
        if is_eager != previous_eager:  # a run of eager nodes is one part, as is a run of captured ones
            part += 1
            if is_eager:
                eager_parts.add(part)
        parts[node] = part
        previous_eager = is_eager
    split = split_module(gm, None, lambda node: parts[node], keep_original_order=True)
    for child_name, child in list(split.named_children()):
        index = int(child_name.rsplit("_", 1)[1])
        if index not in eager_parts:
            setattr(split, child_name, _CapturedGraph(child, f"{name}.{child_name}"))
    return split


def _compile_graph(gm: torch.fx.GraphModule, example_inputs, name: str):
    graph = _CapturedGraph(gm, name)

    def run(args: list):
        return graph(*args)

    run._boxed_call = True  # AOTAutograd passes the arguments as one list
    return run


def _decompositions() -> dict:
    """PyTorch's decompositions for the ops that have no spec (a spec'd op stays whole, so graph
    mode emits the lowering eager mode runs): its core set, and from the rest those of ops that
    would otherwise reach the CPU fallback (no composite kernel of their own either)."""
    from torch._decomp import core_aten_decompositions, decomposition_table

    def has_kernel(op, key: str) -> bool:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)

    table = {}
    core = core_aten_decompositions()
    for op, fn in {**decomposition_table, **core}.items():
        if not isinstance(op, torch._ops.OpOverload) or has_kernel(op, "PrivateUse1"):
            continue
        if op in core or not has_kernel(op, "CompositeExplicitAutograd"):
            table[op] = fn
    return table


_guard_failures_seen = 0


def _note_dynamo_recompile() -> None:
    """Dynamo compiles a frame again when a guard of its earlier graph failed (a new shape, dtype
    or Python value): counted as a recompile, with dynamo's reason."""
    global _guard_failures_seen
    from torch._dynamo.utils import guard_failures

    reasons = [str(r) for failures in guard_failures.values() for r in failures]
    new = reasons[_guard_failures_seen:]
    _guard_failures_seen = len(reasons)
    if new:
        with _lock:
            _stats["recompiles"] += 1
            _recompile_reasons.append("dynamo: " + new[-1].strip().splitlines()[0])


def backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The "tpu" torch.compile backend."""
    torchtpu._require_runtime()
    _note_dynamo_recompile()
    from torch._dynamo.backends.common import aot_autograd

    names = itertools.count()
    compile_forward = lambda g, inputs: _compile_graph(g, inputs, f"forward{next(names)}")  # noqa: E731
    compile_backward = lambda g, inputs: _compile_graph(g, inputs, f"backward{next(names)}")  # noqa: E731
    aot = aot_autograd(fw_compiler=compile_forward, bw_compiler=compile_backward,
                       inference_compiler=compile_forward, decompositions=_decompositions(),
                       keep_inference_input_mutations=True, partition_fn=_partition)
    return aot(gm, example_inputs, **kwargs)


def _partition(joint_module: torch.fx.GraphModule, joint_inputs, **kwargs):
    """What the forward keeps for the backward: AOTAutograd's min-cut partition, which recomputes
    cheap elementwise work in the backward rather than saving its results, also where the recomputed
    value feeds a matmul. Its default bans that (a GPU kernel would have to write the value out);
    XLA fuses such a convert or product into the dot's operand, so the backward re-reads the float32
    weight instead of keeping a bfloat16 copy of every weight. On the CPU plugin, 110M Llama with
    bfloat16 autocast, 512 tokens: 117 MiB kept for the backward, against 433 MiB with AOTAutograd's
    default (save every intermediate the backward reads) and 352 MiB with the min-cut's own bans."""
    from torch._functorch import config
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    with config.patch(ban_recompute_materialized_backward=False):
        return min_cut_rematerialization_partition(joint_module, joint_inputs, **kwargs)


def register_device_interface() -> None:
    """The tpu device interface dynamo asks for streams and events while tracing. Dynamo registers
    a placeholder of its own for "tpu" the first time it looks one up: that happens first, so ours
    replaces it."""
    from torch._dynamo.device_interface import get_interface_for_device, register_interface_for_device

    from torchtpu import _dynamo_device

    get_interface_for_device("cpu")
    register_interface_for_device("tpu", _dynamo_device.TpuInterface)
    for index in range(torch.tpu.device_count()):
        register_interface_for_device(f"tpu:{index}", _dynamo_device.TpuInterface)


torchtpu._end_block_in_compiled_step = torch._dynamo.disable(torchtpu._end_block_after_step)


def register_backend() -> None:
    """torch._dynamo.register_backend("tpu"), for a process that imported dynamo before torchtpu;
    otherwise dynamo finds the backend through the torch_dynamo_backends entry point (which
    registers it itself). torch.compile is left as it is."""
    from torch._dynamo.backends.registry import _COMPILER_FNS
    from torch._dynamo.backends.registry import register_backend as register

    if "tpu" not in _COMPILER_FNS:
        register(compiler_fn=backend, name="tpu")


register_device_interface()
