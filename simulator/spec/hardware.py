"""``GpuSpec`` and ``ClusterSpec``: what the hardware is, read from ``hardware_specs/*.yaml``.

Spec sheets only: how fast the hardware really runs (achieved GEMM efficiency, NCCL bus
bandwidth) lives in the ``HardwareProfile``, which is measured or taken from published
microbenchmarks.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hardware_specs import SPEC_DIR
from simulator.spec import limits
from simulator.spec._io import build, exists, read_mapping
from simulator.spec.errors import ConfigError
from simulator.spec.reliability import DEFAULT_RELIABILITY, Reliability, StorageSpec, load_reliability

GIB = 1024**3


_TFLOPS, _GBPS = limits.TFLOPS_RANGE, limits.GBPS_RANGE  # physical ranges (see simulator.spec.limits)


class PeakTflops(BaseModel):
    """Dense peak throughput per data type, TFLOP/s (no sparsity)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    bf16: float = Field(**_TFLOPS)
    fp16: float = Field(**_TFLOPS)
    tf32: float = Field(**_TFLOPS)
    fp32: float = Field(description="Non-tensor-core FP32.", **_TFLOPS)
    fp8: float | None = Field(None, description="Hopper and later only.", **_TFLOPS)
    mxfp8: float | None = Field(
        None, description="Blackwell and later: FP8 with a power-of-two scale per 32 elements (OCP microscaling), "
                          "the recipe Transformer Engine and Megatron use there.", **_TFLOPS)


def _field_value(spec: BaseModel, dotted: str):
    """The number a dotted name (``peak_tflops.bf16``) names in ``spec``; None when it names none."""
    value: object = spec
    for part in dotted.split("."):
        if not isinstance(value, BaseModel) or part not in type(value).model_fields:
            return None
        value = getattr(value, part)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _check_ranges(spec: BaseModel, ranges: dict[str, tuple[float, float]]) -> None:
    """Each declared range names a number of the spec and holds its value."""
    for name, (low, high) in ranges.items():
        value = _field_value(spec, name)
        if value is None:
            raise ValueError(f"{spec.name}: ranges names {name!r}, which is no number of this spec; use a field "
                             "name, dotted for a peak (peak_tflops.bf16)")
        if not low <= value <= high:
            raise ValueError(f"{spec.name}: {name}={value:g} lies outside its range [{low:g}, {high:g}]; widen the "
                             "range or fix the value")


def _require_sources(spec: BaseModel, sources: dict[str, str]) -> None:
    missing = [
        name
        for name, field in type(spec).model_fields.items()
        if name not in {"name", "sources", "ranges", "gpu", "architecture", "nvswitch", "fabric", "asynchronous",
                        "storage", "reliability"}
        and getattr(spec, name) is not None
        and name not in sources
    ]
    if missing:
        raise ValueError(f"{spec.name}: fields {missing} have no entry under 'sources'; every number needs its source")


class GpuSpec(BaseModel):
    """One accelerator's spec sheet."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str
    architecture: str
    sm_count: int = Field(gt=0, le=1_000_000)
    peak_tflops: PeakTflops
    hbm_capacity_gib: float = Field(ge=1 / 1024, le=1e6, description="Device memory, GiB.")
    hbm_bandwidth_gbps: float = Field(description="Peak HBM bandwidth, GB/s (decimal).", **_GBPS)
    l2_cache_mb: float = Field(gt=0, le=1e6)
    nvlink_bandwidth_gbps_per_direction: float = Field(description="NVLink per GPU, GB/s per direction.", **_GBPS)
    tdp_w: float = Field(gt=0, le=1e6)
    best_published_mfu: float | None = Field(
        None, gt=0, le=1, description="The highest MFU a published training run on this GPU reached: predictions "
                                      "above it are outside the range the model was validated in.")
    asynchronous: bool = Field(
        True, description="The host queues work and runs ahead of the device (CUDA streams); false for a CPU, "
                          "where each op runs on the thread that issues it.")
    sources: dict[str, str]
    ranges: dict[str, tuple[float, float]] = Field(
        default_factory=dict, description="Where the spec sheets disagree or a number is not published for the exact "
                                          "part: the (low, high) a field may take, by name (peak_tflops.fp8 for a "
                                          "peak); its source says why.")

    @model_validator(mode="after")
    def _every_number_has_a_source(self) -> "GpuSpec":
        _require_sources(self, self.sources)
        _check_ranges(self, self.ranges)
        return self

    def __hash__(self) -> int:  # the sources dict is documentation, not identity
        return hash((self.name, self.peak_tflops, self.hbm_capacity_gib, self.hbm_bandwidth_gbps, self.sm_count,
                     self.asynchronous, self.best_published_mfu))

    @property
    def memory_bytes(self) -> int:
        return int(self.hbm_capacity_gib * GIB)


class FabricKind(str, Enum):
    rail_optimized_fat_tree = "rail-optimized-fat-tree"


class FabricSpec(BaseModel):
    """The inter-node network: a rail-optimised leaf/spine fat tree (DGX SuperPOD)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: FabricKind
    nodes_per_scalable_unit: int = Field(
        gt=0, le=limits.MAX_GPUS, description="Nodes whose same-rail NICs share one leaf switch."
    )
    leaf_switches_per_scalable_unit: int = Field(gt=0, le=limits.MAX_GPUS)
    switch_latency_ns: float = Field(ge=0, le=1e9, description="Port-to-port latency of one switch hop.")


