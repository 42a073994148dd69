"""``HardwareProfile``: how fast a GPU and its links really run, as fitted parameters with sources.

A profile is a versioned JSON file. Published profiles are fitted to microbenchmark numbers read
from the literature (``calibration/published/hardware.md``); measured profiles are fitted to
points timed on the user's own hardware. Both share this schema and say which they are. Every
parameter block names the source of each number and, when it was fitted, keeps the raw points
and the relative residuals of the fit, so a reader can judge how well the model form holds.

The formulas that use these parameters live in ``simulator.cost``.
"""

from __future__ import annotations

import os
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from simulator.cost.profile_blocks import (
    AttentionParams,
    CollectiveParams,
    ElementwiseParams,
    FitRecord,
    GemmParams,
    HostParams,
    LinkParams,
    _check_range,
)
from simulator.cost.run_calibration import RunCalibration
from simulator.spec import limits
from simulator.spec._io import (
    check_name,
    exists,
    parse_json,
    read_text,
    short_repr,
    validate_file_data,
    validation_message,
    write_output,
)
from simulator.spec.errors import ProfileError

SCHEMA_VERSION = 1

# the blocks a profile is made of, importable from here as from their own module
__all__ = ["SCHEMA_VERSION", "AttentionParams", "CollectiveParams", "DeviceInfo", "ElementwiseParams", "FitRecord",
           "GemmParams", "HardwareProfile", "HostParams", "LinkParams", "default_profile", "load_profile",
           "profile_names", "save_profile"]


def _profile_dir() -> Path:
    # Through the installed ``calibration`` package so that a wheel finds its shipped JSON.
    return Path(str(resources.files("calibration") / "profiles"))


_LoadAverage = Annotated[float, Field(**limits.LOAD_AVERAGE_RANGE)]


