"""The vocabulary of the layer graph: an operation with its FLOPs, HBM bytes, GEMM shape or
collective and the tensors it saves, and the helpers that build graphs of them.

Each op is what one kernel (or one NCCL call) of Megatron does on one tensor-parallel rank; the
time model costs ops, the memory model sums what they save, and the modules of
``simulator.graph.modules`` declare which ops a layer's parts run forward and backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import networkx as nx

CORE_ATTENTION = "core_attention"  # the region selective recompute replays (Korthikanti Section 5)
MASK_BYTES = 1  # Megatron keeps dropout masks as 1-byte booleans
FP32_BYTES = 4


class OpKind(str, Enum):
    gemm = "gemm"  # weight GEMM (cuBLAS)
    batched_gemm = "batched_gemm"  # attention's activation x activation products
    flash_attention = "flash_attention"  # fused attention kernel
    elementwise = "elementwise"  # memory-bound: norms, softmax, dropout, activations
    collective = "collective"  # tensor-parallel NCCL collective


class Stream(str, Enum):
    compute = "compute"
    tp_comm = "tp_comm"


class CollectiveKind(str, Enum):
    all_reduce = "all_reduce"
    all_gather = "all_gather"
    reduce_scatter = "reduce_scatter"
    send_recv = "send_recv"
    all_to_all = "all_to_all"


@dataclass(frozen=True, slots=True)
class SavedTensor:
    """A tensor kept alive from the forward to the backward pass."""

    name: str
    numel: int
    dtype_bytes: int
    region_input: bool = False  # an input of the core-attention region: kept under selective recompute

    @property
    def bytes(self) -> int:
        return self.numel * self.dtype_bytes


@dataclass(frozen=True, slots=True)
class GemmShape:
    """C[m, n] = A[m, k] @ B[k, n], ``batch`` times."""

    m: int
    n: int
    k: int
    batch: int = 1
    accumulate_bytes: int = 0  # C += A @ B into a buffer of this element size (weight gradients into main_grad)
    fp8: bool = False  # FP8 inputs (Transformer Engine linear layers), output in the activation dtype
    grouped: bool = True  # the batch runs as one kernel (bmm, grouped GEMM); False: one kernel after another

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch


@dataclass(frozen=True, slots=True)
class CollectiveOp:
    kind: CollectiveKind
    bytes: int  # the full buffer: all-reduce size, all-gather output, reduce-scatter input; one send's bytes
    group_size: int
    stride: int = 1  # ranks between members (TP 1; CP t): whether the group leaves a node


@dataclass(frozen=True, slots=True)
class Op:
    name: str
    kind: OpKind
    flops: float = 0.0
    bytes_moved: float = 0.0  # HBM traffic of a memory-bound op
    gemm: GemmShape | None = None
    collective: CollectiveOp | None = None
    saves: tuple[SavedTensor, ...] = ()
    region: str = ""
    # flash attention: (batch x heads, sequence, head size, causal, backward) for the attention cost model
    attention: tuple[int, int, int, bool, bool] | None = None
    # memory-bound ops: the calibration's kernel class (layer_norm, dropout, ...); fused attention: the
    # --attention-backend that picks its kernel (auto, flash, fused)
    kernel: str = ""
    host_sync: bool = False  # the host copies a result to itself first, so it waits for the device to drain

    @property
    def stream(self) -> Stream:
        return Stream.tp_comm if self.kind is OpKind.collective else Stream.compute


@dataclass
class GraphBuilder:
    """Adds ops to a DiGraph; by default each op depends on the previous one."""

    graph: nx.DiGraph = field(default_factory=nx.DiGraph)
    last: str | None = None

    def add(self, op: Op, after: tuple[str, ...] | None = None) -> str:
        self.graph.add_node(op.name, op=op, index=self.graph.number_of_nodes())
        for dep in after if after is not None else (self.last,):
            if dep is not None:
                self.graph.add_edge(dep, op.name)
        self.last = op.name
        return op.name


# Which microbenchmarked kernel an elementwise op behaves like, by its name (first match wins). On a
# GPU they are all bandwidth-bound; on a CPU a dropout's random numbers or GeLU's tanh cost far more
# than their bytes, so a profile may give each class its own achieved bandwidth. The softmax's masked
# fill is one pass over the scores with no reduction, a copy where a profile did not time it as a fill.
_KERNEL_CLASSES = (("softmax.mask", "masked_fill"), ("residual_grad_add", "bias_add_residual"),
                   ("bias_grad", "bias_add_residual"),
                   ("norm", "layer_norm"), ("softmax", "softmax"), ("cross_entropy", "softmax"),
                   ("gelu", "gelu"), ("swiglu", "gelu"))


def kernel_class(name: str, mask: bool = True) -> str:
    """The kernel class of an elementwise op; a backward op (``<forward>.backward``) is its forward's class with
    ``_backward``, which a profile that did not time it costs as it did before it had its own (see
    ``simulator.cost.profile_blocks.KERNEL_STAND_INS``)."""
    if name.endswith(".backward"):
        return f"{kernel_class(name.removesuffix('.backward'), mask)}_backward"
    for key, kernel in _KERNEL_CLASSES:
        if key in name:
            return kernel
    if "dropout" in name:
        # a dropout of probability 0 is left out: what remains is the residual add, or nothing
        return "dropout" if mask else "bias_add_residual"
    return "copy"


def elementwise(name: str, numel: int, reads: float, writes: float, ab: int, saves=(), region="", mask=False) -> Op:
    """A memory-bound op reading ``reads`` and writing ``writes`` tensors of ``numel`` elements."""
    moved = numel * ab * (reads + writes) + (numel * MASK_BYTES if mask else 0)
    return Op(name, OpKind.elementwise, flops=0.0, bytes_moved=moved, saves=tuple(saves), region=region,
              kernel=kernel_class(name, mask))


def gemm(name: str, shape: GemmShape, saves=(), region="", kind=OpKind.gemm) -> Op:
    return Op(name, kind, flops=shape.flops, gemm=shape, saves=tuple(saves), region=region)


def collective(name: str, kind: CollectiveKind, nbytes: int, t: int, stride: int = 1, region: str = "") -> Op:
    return Op(name, OpKind.collective, collective=CollectiveOp(kind, nbytes, t, stride), region=region)


def ordered_ops(graph: nx.DiGraph) -> list[Op]:
    """Ops in a deterministic topological order (insertion order breaks ties).

    Graphs are never changed once built, so the order is kept on the graph itself: the search
    asks for it hundreds of thousands of times.
    """
    order = graph.graph.get("order")
    if order is None:
        nodes = graph.nodes
        index = {n: d["index"] for n, d in nodes(data=True)}
        if all(index[u] < index[v] for u, v in graph.edges):
            # every edge runs from an earlier op to a later one (as GraphBuilder adds them): the order by
            # index is then the one the lexicographical sort would give, without its heap
            names = sorted(index, key=index.__getitem__)
        else:
            names = nx.lexicographical_topological_sort(graph, key=index.__getitem__)
        order = graph.graph["order"] = tuple(nodes[n]["op"] for n in names)
    return list(order)


