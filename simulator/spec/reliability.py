"""What interrupts a training job, and what a restart and a checkpoint cost: ``Reliability`` and ``StorageSpec``.

Failure data is hardware data: each component's interruption rate, per million GPU-hours, is declared with
its source and a range (``Declared``: value, low, high, source), read from ``hardware_specs/reliability/*.yaml``
as a cluster names it. A synchronous job stops whenever any of its GPUs, their memory, links, NICs or hosts,
or the software, fails, so the job's rate is the sum of the components' rates times its GPU-hours.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from hardware_specs import SPEC_DIR
from simulator.spec import limits
from simulator.spec._io import build, exists, read_mapping
from simulator.spec.errors import ConfigError


class Declared(BaseModel):
    """A number no measurement of this project pins: its value, the range it may take, and where both come from."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    value: float = Field(ge=0, le=1e12)
    low: float = Field(ge=0, le=1e12)
    high: float = Field(ge=0, le=1e12)
    source: str = Field(min_length=1)

    @model_validator(mode="after")
    def _range_holds_value(self) -> "Declared":
        if not self.low <= self.value <= self.high:
            raise ValueError(f"value {self.value:g} lies outside its range [{self.low:g}, {self.high:g}]; widen the "
                             "range or fix the value")
        return self

    def at(self, end: str) -> float:
        """The value (``end`` "value"), or an end of its range ("low", "high")."""
        return getattr(self, end)

    def scaled(self, factor: float) -> "Declared":
        return self.model_copy(update=dict(value=self.value * factor, low=self.low * factor, high=self.high * factor))


class Component(BaseModel):
    """One cause of job interruptions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    per_million_gpu_hours: Declared = Field(description="Interruptions per 1e6 GPU-hours of the job.")
    planned: bool = Field(False, description="A maintenance stop the job is told of: it saves first and loses no "
                                             "work, but pays the restart.")
    replaces_node: bool = Field(True, description="The job restarts on a replacement node (a spare, or one from "
                                                  "the pool), and the failed node goes to repair.")
    repair_hours: Declared = Field(description="Time until the failed node is back in the pool.")


class RestartCosts(BaseModel):
    """What one restart costs before training resumes, apart from loading the checkpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    detect_s: Declared = Field(description="From the fault to the job being stopped (a crash, or the NCCL "
                                           "watchdog's timeout on a hang).")
    reschedule_s: Declared = Field(description="The scheduler's requeue, the health checks, a node swapped in.")
    process_start_s: Declared = Field(description="Processes started, Python and CUDA initialised.")
    nccl_init_s: Declared = Field(description="Communicators created: the part that does not grow with the job.")
    nccl_init_s_per_gpu: Declared = Field(description="... and the part that grows with the ranks (bootstrap "
                                                      "all-gathers, topology exchange).")
    warmup_iterations: Declared = Field(description="Iterations slower than steady state after a restart "
                                                    "(allocator, data loader, autotuning), counted as whole ones.")