class ClusterSpec(BaseModel):
    """A cluster of identical nodes: the node's GPUs and NVLink, its NICs and the fabric between nodes.

    NVLink joins the GPUs of one NVLink domain: a node's own NVSwitch (HGX boards, the default), or NVLink switch
    trays that join several nodes (a GB200 NVL72 rack: 18 compute trays of 4 GPUs). A job's ranks fill the nodes
    of a domain in order, then the next domain, so the collectives, the rank layout and the search read the
    domain (``ranks_per_nvlink_domain``) where they ask which ranks NVLink joins, and the node where they ask
    about the host (its NICs, its memory, what fails together).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str
    gpu: GpuSpec
    gpus_per_node: int = Field(gt=0, le=limits.MAX_GPUS_PER_NODE)
    nvswitch: bool = Field(description="All GPUs of an NVLink domain reach each other at full NVLink bandwidth.")
    nvlink_bandwidth_gbps_per_direction: float = Field(description="NVLink per GPU, GB/s per direction.", **_GBPS)
    nvlink_domain_gpus: int | None = Field(
        None, gt=0, le=limits.MAX_GPUS,
        description="GPUs one NVLink switch fabric joins, a whole number of nodes (a GB200 NVL72 rack: 72 in 18 "
                    "trays of 4); None: the node (an HGX board's NVSwitch).")
    nvlink_segment_nodes: int | None = Field(
        None, gt=0, le=limits.MAX_GPUS,
        description="Nodes of each NVLink domain a job's ranks fill before the next domain (Slurm topology/block's "
                    "--segment: 16 of an NVL72's 18 trays, so that power-of-two groups tile the 64 GPUs used); "
                    "None: every node of the domain.")
    nics_per_node: int = Field(gt=0, le=limits.MAX_GPUS_PER_NODE)
    nic_line_rate_gbit_s: float = Field(description="Line rate of one compute NIC, Gb/s (bits).", **_GBPS)
    fabric: FabricSpec
    nodes_per_host: int | None = Field(
        None, gt=0, le=limits.MAX_GPUS_PER_NODE,
        description="Nodes that share one machine's caches, memory and power (the cores of a CPU standing in for "
                    "nodes); None: every node is its own machine.")
    storage: StorageSpec = Field(
        default_factory=StorageSpec, description="Where checkpoints go: bandwidth per node and in aggregate, each "
                                                 "declared with its range and source.")
    reliability: Reliability = Field(
        default_factory=lambda: load_reliability(DEFAULT_RELIABILITY),
        description="Interruption rates of the parts and restart costs (in a cluster file, a preset name under "
                    "hardware_specs/reliability/ or the fields themselves).")
    sources: dict[str, str]
    ranges: dict[str, tuple[float, float]] = Field(
        default_factory=dict, description="Where a number is not published for the exact part or the sources "
                                          "disagree: the (low, high) it may take, by field name; its source says why.")

    @model_validator(mode="after")
    def _every_number_has_a_source(self) -> "ClusterSpec":
        _require_sources(self, self.sources)
        _check_ranges(self, self.ranges)
        return self

    @model_validator(mode="after")
    def _nvlink_domain_is_whole_nodes(self) -> "ClusterSpec":
        n, d, seg = self.gpus_per_node, self.nvlink_domain_gpus, self.nvlink_segment_nodes
        if d is not None and d % n:
            raise ValueError(f"{self.name}: nvlink_domain_gpus={d} is not a whole number of nodes of {n} GPUs; use "
                             f"a multiple of {n}")
        if d is not None and d > n and not self.nvswitch:
            raise ValueError(f"{self.name}: an NVLink domain of {d} GPUs over several nodes needs NVLink switches; "
                             "set nvswitch: true or leave nvlink_domain_gpus out")
        if seg is not None and (d is None or seg > d // n):
            raise ValueError(f"{self.name}: nvlink_segment_nodes={seg} must be at most the "
                             f"{(d or n) // n} nodes of an NVLink domain; use fewer or set nvlink_domain_gpus")
        su = self.fabric.nodes_per_scalable_unit
        if su % self.nodes_per_nvlink_domain:
            raise ValueError(f"{self.name}: a scalable unit of {su} nodes is not a whole number of NVLink domains of "
                             f"{self.nodes_per_nvlink_domain} nodes; use a multiple of {self.nodes_per_nvlink_domain}")
        return self

    @model_validator(mode="after")
    def _mesh_is_small(self) -> "ClusterSpec":
        n = self.gpus_per_node
        if not self.nvswitch and n > limits.MAX_MESH_GPUS_PER_NODE:
            raise ValueError(
                f"{self.name}: gpus_per_node={n} without an NVSwitch means a link between every pair of GPUs; "
                f"such meshes hold at most {limits.MAX_MESH_GPUS_PER_NODE} GPUs, so set nvswitch: true or use fewer"
            )
        return self

    def __hash__(self) -> int:  # the sources dict is documentation, not identity
        return hash((self.name, self.gpu, self.gpus_per_node, self.nvlink_bandwidth_gbps_per_direction,
                     self.nics_per_node, self.nic_line_rate_gbit_s, self.fabric, self.nodes_per_host,
                     self.nvlink_domain_gpus, self.nvlink_segment_nodes))

    def value_key(self) -> str:
        """Every field as one string: what caches of results built from this cluster key on."""
        return self.model_dump_json()

    @property
    def devices_per_host(self) -> int:
        """Devices that share one machine: a node's GPUs, or the nodes (cores) of one CPU."""
        return self.gpus_per_node * (self.nodes_per_host or 1)

    @property
    def nodes_per_nvlink_domain(self) -> int:
        """Nodes one NVLink switch fabric joins (1 where the node's NVSwitch is the domain)."""
        return (self.nvlink_domain_gpus or self.gpus_per_node) // self.gpus_per_node

    @property
    def ranks_per_nvlink_domain(self) -> int:
        """Consecutive ranks of a job that NVLink joins: the GPUs of the nodes it takes in each domain."""
        return (self.nvlink_segment_nodes or self.nodes_per_nvlink_domain) * self.gpus_per_node

    @property
    def nics_per_nvlink_domain(self) -> int:
        """The compute NICs of the nodes a job takes in one NVLink domain."""
        return self.nics_per_node * self.ranks_per_nvlink_domain // self.gpus_per_node

    @property
    def nvlink_domains_per_scalable_unit(self) -> int:
        """NVLink domains whose same-rail NICs share a leaf switch."""
        return self.fabric.nodes_per_scalable_unit // self.nodes_per_nvlink_domain

    @property
    def nvlink_domain_spans_nodes(self) -> bool:
        return self.ranks_per_nvlink_domain > self.gpus_per_node

    @property
    def nic_bandwidth_gbps_per_gpu(self) -> float:
        """Inter-node line rate available to each GPU, GB/s per direction."""
        return self.nics_per_node * self.nic_line_rate_gbit_s / 8 / self.gpus_per_node


