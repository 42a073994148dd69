"""``ParallelPlan``: how a model is laid out on GPUs (parallel sizes, batch, recompute, optimizer and
precision), with every rule that needs only the plan as one of its validators.

Rules that need the model or the cluster as well (heads, layers, GPUs per node) are validators of
``Job``, in ``simulator.spec.plan``. Each message names the values and the fix.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.spec import limits
from simulator.spec.plan_types import (
    AttentionBackend,
    CpCommType,
    DataParallelSharding,
    Fp8Format,
    MoEDispatcher,
    PipelineSchedule,
    Precision,
    RecomputeGranularity,
    RecomputePolicy,
    StateDtype,
)


def megatron_work_queues(sharding: DataParallelSharding, tensor_parallel_size: int, context_parallel_size: int) -> int:
    """CUDA_DEVICE_MAX_CONNECTIONS as Megatron's launch sets it: CUDA's default of 8 under Megatron-FSDP (which
    asserts it) or without TP and CP, else 1, so each collective is issued before the GEMM it overlaps."""
    return 8 if sharding.megatron_fsdp or tensor_parallel_size * context_parallel_size == 1 else 1


# the dtypes Megatron's arguments.py lets each flag take
_STATE_DTYPE_CHOICES = {"main_grads_dtype": ("fp32", "bf16"), "main_params_dtype": ("fp32", "fp16"),
                        "exp_avg_dtype": ("fp32", "fp16", "bf16", "fp8"),
                        "exp_avg_sq_dtype": ("fp32", "fp16", "bf16", "fp8")}


class ParallelPlan(BaseModel):
    """One training layout: parallel sizes, batch, recompute, optimizer and precision."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tensor_parallel_size: int = Field(
        1, gt=0, le=limits.MAX_GPUS, description="TP ranks that split each layer (Megatron column/row parallel).")
    context_parallel_size: int = Field(
        1, gt=0, le=limits.MAX_GPUS,
        description="CP ranks that split every sequence (Megatron --context-parallel-size): each holds s / cp "
                    "tokens, in 2 cp load-balanced chunks for causal attention.")
    cp_comm_type: CpCommType = Field(CpCommType.p2p, description="How CP exchanges keys and values.")
    pipeline_parallel_size: int = Field(1, gt=0, le=limits.MAX_GPUS, description="Pipeline stages.")
    data_parallel_size: int = Field(1, gt=0, le=limits.MAX_GPUS, description="Model replicas.")
    expert_model_parallel_size: int = Field(
        1, gt=0, le=limits.MAX_GPUS,
        description="EP: ranks the routed experts of each MoE layer are spread over (Megatron "
                    "--expert-model-parallel-size), within the TP x CP x DP ranks of a stage.")
    expert_tensor_parallel_size: int | None = Field(
        None, gt=0, le=limits.MAX_GPUS,
        description="Ranks each expert is split over (--expert-tensor-parallel-size); None = TP, as "
                    "Megatron defaults it.")
    moe_token_dispatcher_type: MoEDispatcher = Field(
        MoEDispatcher.allgather, description="How routed tokens reach their experts (Megatron's default allgather).")
    moe_grouped_gemm: bool = Field(False, description="A rank's experts run as one grouped GEMM (--moe-grouped-gemm).")
    virtual_pipeline_stages: int = Field(
        1, gt=0, le=limits.MAX_LAYERS, description="Model chunks per pipeline stage (interleaved 1F1B).")
    sequence_parallel: bool = Field(False, description="Split norms/dropouts along the sequence (Korthikanti Section 4.2.2).")
    micro_batch_size: int = Field(1, gt=0, le=limits.MAX_MICRO_BATCH_SIZE, description="Sequences per micro-batch, b.")
    global_batch_size: int = Field(
        1, gt=0, le=limits.MAX_GLOBAL_BATCH_SIZE, description="Sequences per iteration, all replicas together."
    )
    recompute: RecomputePolicy = RecomputePolicy()
    use_distributed_optimizer: bool = Field(False, description="Shard fp32 master weights and Adam state over DP (ZeRO-1).")
    data_parallel_sharding_strategy: DataParallelSharding | None = Field(
        None, description="What is sharded over the data-parallel ranks (Megatron-FSDP); None = optim with the "
                          "distributed optimizer, else no_shard.")
    precision: Precision = Precision.bf16
    accumulate_allreduce_grads_in_fp32: bool | None = Field(
        None, description="Keep the gradient buffer (main_grad) and its data-parallel reduction in fp32. None = "
                          "Megatron's default: fp32 under bf16 (which forces it), the model's 2-byte dtype under fp16.")
    grad_reduce_in_bf16: bool = Field(
        False, description="bf16 training: keep the gradient buffer (main_grad) and its data-parallel reduction in "
                           "bf16, 2 bytes a parameter instead of 4 (Megatron --grad-reduce-in-bf16).")
    use_precision_aware_optimizer: bool = Field(
        False, description="Transformer Engine's FusedAdam keeps master weights and Adam moments in the dtypes "
                           "below (Megatron --use-precision-aware-optimizer; needs the distributed optimizer).")
    main_grads_dtype: StateDtype = Field(
        StateDtype.fp32, description="Precision-aware optimizer: the gradient buffer's dtype (fp32 or bf16).")
    main_params_dtype: StateDtype = Field(
        StateDtype.fp32, description="Precision-aware optimizer: the master weights' dtype (fp32 or fp16).")
    exp_avg_dtype: StateDtype = Field(
        StateDtype.fp32, description="Precision-aware optimizer: Adam's first moment (fp32, fp16, bf16 or fp8).")
    exp_avg_sq_dtype: StateDtype = Field(
        StateDtype.fp32, description="Precision-aware optimizer: Adam's second moment (fp32, fp16, bf16 or fp8).")
    store_param_remainders: bool = Field(
        True, description="Precision-aware optimizer with bf16 weights and fp32 master weights: keep only the 16 "
                          "bits of each master weight the bf16 weight lacks, 2 bytes instead of 4 (Megatron's "
                          "default; --no-store-param-remainders turns it off).")
    fp8_param_gather: bool = Field(
        False, description="FP8 plans: keep the linear layers' weights in FP8 (1 byte instead of 2) and all-gather "
                           "them in FP8 (Megatron --fp8-param-gather; needs the distributed optimizer).")
    fp8_format: Fp8Format | None = Field(
        None,
        description="Run the transformer layers' linear GEMMs (QKV, projection, fc1, fc2: forward, dgrad, wgrad) "
        "in FP8 on Hopper, as Transformer Engine does, with its casts of inputs and output gradients (and their "
        "transposes); each linear layer saves its FP8 input. Attention, the output layer and every other "
        "activation stay in `precision`. None = no FP8.",
    )
    attention_backend: AttentionBackend = Field(
        AttentionBackend.auto, description="Megatron's --attention-backend; auto, flash and fused never materialise "
                                           "the s x s scores, unfused and local do.")
    use_flash_attention: bool = Field(
        True, description="A fused attention kernel (what attention_backend says; kept as the older flag's name).")
    overlap_grad_reduce: bool = Field(
        False, description="Reduce DP gradients in buckets during the last micro-batch's backward (Megatron-Core DDP).")
    overlap_param_gather: bool = Field(
        False, description="Distributed optimizer: all-gather the updated parameters bucket by bucket during the next "
                           "forward instead of after the optimizer step.")
    ddp_bucket_size: int | None = Field(
        None, gt=0, le=limits.MAX_DDP_BUCKET_SIZE,
        description="Parameters per gradient bucket; None = Megatron's max(40M, 1M x DP).")
    tp_comm_overlap: bool = Field(
        False, description="Pipeline SP's all-gathers and reduce-scatters with their GEMMs chunk by chunk "
                           "(Transformer Engine userbuffers, --tp-comm-overlap); needs sequence parallelism.")
    overlap_p2p_comm: bool = Field(
        False, description="Pipeline sends run beside compute; off = Megatron's blocking send/receive exchange."
    )
    cuda_device_max_connections: int | None = Field(
        None, ge=1, le=32,
        description="CUDA work queues per GPU (the CUDA_DEVICE_MAX_CONNECTIONS the job runs with); None = what "
                    "Megatron's launch sets: 1 with TP or CP, CUDA's default of 8 under Megatron-FSDP (which "
                    "asserts it). With more than one queue the GEMM issued after a collective Megatron means to "
                    "overlap with it can take the SMs first, so the collective runs after the GEMM.")
    schedule: PipelineSchedule = PipelineSchedule.one_f_one_b
    allow_tp_across_nodes: bool = Field(False, description="Accept tensor parallelism wider than a node.")
    pipeline_layer_split: tuple[int, ...] | None = Field(
        None, max_length=limits.MAX_LAYERS,
        description="Layers per stage when they do not divide evenly (sums to num_layers).",
    )
    decoder_first_pipeline_num_layers: int | None = Field(
        None, gt=0, le=limits.MAX_LAYERS, description="Transformer layers of the first stage; the others share the rest evenly.")
    decoder_last_pipeline_num_layers: int | None = Field(
        None, gt=0, le=limits.MAX_LAYERS, description="Transformer layers of the last stage.")
    account_for_embedding_in_pipeline_split: bool = Field(
        False, description="Count the input embedding as a layer of the first stage when splitting.")
    account_for_loss_in_pipeline_split: bool = Field(
        False, description="Count the output layer and loss as a layer of the last stage when splitting.")

    @model_validator(mode="before")
    @classmethod
    def _attention_flags_agree(cls, data):
        """``use_flash_attention`` and ``attention_backend`` say one thing; either may be given."""
        if not isinstance(data, dict):
            return data
        flash, backend = data.get("use_flash_attention"), data.get("attention_backend")
        if backend is not None and flash is None:
            return {**data, "use_flash_attention": AttentionBackend(backend).fused_kernel}
        if flash is not None and backend is None:
            return {**data, "attention_backend": AttentionBackend.auto if flash else AttentionBackend.unfused}
        if flash is not None and backend is not None and AttentionBackend(backend).fused_kernel != bool(flash):
            raise ValueError(f"attention_backend={AttentionBackend(backend).value!r} and use_flash_attention={flash} "
                             "disagree; give one of them")
        return data

    @model_validator(mode="before")
    @classmethod
    def _queues_megatron_would_set_are_no_choice(cls, data):
        """A plan naming the work queues Megatron's launch sets anyway is the plan that names none."""
        if not isinstance(data, dict) or data.get("cuda_device_max_connections") is None:
            return data
        sizes = (data["cuda_device_max_connections"], data.get("tensor_parallel_size", 1),
                 data.get("context_parallel_size", 1))
        if any(type(x) is not int for x in sizes):
            return data  # the field validators name the bad value
        try:
            sharding = DataParallelSharding(data.get("data_parallel_sharding_strategy"))
        except ValueError:  # none given (the distributed optimizer's level is no FSDP either), or a bad one
            sharding = DataParallelSharding.no_shard
        queues, tp, cp = sizes
        if queues == megatron_work_queues(sharding, tp, cp):
            return {k: v for k, v in data.items() if k != "cuda_device_max_connections"}
        return data

    @property
    def num_gpus(self) -> int:
        return (self.tensor_parallel_size * self.context_parallel_size * self.pipeline_parallel_size
                * self.data_parallel_size)

    @property
    def expert_tp_size(self) -> int:
        return self.expert_tensor_parallel_size if self.expert_tensor_parallel_size is not None else self.tensor_parallel_size

    @property
    def expert_data_parallel_size(self) -> int:
        """Ranks holding the same experts: the TP x CP x DP ranks of a stage over ETP x EP."""
        return (self.tensor_parallel_size * self.context_parallel_size * self.data_parallel_size
                // (self.expert_tp_size * self.expert_model_parallel_size))

    @property
    def gradient_group_size(self) -> int:
        """Ranks that hold the same parameters: DP x CP, over which gradients are reduced and sharded."""
        return self.data_parallel_size * self.context_parallel_size

    @property
    def sharding(self) -> DataParallelSharding:
        if self.data_parallel_sharding_strategy is not None:
            return self.data_parallel_sharding_strategy
        return DataParallelSharding.optim if self.use_distributed_optimizer else DataParallelSharding.no_shard

    @property
    def shards_optimizer(self) -> bool:
        """Optimizer state (and the gradient reduction to a reduce-scatter) sharded over the DP x CP ranks."""
        return self.sharding is not DataParallelSharding.no_shard

    @property
    def num_micro_batches(self) -> int:
        """Micro-batches each pipeline plays per iteration."""
        return self.global_batch_size // (self.micro_batch_size * self.data_parallel_size)

    @property
    def work_queues(self) -> int:
        """CUDA_DEVICE_MAX_CONNECTIONS as the job runs: given, or as Megatron's launch sets it."""
        if self.cuda_device_max_connections is not None:
            return self.cuda_device_max_connections
        return megatron_work_queues(self.sharding, self.tensor_parallel_size, self.context_parallel_size)

    @property
    def collectives_issued_in_order(self) -> bool:
        """Whether a collective Megatron issues before a GEMM starts before it: only from a single work queue
        (Megatron's comment on its asynchronous input-gradient all-reduce: the order 'is necessary for a
        speedup but not for correctness')."""
        return self.work_queues == 1

    @property
    def interleaved(self) -> bool:
        return self.virtual_pipeline_stages > 1

    @property
    def grad_bytes(self) -> int:
        """Bytes per element of the gradient buffer the weight gradients accumulate into and DP reduces."""
        if self.precision is Precision.fp32:
            return 4
        if self.bf16_gradients:
            return 2
        fp32 = self.accumulate_allreduce_grads_in_fp32
        return 4 if (fp32 if fp32 is not None else self.precision is Precision.bf16) else 2

    @property
    def bf16_gradients(self) -> bool:
        """bf16 training whose gradients stay in bf16 (--grad-reduce-in-bf16, or --main-grads-dtype bf16)."""
        return self.precision is Precision.bf16 and (self.grad_reduce_in_bf16
                                                     or self.main_grads_dtype is StateDtype.bf16)

    @property
    def optimizer_state_bytes(self) -> int:
        """Optimizer bytes per parameter under mixed precision: master weight, Adam's m and v (12 by default;
        the precision-aware optimizer's dtypes, and its 2-byte remainders of fp32 master weights over bf16)."""
        master = self.main_params_dtype.bytes
        if (self.use_precision_aware_optimizer and self.store_param_remainders and master == 4
                and self.precision is Precision.bf16):
            master = 2
        return master + self.exp_avg_dtype.bytes + self.exp_avg_sq_dtype.bytes

    @property
    def gathered_param_bytes(self) -> int:
        """Bytes per parameter of the sharded optimizer's parameter all-gather: the model's 2-byte weights, or
        FP8 with fp8_param_gather (the embedding and norms, a few percent, are counted as FP8 too)."""
        return 1 if self.fp8_param_gather else self.precision.activation_bytes

    @model_validator(mode="after")
    def _context_parallel_needs_a_fused_kernel(self) -> "ParallelPlan":
        if self.context_parallel_size > 1 and not self.use_flash_attention:
            raise ValueError(f"context_parallel_size={self.context_parallel_size} runs Transformer Engine's fused "
                             f"attention; use attention_backend auto, flash or fused (not "
                             f"{self.attention_backend.value!r})")
        return self

    @model_validator(mode="after")
    def _sharding_agrees_with_the_distributed_optimizer(self) -> "ParallelPlan":
        s = self.data_parallel_sharding_strategy
        if s is DataParallelSharding.no_shard and self.use_distributed_optimizer:
            raise ValueError("data_parallel_sharding_strategy='no_shard' contradicts use_distributed_optimizer; "
                             "drop one of them")
        return self

    @model_validator(mode="after")
    def _tp_comm_overlap_needs_sp(self) -> "ParallelPlan":
        if self.tp_comm_overlap and not self.sequence_parallel:
            raise ValueError("tp_comm_overlap pipelines sequence parallelism's collectives, so it needs "
                             "sequence_parallel (and TP > 1); turn SP on or drop tp_comm_overlap")
        return self

    @model_validator(mode="after")
    def _param_gather_overlap_needs_its_parts(self) -> "ParallelPlan":
        if self.overlap_param_gather and not (self.use_distributed_optimizer and self.overlap_grad_reduce):
            raise ValueError("overlap_param_gather needs use_distributed_optimizer and overlap_grad_reduce "
                             "(Megatron's rule); turn both on or drop overlap_param_gather")
        return self

    @model_validator(mode="after")
    def _bf16_accumulates_in_fp32(self) -> "ParallelPlan":
        if self.precision is Precision.bf16 and self.accumulate_allreduce_grads_in_fp32 is False \
                and not self.bf16_gradients:
            raise ValueError("bf16 training accumulates and all-reduces gradients in fp32 unless told to keep them in "
                             "bf16; drop accumulate_allreduce_grads_in_fp32=False or set grad_reduce_in_bf16")
        if self.bf16_gradients and self.accumulate_allreduce_grads_in_fp32:
            raise ValueError("accumulate_allreduce_grads_in_fp32 contradicts grad_reduce_in_bf16 / main_grads_dtype "
                             "bf16; drop one of them")
        if self.grad_reduce_in_bf16 and self.precision is not Precision.bf16:
            raise ValueError(f"grad_reduce_in_bf16 is for bf16 training, not {self.precision.value}; use precision "
                             "bf16 or drop it")
        return self

    @model_validator(mode="after")
    def _optimizer_dtypes_need_the_precision_aware_optimizer(self) -> "ParallelPlan":
        for name, allowed in _STATE_DTYPE_CHOICES.items():
            value = getattr(self, name)
            if value.value not in allowed:
                raise ValueError(f"{name}={value.value!r} is not one Megatron takes; use {' or '.join(allowed)}")
            if value is not StateDtype.fp32 and not self.use_precision_aware_optimizer:
                raise ValueError(f"{name}={value.value!r} needs use_precision_aware_optimizer (Megatron's rule); turn "
                                 "it on or keep fp32")
        if self.use_precision_aware_optimizer and not self.shards_optimizer:
            raise ValueError("use_precision_aware_optimizer runs only with the distributed optimizer (Megatron's "
                             "rule); add use_distributed_optimizer or drop it")
        if self.fp8_param_gather and (self.fp8_format is None or not self.shards_optimizer):
            raise ValueError("fp8_param_gather keeps FP8 weights for the distributed optimizer to gather, so it needs "
                             "fp8_format and use_distributed_optimizer; add them or drop fp8_param_gather")
        return self

    @model_validator(mode="after")
    def _sequence_parallel_needs_tp(self) -> "ParallelPlan":
        if self.sequence_parallel and self.tensor_parallel_size == 1:
            raise ValueError("sequence_parallel needs tensor_parallel_size > 1; raise TP or turn sequence parallelism off")
        return self

    @model_validator(mode="after")
    def _batch_divides(self) -> "ParallelPlan":
        per_step = self.micro_batch_size * self.data_parallel_size
        if self.global_batch_size % per_step:
            raise ValueError(
                f"global_batch_size={self.global_batch_size} is not divisible by micro_batch_size={self.micro_batch_size} "
                f"x data_parallel_size={self.data_parallel_size} = {per_step}; use a multiple of {per_step}"
            )
        return self

    @model_validator(mode="after")
    def _gpus_and_steps_bounded(self) -> "ParallelPlan":
        if self.num_gpus > limits.MAX_GPUS:
            raise ValueError(
                f"tensor_parallel_size={self.tensor_parallel_size} x "
                f"pipeline_parallel_size={self.pipeline_parallel_size} x "
                f"data_parallel_size={self.data_parallel_size} = {self.num_gpus:,} GPUs, more than the "
                f"{limits.MAX_GPUS:,} the simulator takes; use fewer GPUs"
            )
        chunks = self.pipeline_parallel_size * self.virtual_pipeline_stages * self.num_micro_batches
        if chunks > limits.MAX_PIPELINE_CHUNKS:
            raise ValueError(
                f"each pipeline would play {self.num_micro_batches:,} micro-batches x "
                f"{self.pipeline_parallel_size} stages x {self.virtual_pipeline_stages} chunks = {chunks:,} "
                "forward steps per iteration, more than the "
                f"{limits.MAX_PIPELINE_CHUNKS:,} the simulator plays; raise the micro-batch size or the data-parallel "
                "size, or lower the global batch"
            )
        return self

    @model_validator(mode="after")
    def _interleaving_needs_pipeline(self) -> "ParallelPlan":
        if self.interleaved:
            p = self.pipeline_parallel_size
            if p == 1:
                raise ValueError(
                    f"virtual_pipeline_stages={self.virtual_pipeline_stages} needs pipeline_parallel_size > 1; "
                    "set it to 1 or add pipeline stages"
                )
            if self.schedule is PipelineSchedule.gpipe:
                raise ValueError("virtual_pipeline_stages > 1 needs the 1f1b schedule, not gpipe")
            if self.num_micro_batches % p:
                raise ValueError(
                    f"the interleaved schedule needs the micro-batches per pipeline ({self.num_micro_batches}) to be a "
                    f"multiple of pipeline_parallel_size={p}; change the global batch or the micro-batch size"
                )
        return self

    @model_validator(mode="after")
    def _fp8_needs_mixed_precision(self) -> "ParallelPlan":
        if self.fp8_format is not None and self.precision is Precision.fp32:
            raise ValueError(
                f"fp8_format={self.fp8_format.value!r} runs beside bf16/fp16 mixed precision, not fp32; "
                "use precision bf16 or drop the FP8 format"
            )
        return self

    @model_validator(mode="after")
    def _recompute_layers_only_for_full(self) -> "ParallelPlan":
        if self.recompute.granularity is not RecomputeGranularity.full and self.recompute.num_layers != 1:
            raise ValueError(
                f"recompute num_layers={self.recompute.num_layers} applies only to granularity 'full' "
                f"(got {self.recompute.granularity.value!r}); drop --recompute-num-layers or use full"
            )
        return self