class Reliability(BaseModel):
    """Interruption rates of a cluster's parts and the costs of a restart, each declared with a range."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    derivation: str = Field(description="How the defaults derive from the published figures.")
    components: dict[str, Component] = Field(min_length=1)
    restart: RestartCosts

    def rate_per_gpu_hour(self, end: str = "value", planned: bool | None = False) -> float:
        """Interruptions per GPU-hour of the components (``planned``: only planned ones, only unplanned ones
        (False), or all (None)), each at ``end`` of its range."""
        return sum(c.per_million_gpu_hours.at(end) for c in self.components.values()
                   if planned is None or c.planned == planned) / 1e6

    def with_mtbf_gpu_hours(self, mtbf_gpu_hours: float) -> "Reliability":
        """The unplanned components scaled together so that one GPU's mean time between them is
        ``mtbf_gpu_hours`` (``--mtbf-gpu-hours``): the mix of causes is kept, the level replaced."""
        rate = self.rate_per_gpu_hour()
        if rate == 0:
            raise ConfigError(f"--mtbf-gpu-hours {mtbf_gpu_hours:g} scales the unplanned interruption rates of "
                              f"{self.name}, but they are all 0; give the components rates in the cluster's data")
        factor = 1 / mtbf_gpu_hours / rate
        comps = {name: c if c.planned else c.model_copy(update=dict(per_million_gpu_hours=c.per_million_gpu_hours
                                                                    .scaled(factor)))
                 for name, c in self.components.items()}
        return self.model_copy(update=dict(components=comps))


class StorageSpec(BaseModel):
    """The file system checkpoints are written to and read from, and the copy to host memory an asynchronous
    save makes first. Defaults are declared; a cluster file may give its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    write_gbps_per_node: Declared = Declared(
        value=10, low=2, high=50,
        source="declared: a DGX node's storage NICs (2 x 200-400 Gb/s) carry at most 50-100 GB/s; parallel file "
               "systems deliver a fifth of that to one writer node in practice")
    read_gbps_per_node: Declared = Declared(
        value=10, low=2, high=50, source="declared as write_gbps_per_node (reads and writes share the NICs)")
    write_gbps: Declared = Declared(
        value=2000, low=200, high=7000,
        source="aggregate of the whole file system: Llama 3 (Dubey et al. 2024, section 3.3.1) reports Tectonic "
               "sustaining 2 TB/s, 7 TB/s at peak; smaller clusters' file systems deliver a few hundred GB/s")
    read_gbps: Declared = Declared(
        value=2000, low=200, high=7000, source="declared as write_gbps")
    host_copy_gbps_per_gpu: Declared = Declared(
        value=25, low=10, high=55,
        source="declared: the device-to-host copy of an asynchronous save, pinned memory over PCIe (Gen4 x16 "
               "about 25 GB/s, Gen5 x16 up to about 55 GB/s)")
    save_fixed_s: Declared = Declared(
        value=5, low=1, high=30,
        source="declared: a distributed checkpoint's planning, metadata and barrier, paid on every save")

    @field_validator("write_gbps_per_node", "read_gbps_per_node", "write_gbps", "read_gbps", "host_copy_gbps_per_gpu")
    @classmethod
    def _bandwidth_is_physical(cls, d: Declared, info: ValidationInfo) -> Declared:
        low, high = limits.GBPS_RANGE["ge"], limits.GBPS_RANGE["le"]
        if d.low < low or d.high > high:
            raise ValueError(f"{info.field_name} spans {d.low:g} to {d.high:g} GB/s; a bandwidth is from "
                             f"{low:g} to {high:g} GB/s, as the flags take it, so bring its range inside")
        return d

    def with_bandwidth(self, name: str, gbps: float) -> "StorageSpec":
        """One bandwidth given by a flag: a value that replaces the declared one and its range."""
        return self.model_copy(update={name: Declared(value=gbps, low=gbps, high=gbps, source="given by a flag")})


@lru_cache(maxsize=None)
def _preset(path: Path) -> Reliability:  # every cluster without its own data shares the preset: read it once
    return build(Reliability, read_mapping(path, "reliability data"), f"reliability data {str(path)!r}", strict=True)


def _files() -> dict[str, Path]:
    return {p.stem: p for p in sorted((SPEC_DIR / "reliability").glob("*.yaml"))}


DEFAULT_RELIABILITY = "llama3-h100"


def reliability_names() -> list[str]:
    return list(_files())


def load_reliability(name_or_path: str = DEFAULT_RELIABILITY) -> Reliability:
    """A reliability preset (``llama3-h100``) or a YAML file of ``Reliability`` fields."""
    path = _files().get(name_or_path)
    if path is not None:
        return _preset(path)
    if path is None:
        path = Path(name_or_path)
        if not exists(path, "reliability data"):
            raise ConfigError(f"unknown reliability data {name_or_path!r}; use one of "
                              f"{', '.join(reliability_names())} or a YAML file")
    return build(Reliability, read_mapping(path, "reliability data"), f"reliability data {str(path)!r}", strict=True)