class DeviceInfo(BaseModel):
    """Where a profile was measured; all null for a published profile."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str | None = None
    driver: str | None = None
    torch_version: str | None = None
    cuda_version: str | None = None
    date: str | None = None
    host: str | None = None
    kind: Literal["cpu", "cuda"] | None = Field(None, description="What torch measured on.")
    threads: int | None = Field(
        None, gt=0, le=limits.MAX_THREADS,
        description="Torch threads per process while measuring; a run validated against the profile must use as "
                    "many per rank.")
    cores: int | None = Field(None, gt=0, le=limits.MAX_CORES, description="CPU cores the machine has (os.cpu_count()).")
    load_average: tuple[_LoadAverage, _LoadAverage, _LoadAverage] | None = Field(
        None, description="1, 5 and 15-minute load averages when measuring began: how busy the machine was.")
    load_average_end: tuple[_LoadAverage, _LoadAverage, _LoadAverage] | None = Field(
        None, description="... when it ended.")


class HardwareProfile(BaseModel):
    """How fast one GPU type (and its node's links) really runs."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    _hash: int | None = PrivateAttr(None)
    _value_key: str | None = PrivateAttr(None)

    schema_version: Literal[1]
    name: str
    source: Literal["published", "measured"]
    gpu: str = Field(description="The GpuSpec name this profile describes.")
    device: DeviceInfo = DeviceInfo()
    gemm: GemmParams
    gemm_fp8: GemmParams | None = Field(
        None, description="FP8 GEMMs (Hopper and later), against the fp8 dense peak; None where none is known."
    )
    elementwise: ElementwiseParams
    attention: AttentionParams = Field(description="The fused attention kernel Megatron's --attention-backend auto "
                                                    "runs on this GPU, and any backend attention_kernels leaves out.")
    attention_kernels: dict[Literal["flash", "fused"], AttentionParams] = Field(
        default_factory=dict, description="The kernel a backend runs where it is not attention's: on Hopper, auto "
                                          "and fused run cuDNN's fused attention and flash runs FlashAttention-2.")
    collectives: CollectiveParams
    host: HostParams | None = Field(
        None, description="Host-side (CPU) cost of issuing work; None = the device never waits for the host.")
    overlap_compute_slowdown: float = Field(
        ge=0, lt=1, description="Fraction by which compute slows while an NCCL kernel runs beside it."
    )
    overlap_source: str
    host_sharing_slowdown: float = Field(
        0.0, ge=0, lt=1, description="Fraction by which a device's compute slows while every other device of its "
                                     "machine computes too (cores sharing caches and memory bandwidth); scaled by "
                                     "the share of the machine's other devices a plan keeps busy.")
    host_sharing_source: str = ("not measured; taken as 0: a GPU's SMs and memory are its own, and what its node's "
                                "host shares (issuing work) is in the host block")
    step_jitter: float = Field(
        0.0, ge=0, lt=1, description="Relative standard deviation of a rank's compute between two synchronisations, "
                                     "independent from rank to rank: what makes a pipeline stage wait for a late "
                                     "input more often than the mean times say (simulator.cost.jitter).")
    step_jitter_source: str = ("not measured; taken as 0: each step takes its expected time, so a wait is the "
                               "difference of expected times")
    sequence_slowdown: float = Field(
        0.0, ge=0, lt=2, description="Fraction by which a training step's ops run slower one after another, as "
                                     "autograd issues them, than each repeated alone as the kernel benchmarks time "
                                     "them (each finding the caches and the allocator as the previous op left "
                                     "them); applied to the forward, backward and recompute compute ops.")
    sequence_source: str = ("not measured; taken as 0: an op in a step costs what it costs repeated alone (on a GPU "
                            "the host issues ahead, and a kernel's start waits for no bookkeeping of the last)")
    sustained_clock_fraction: float = Field(
        1.0, gt=0, le=1, description="Tensor-core throughput a device sustains through a long run at its power "
                                     "limit, as a fraction of what the GEMM and attention blocks' burst "
                                     "benchmarks measured; applied to GEMMs and fused attention (memory-bound "
                                     "kernels do not wait on the SM clock).")
    sustained_clock_source: str = ("not measured; taken as 1: the kernels run as fast in a long run as in the "
                                   "short benchmarks the GEMM and attention blocks were fitted to")
    device_speed_spread: float = Field(
        0.0, ge=0, lt=0.5, description="Relative standard deviation of speed from one device of this type to "
                                       "another (silicon, power and cooling): a synchronous job waits at every "
                                       "collective for its slowest device, so its compute runs at the expected "
                                       "slowest of its devices, 1 + spread x E[max of N standard normals].")
    device_speed_spread_source: str = ("not measured; taken as 0: every device of a type as fast as the one the "
                                       "benchmarks timed")
    run_calibration: RunCalibration | None = Field(
        None, description="Set when the profile was fitted to measured runs (calibrate --from-runs): which runs, "
                          "what the fit set, and the band its leave-one-run-out errors give.")
    ranges: dict[str, tuple[float, float]] = Field(
        default_factory=dict, description="Plausible (low, high) of this profile's own numbers that no measurement "
                                          "pins for every device (overlap_compute_slowdown, "
                                          "sustained_clock_fraction, device_speed_spread).")
    notes: str = ""

    @model_validator(mode="after")
    def _ranges_hold_their_values(self) -> "HardwareProfile":
        for name in self.ranges:
            if name not in ("overlap_compute_slowdown", "sustained_clock_fraction", "device_speed_spread"):
                raise ValueError(f"the profile has a range for {name!r}, which is not one of its own numbers; "
                                 "put it in the block the number belongs to")
        for path, holder, name, low, high in self._ranged():
            _check_range(path, getattr(holder, name), low, high, type(holder).model_fields[name].metadata)
        return self

    def _ranged(self) -> list[tuple[str, BaseModel, str, float, float]]:
        """(path, the model holding the number, its name, low, high) of every number a range is declared for."""
        out = [(name, self, name, low, high) for name, (low, high) in sorted(self.ranges.items())]
        blocks = [("gemm", self.gemm), ("gemm_fp8", self.gemm_fp8), ("elementwise", self.elementwise),
                  ("attention", self.attention),
                  *((f"attention_kernels.{name}", block) for name, block in sorted(self.attention_kernels.items())),
                  ("collectives.nvlink", self.collectives.nvlink),
                  ("collectives.network", self.collectives.network), ("host", self.host)]
        for path, block in blocks:
            if block is not None:
                out += [(f"{path}.{name}", block, name, low, high) for name, (low, high) in sorted(block.ranges.items())]
        return out

    def unpinned(self) -> list[tuple[str, float, float, float]]:
        """(path, value, low, high) of every number a range is declared for, e.g. ``gemm.k_half``."""
        return [(path, float(getattr(holder, name)), low, high) for path, holder, name, low, high in self._ranged()]

    def with_value(self, path: str, value: float) -> "HardwareProfile":
        """This profile with the number at ``path`` (as ``unpinned`` names it) set to ``value``."""
        *parents, name = path.split(".")
        return self.with_update(".".join(parents), {name: value})

    def with_update(self, block: str, update: dict[str, Any]) -> "HardwareProfile":
        """This profile with the fields of the block at ``block`` (``""``: the profile's own) updated."""
        parents = block.split(".") if block else []
        chain: list[Any] = [self]
        for part in parents:
            chain.append(_child(chain[-1], part))
        new: Any = chain[-1].model_copy(update=update)
        for parent, part in zip(reversed(chain[:-1]), reversed(parents)):
            new = {**parent, part: new} if isinstance(parent, dict) else parent.model_copy(update={part: new})
        assert isinstance(new, HardwareProfile)
        return new

    def at(self, path: str) -> Any:
        """What ``path`` names (``gemm.k_half``, ``attention_kernels.flash``): a number, a block or None."""
        obj: Any = self
        for part in path.split("."):
            obj = _child(obj, part)
        return obj

    def attention_for(self, backend: str) -> AttentionParams:
        """The fused attention kernel Megatron's ``--attention-backend`` ``backend`` runs on this GPU."""
        return self.attention_kernels.get(backend, self.attention)  # type: ignore[call-overload]

    def model_copy(self, *, update=None, deep: bool = False) -> "HardwareProfile":
        new = super().model_copy(update=update, deep=deep)
        new._hash = new._value_key = None  # a copy carries the original's cached hash and key
        return new

    def value_key(self) -> str:
        """Every field as one string (computed once: it holds the fit points), what caches key on."""
        if self._value_key is None:
            self._value_key = self.model_dump_json()
        return self._value_key

    def __hash__(self) -> int:
        # Cost models are cached per profile; the dict-valued sources make the default hash fail,
        # and the JSON (with its fit points) is too long to serialise on every lookup.
        if self._hash is None:
            self._hash = hash(self.value_key())
        return self._hash

    def __eq__(self, other: object) -> bool:
        # the cached hash is bookkeeping, not part of the value
        return isinstance(other, HardwareProfile) and self.__dict__ == other.__dict__


def _child(obj: Any, part: str) -> Any:
    return obj[part] if isinstance(obj, dict) else getattr(obj, part)


def profile_names() -> list[str]:
    return sorted(p.stem for p in _profile_dir().glob("*.json"))


def _parse(text: str, where: str) -> HardwareProfile:
    data = parse_json(text, f"profile {where}", ProfileError, fix="fix it or rebuild it with `simulator calibrate`")
    if not isinstance(data, dict):
        raise ProfileError(f"profile {where} must hold a JSON object, not {type(data).__name__}; rebuild it")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):  # true is not 1 in a file
        raise ProfileError(f"profile {where} has schema_version={short_repr(version)} but this simulator reads "
                           f"version {SCHEMA_VERSION}; rebuild the profile with this version")
    try:
        return validate_file_data(HardwareProfile, data)
    except ValidationError as exc:
        err, message = exc.errors()[0], validation_message(exc, "profile")
        if err["type"] == "value_error" and err["loc"]:  # a block's own rule: say which block
            message = f"in {'.'.join(str(p) for p in err['loc'])}, {message}"
        raise ProfileError(f"profile {where}: {message}; fix the file or rebuild it") from None