def _spec_files(kind: str) -> dict[str, Path]:
    return {p.stem: p for p in sorted((SPEC_DIR / kind).glob("*.yaml"))}


def gpu_names() -> list[str]:
    return [read_mapping(p, "GPU spec")["name"] for p in _spec_files("gpus").values()]


def cluster_names() -> list[str]:
    return list(_spec_files("clusters"))


def load_gpu(name_or_path: str) -> GpuSpec:
    """A GPU by its name (``A100-SXM4-80GB``, case-insensitive) or a YAML file."""
    path = _spec_files("gpus").get(name_or_path.lower())
    if path is None:
        path = Path(name_or_path)
        if not exists(path, "GPU spec"):
            raise ConfigError(f"unknown GPU {name_or_path!r}; use one of {', '.join(gpu_names())} or a YAML file")
    return build(GpuSpec, read_mapping(path, "GPU spec"), f"GPU spec {str(path)!r}", strict=True)


def load_cluster(name_or_path: str) -> ClusterSpec:
    """A cluster preset (``dgx-a100-80gb``) or a YAML file whose ``gpu`` names a GPU spec."""
    path = _spec_files("clusters").get(name_or_path)
    if path is None:
        path = Path(name_or_path)
        if not exists(path, "cluster spec"):
            raise ConfigError(
                f"unknown cluster {name_or_path!r}; use one of {', '.join(cluster_names())} or a YAML file"
            )
    data = read_mapping(path, "cluster spec")
    if isinstance(data.get("gpu"), str):
        data["gpu"] = load_gpu(data["gpu"]).model_dump(mode="json")
    if isinstance(data.get("reliability"), str):
        try:
            data["reliability"] = load_reliability(data["reliability"]).model_dump(mode="json")
        except ConfigError as exc:  # the data it names is refused: say which cluster named it
            raise ConfigError(f"cluster spec {str(path)!r} field 'reliability': {exc}") from None
    return build(ClusterSpec, data, f"cluster spec {str(path)!r}", strict=True)
