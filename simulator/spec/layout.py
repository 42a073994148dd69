"""``RankLayout``: which global ranks share each process group, as Megatron's rank generator orders them.

Megatron numbers ranks tensor-parallel first, then context-parallel, then data-parallel, then
pipeline (``--rank-order tp-cp-ep-dp-pp``): global rank = tp + t (cp + c (dp + d pp)). Ranks fill
nodes in order, and NVLink domains in order (a domain is the node, or several nodes joined by NVLink
switches), so the fastest-varying groups (TP, then CP) stay inside a node, and a domain, as long as
they fit.

The expert layers of a mixture-of-experts model decompose the same ranks of a stage again, as
Megatron's expert rank generator does: expert tensor parallel first, then expert parallel, then
expert data parallel (etp x ep x edp = tp x cp x dp), then pipeline. Those dimensions are
``etp``, ``ep`` and ``edp``; ``pp`` is shared.

The time model asks a layout for the shape of a group (its size and the stride between members,
which the network routes), the memory model which ranks a tensor is sharded over, and the
reference loop builds its process groups from the same answers.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

ORDER = ("tp", "cp", "dp", "pp")
EXPERT_ORDER = ("etp", "ep", "edp", "pp")


@dataclass(frozen=True, slots=True)
class GroupShape:
    """A process group in rank order: ``size`` ranks ``stride`` apart."""

    size: int
    stride: int


@dataclass(frozen=True)
class RankLayout:
    tp: int
    cp: int
    dp: int
    pp: int
    gpus_per_node: int
    ep: int = 1
    etp: int | None = None  # None: the expert layers keep the dense layers' TP, as Megatron defaults it
    nvlink_domain: int | None = None  # consecutive ranks NVLink joins; None: the node

    def __post_init__(self) -> None:
        assert min(self.tp, self.cp, self.dp, self.pp, self.gpus_per_node, self.ep, self.size("etp")) >= 1, self
        assert (self.tp * self.cp * self.dp) % (self.size("etp") * self.ep) == 0, self
        assert self.domain_size % self.gpus_per_node == 0, self

    @staticmethod
    def of(job) -> "RankLayout":
        plan, cluster = job.plan, job.cluster
        domain = cluster.ranks_per_nvlink_domain
        return RankLayout(plan.tensor_parallel_size, getattr(plan, "context_parallel_size", 1),
                          plan.data_parallel_size, plan.pipeline_parallel_size, cluster.gpus_per_node,
                          getattr(plan, "expert_model_parallel_size", 1), getattr(plan, "expert_tensor_parallel_size",
                                                                                  None),
                          None if domain == cluster.gpus_per_node else domain)

    @property
    def domain_size(self) -> int:
        return self.nvlink_domain or self.gpus_per_node

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def size(self, dim: str) -> int:
        if dim == "etp":
            return self.tp if self.etp is None else self.etp
        if dim == "edp":
            return self.tp * self.cp * self.dp // (self.size("etp") * self.ep)
        return getattr(self, dim)

    @staticmethod
    def _order(dim: str) -> tuple[str, ...]:
        return EXPERT_ORDER if dim in ("etp", "ep", "edp") else ORDER

    def stride(self, dim: str) -> int:
        stride = 1
        for d in self._order(dim):
            if d == dim:
                return stride
            stride *= self.size(d)
        raise KeyError(dim)

    def shape(self, dim: str) -> GroupShape:
        return GroupShape(self.size(dim), self.stride(dim))

    def coords(self, rank: int, expert: bool = False) -> dict[str, int]:
        """``rank``'s place along each dimension (``expert``: along etp, ep, edp and pp)."""
        out = {}
        for d in EXPERT_ORDER if expert else ORDER:
            rank, out[d] = divmod(rank, self.size(d))
        return out

    def rank(self, **coords: int) -> int:
        order = EXPERT_ORDER if set(coords) & {"etp", "ep", "edp"} else ORDER
        return sum(coords.get(d, 0) * self.stride(d) for d in order)

    def group(self, dim: str, rank: int) -> tuple[int, ...]:
        """The members of ``rank``'s group along ``dim``, in order."""
        base = rank - self.coords(rank, dim in ("etp", "ep", "edp"))[dim] * self.stride(dim)
        return tuple(base + i * self.stride(dim) for i in range(self.size(dim)))

    def groups(self, dim: str) -> list[tuple[int, ...]]:
        """Every group along ``dim`` (each rank in exactly one)."""
        seen, out = set(), []
        for r in range(self.world):
            if r not in seen:
                g = self.group(dim, r)
                seen.update(g)
                out.append(g)
        return out

    def stage_ranks(self, stage: int) -> range:
        block = self.world // self.pp
        return range(stage * block, (stage + 1) * block)

    def embedding_group(self) -> GroupShape:
        """Megatron's embedding group: each rank of the first stage with its peer on the last, which
        all-reduce the tied word embeddings' gradients. Only those two stages' ranks form such pairs,
        not every offset the stride spans; where the whole job sits in one node, where any disjoint
        pairs cost the same through the switch, the pairs are costed one stage apart so that the
        group's image stays inside the node as the real pairs do (the NVLink domain, where it spans nodes)."""
        block = self.world // self.pp
        if self.world <= self.domain_size:
            return GroupShape(2, block)
        return GroupShape(2, block * (self.pp - 1))

    def node(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def domain(self, rank: int) -> int:
        """The NVLink domain ``rank`` lies in."""
        return rank // self.domain_size

    def within_node(self, dim: str) -> bool:
        """Whether every group along ``dim`` stays inside one node: a block of sibling groups spans
        size x stride consecutive ranks, which must tile the node (or the job fits in one node)."""
        return self.world <= self.gpus_per_node or self.gpus_per_node % (self.size(dim) * self.stride(dim)) == 0

    def within_nvlink_domain(self, dim: str) -> bool:
        """Whether every group along ``dim`` stays inside one NVLink domain, as ``within_node`` asks of a node."""
        d = self.domain_size
        return self.world <= d or d % (self.size(dim) * self.stride(dim)) == 0

    def pipeline_boundary(self, stage: int, nics_per_node: int) -> tuple[bool, int]:
        """Stage ``stage`` -> ``stage + 1`` (mod pp): whether any send leaves its NVLink domain, and
        the most such sends that share one NIC at once (every rank of the stage sends its slice
        together; GPU i of a node uses NIC i x nics / gpus_per_node of its node).

        Domains wholly inside a stage all look alike, so only the ranks within two domains of either
        end of the stage are visited: the answer costs O(domain size) at any job size.
        """
        jump, gpn, span = self.world // self.pp, self.gpus_per_node, self.domain_size
        ranks = self.stage_ranks(stage)
        head = range(ranks.start, min(ranks.start + 2 * span, ranks.stop))
        tail = range(max(ranks.stop - 2 * span, head.stop), ranks.stop)
        flows: Counter = Counter()
        for r in (*head, *tail):
            if self.domain(r) != self.domain((r + jump) % self.world):
                flows[(self.node(r), (r % gpn) * nics_per_node // gpn)] += 1
        return bool(flows), max(flows.values(), default=1)