def load_profile(path_or_name: str | os.PathLike) -> HardwareProfile:
    """A shipped profile by name (``a100-sxm4-80gb-published``) or a JSON file.

    A name is looked up among the shipped profiles only, never joined to their folder as a path,
    so a name such as ``../x`` cannot reach a file elsewhere.
    """
    text_name = str(path_or_name)
    if text_name in profile_names():
        path = _profile_dir() / f"{text_name}.json"
    else:
        path = check_name(path_or_name, "profile file", ProfileError)
        if not exists(path, "profile"):
            raise ProfileError(f"unknown profile {short_repr(text_name)}; use one of {', '.join(profile_names())} "
                               "or the path of a profile JSON file")
    return _parse(read_text(path, "profile", ProfileError), repr(str(path)))


@lru_cache(maxsize=16)
def default_profile(gpu_name: str) -> HardwareProfile:
    """The published profile of a GPU (``A100-SXM4-80GB`` -> ``a100-sxm4-80gb-published``).

    Cached: profiles are frozen, and one instance per GPU keeps the cost-model caches keyed on it
    warm across the thousands of plans a search costs.
    """
    name = f"{gpu_name.lower()}-published"
    if name not in profile_names():
        raise ProfileError(f"no published profile for GPU {short_repr(gpu_name)}; pass --profile with a measured "
                           f"profile or use one of {', '.join(profile_names())}")
    return load_profile(name)


def save_profile(profile: HardwareProfile, path: str | os.PathLike) -> Path:
    """Write a profile atomically (see ``simulator.spec._io.write_output``)."""
    return write_output(path, profile.model_dump_json(indent=2) + "\n", "profile")
