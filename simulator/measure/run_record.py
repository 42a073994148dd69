"""``RunRecord``: what one run of the reference training loop measured, as the simulator reads it.

The loop (``calibration/reference/train.py``) writes it; ``simulator validate`` compares it with
the predictions for the same model and plan. No torch here: the simulator reads records on
machines without it. A record is written only when the run finishes (to a temporary file renamed
into place), so a crashed run leaves none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from simulator.spec import limits
from simulator.spec._io import parse_json, read_text, validate_file_data, validation_message, write_output
from simulator.spec.errors import RunRecordError
from simulator.spec.model import ModelSpec
from simulator.spec.plan import ParallelPlan, RecomputeGranularity

FORMAT_VERSION = 1

# What a measurement can be: a time of a layer, an iteration or a timer is finite and under a day
# (limits.MEASURED_SECONDS_RANGE; a timer that never ran reads 0); a byte count fits in a machine; a loss is
# a cross-entropy, at least 0 and (with a vocabulary of at most a few million) far below 1,000. A NaN loss
# is a diverged run, not a record to validate against.
_SECONDS = dict(ge=0, le=limits.MEASURED_SECONDS_RANGE["le"])
_BYTES = dict(ge=0, le=2**60)
Seconds = Annotated[float, Field(**limits.MEASURED_SECONDS_RANGE)]
TimerSeconds = Annotated[float, Field(**_SECONDS)]
Loss = Annotated[float, Field(ge=0, le=1_000.0)]
LoadAverage = Annotated[float, Field(**limits.LOAD_AVERAGE_RANGE)]


class LayerRecord(BaseModel):
    """One transformer layer, one micro-batch, measured on its stage's TP, CP and DP rank 0."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    index: int = Field(ge=0, lt=limits.MAX_LAYERS, description="Global layer index.")
    stage: int = Field(ge=0, lt=limits.MAX_GPUS, description="Pipeline stage that holds the layer.")
    chunk: int = Field(ge=0, lt=limits.MAX_LAYERS, description="Model chunk on that stage (interleaved schedule).")
    recompute_granularity: RecomputeGranularity = Field(
        description="What applied to this layer (block recompute leaves the later layers of a chunk at 'none')."
    )
    forward_s: float | None = Field(None, description="Mean forward time per micro-batch, s.", **_SECONDS)
    backward_s: float | None = Field(None, description="Mean backward time without the recompute, s.", **_SECONDS)
    recompute_s: float | None = Field(
        None, description="Mean time replaying recomputed ops in backward, s.", **_SECONDS
    )
    activation_bytes: int = Field(
        description="Bytes saved for backward, storages counted once, no parameters.", **_BYTES
    )
    norm_statistics_bytes: int = Field(
        **_BYTES, description="LayerNorm's fp32 mean and 1/std per token, which the memory model leaves out."
    )


class RunRecord(BaseModel):
    """One reference run: the job in the simulator's own spec format and what it measured."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    format_version: int = Field(FORMAT_VERSION, description="Bumped when fields change meaning.")
    model: ModelSpec
    plan: ParallelPlan
    cluster: str = Field(description="Cluster spec the predictions use (local-cpu for CPU runs).")
    device: str = Field(description="What ran it, e.g. 'cpu (16 threads)' or 'cuda: NVIDIA H100 80GB HBM3'.")
    world_size: int = Field(gt=0, le=limits.MAX_GPUS)
    torch_version: str
    seed: int = Field(0, ge=0, le=limits.MAX_SEED)
    warmup_iterations: int = Field(
        0, ge=0, le=limits.MAX_ITERATIONS, description="Leading iterations left out of the layer times.")
    iteration_times_s: list[Seconds] = Field(
        max_length=limits.MAX_ITERATIONS, description="Wall time of each iteration, slowest rank, s.")
    losses: list[Loss] = Field(
        max_length=limits.MAX_ITERATIONS, description="Mean training loss of each iteration over the global batch.")
    layers: list[LayerRecord] = Field(max_length=limits.MAX_LAYERS)
    peak_allocated_bytes_per_stage: list[Annotated[int, Field(**_BYTES)]] | None = Field(
        None, max_length=limits.MAX_GPUS,
        description="torch.cuda.max_memory_allocated, largest over a stage's ranks (null on CPU).")
    threads_per_rank: int | None = Field(
        None, gt=0, le=limits.MAX_THREADS,
        description="Torch threads each rank ran with, set and checked by the loop (null: not recorded).")
    load_average: tuple[LoadAverage, LoadAverage, LoadAverage] | None = Field(
        None, description="1, 5 and 15-minute load averages when the run began: how busy the machine was.")
    timers: dict[str, list[list[TimerSeconds]]] | None = Field(
        None, description="Megatron's per-rank timers (forward-compute, backward-compute, forward-recv, "
                          "forward-send, backward-recv, backward-send, layernorm-grads-all-reduce, "
                          "embedding-grads-all-reduce, grads-all-reduce, optimizer, iteration): name -> one list "
                          "per iteration, warm-up included, of one total per global rank, s.")

    @model_validator(mode="after")
    def _consistent(self) -> "RunRecord":
        if self.format_version != FORMAT_VERSION:
            raise ValueError(f"format_version={self.format_version} is not {FORMAT_VERSION}; rerun the reference loop")
        if self.world_size != self.plan.num_gpus:
            raise ValueError(f"world_size={self.world_size} differs from the plan's {self.plan.num_gpus} GPUs")
        if not self.iteration_times_s or len(self.losses) != len(self.iteration_times_s):
            raise ValueError(
                f"{len(self.iteration_times_s)} iteration times and {len(self.losses)} losses; "
                "a finished run has one of each per iteration"
            )
        if sorted(layer.index for layer in self.layers) != list(range(self.model.num_layers)):
            raise ValueError(f"layers must list each of the {self.model.num_layers} layers once")
        for name, per_iteration in (self.timers or {}).items():
            if len(per_iteration) != len(self.iteration_times_s) or any(
                    len(ranks) != self.world_size for ranks in per_iteration):
                raise ValueError(f"timer {name!r} must have one list per iteration ({len(self.iteration_times_s)}) "
                                 f"of {self.world_size} times, one per rank")
        return self

    @property
    def timed_iteration_times_s(self) -> list[float]:
        """Iteration times after the warm-up (all of them if there was nothing else)."""
        return self.iteration_times_s[self.warmup_iterations:] or self.iteration_times_s


def load_run_record(path: str | Path) -> RunRecord:
    """Read and check a record; every failure is one RunRecordError sentence."""
    path = Path(path)
    text = read_text(path, "run record", RunRecordError, fix=f"run 'simulator reference --out {path}' first")
    data = parse_json(text, f"run record {str(path)!r}", RunRecordError, fix="rerun the reference loop")
    if not isinstance(data, dict):
        raise RunRecordError(f"run record {str(path)!r} must hold a JSON object, not {type(data).__name__}")
    try:
        return validate_file_data(RunRecord, data)
    except ValidationError as exc:
        raise RunRecordError(f"run record {str(path)!r} is malformed: {validation_message(exc, 'run record')}") from None


def write_run_record(record: RunRecord, path: str | Path) -> None:
    """Write atomically: a reader never sees half a record (see ``simulator.spec._io.write_output``)."""
    write_output(path, record.model_dump_json(indent=2) + "\n", "run record")
