"""The closed sets a plan chooses from, as enums of Megatron's flag values (recompute granularity and method,
precision, FP8 recipe, optimizer-state dtypes, context-parallel exchange, attention backend, data-parallel
sharding, MoE dispatcher, pipeline schedule), and ``RecomputePolicy``, the recompute flags as one value.

Every layer of the package names these, most of them without needing a whole plan.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

from simulator.spec import limits


class RecomputeGranularity(str, Enum):
    none = "none"
    selective = "selective"  # the attention core only (Korthikanti Section 5)
    full = "full"  # whole layers, keeping only their inputs


class RecomputeMethod(str, Enum):
    uniform = "uniform"  # checkpoint every group of `num_layers` layers
    block = "block"  # checkpoint only the first `num_layers` layers of each stage (chunk)


class Precision(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"  # the reference loop on CPUs

    @property
    def activation_bytes(self) -> int:
        return 4 if self is Precision.fp32 else 2


class Fp8Format(str, Enum):
    """Transformer Engine's FP8 recipes (Megatron ``--fp8-format``); both run at the same tensor-core peak."""

    hybrid = "hybrid"  # e4m3 forward, e5m2 gradients
    e4m3 = "e4m3"  # e4m3 throughout


class StateDtype(str, Enum):
    """What the precision-aware optimizer keeps a tensor in (Megatron's --main-grads-dtype, --main-params-dtype,
    --exp-avg-dtype, --exp-avg-sq-dtype; each flag takes only some of them)."""

    fp32 = "fp32"
    fp16 = "fp16"
    bf16 = "bf16"
    fp8 = "fp8"

    @property
    def bytes(self) -> int:
        return {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}[self.value]


class CpCommType(str, Enum):
    """How context parallelism exchanges keys and values (Megatron ``--cp-comm-type``)."""

    p2p = "p2p"  # ring attention: KV blocks passed around the CP group, overlapped with each block's attention
    a2a = "a2a"  # all-to-all to heads, attention over the whole sequence, all-to-all back (Ulysses)
    allgather = "allgather"  # all-gather KV, attention, reduce-scatter of its gradient


class AttentionBackend(str, Enum):
    """Megatron's ``--attention-backend``: auto picks Transformer Engine's flash or fused kernels."""

    auto = "auto"
    flash = "flash"
    fused = "fused"
    unfused = "unfused"  # Megatron's own path: QK^T, softmax, dropout and the product with V apart
    local = "local"  # Megatron-Core's unfused local implementation

    @property
    def fused_kernel(self) -> bool:
        return self not in (AttentionBackend.unfused, AttentionBackend.local)


class DataParallelSharding(str, Enum):
    """Megatron-FSDP's ``--data-parallel-sharding-strategy``: what is sharded over the data-parallel ranks."""

    no_shard = "no_shard"
    optim = "optim"  # the distributed optimizer (ZeRO-1)
    optim_grads = "optim_grads"  # and the gradients (ZeRO-2)
    optim_grads_params = "optim_grads_params"  # and the parameters (ZeRO-3, FSDP)

    @property
    def megatron_fsdp(self) -> bool:
        """Whether Megatron runs this level as Megatron-FSDP (``optim`` is the distributed optimizer itself)."""
        return self in (DataParallelSharding.optim_grads, DataParallelSharding.optim_grads_params)


class MoEDispatcher(str, Enum):
    """Megatron's --moe-token-dispatcher-type."""

    alltoall = "alltoall"
    allgather = "allgather"


class PipelineSchedule(str, Enum):
    gpipe = "gpipe"
    one_f_one_b = "1f1b"  # interleaved when virtual_pipeline_stages > 1


class RecomputePolicy(BaseModel):
    """Megatron's --recompute-granularity / --recompute-method / --recompute-num-layers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    granularity: RecomputeGranularity = RecomputeGranularity.none
    method: RecomputeMethod = RecomputeMethod.uniform
    num_layers: int = Field(
        1, gt=0, le=limits.MAX_LAYERS,
        description="full/uniform: layers per checkpointed group; full/block: checkpointed layers per chunk.",
    )
