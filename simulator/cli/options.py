"""The plan flags every command shares, with Megatron-LM's names and short aliases, and the Job they build;
and the bounded number and output-file types every command's flags use."""

from __future__ import annotations

import io
import math
import os
import stat
import sys
from pathlib import Path
from typing import Any, Callable

import click

from simulator.spec import limits
from simulator.spec._io import build, check_output, short_repr
from simulator.spec.catalog import load_model
from simulator.spec.errors import ConfigError, PlanDoesNotFit
from simulator.spec.hardware import load_cluster
from simulator.spec.model import ModelSpec
from simulator.spec.plan import (
    AttentionBackend,
    CpCommType,
    DataParallelSharding,
    Fp8Format,
    Job,
    MoEDispatcher,
    ParallelPlan,
    Precision,
    RecomputeGranularity,
    RecomputeMethod,
)

_DIGITS = 30  # more digits than any bound has: refused before Python converts (and prints) a 5,000-digit number


class BoundedInt(click.ParamType):
    """A whole number in [low, high]; anything else (text, 1e3, a 5,000-digit number) is one sentence."""

    name = "integer"

    def __init__(self, low: int, high: int):
        self.low, self.high = low, high

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        else:
            text = str(value).strip()
            if len(text) > _DIGITS:
                self.fail(f"a value of {len(text):,} characters ({short_repr(text, 24)}) is out of range; give a whole "
                          f"number from {self.low:,} to {self.high:,}", param, ctx)
            try:
                n = int(text)
            except ValueError:
                self.fail(f"{text!r} is not a whole number; give one from {self.low:,} to {self.high:,}", param, ctx)
        if not self.low <= n <= self.high:
            self.fail(f"{n:,} is out of range; give a whole number from {self.low:,} to {self.high:,}", param, ctx)
        return n

    def __repr__(self) -> str:
        return f"BoundedInt({self.low}, {self.high})"


class BoundedFloat(click.ParamType):
    """A finite number in (low, high], or [low, high] with ``closed``; 300e9 and 3e11 alike; inf, nan and
    anything out of range are one sentence."""

    name = "number"

    def __init__(self, low: float, high: float, closed: bool = False):
        self.low, self.high, self.closed = low, high, closed

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        text = str(value).strip()
        if len(text) > _DIGITS:
            self.fail(f"a value of {len(text):,} characters ({short_repr(text, 24)}) is not a number this takes; give "
                      "one such as 300e9", param, ctx)
        try:
            x = float(text)
        except ValueError:
            self.fail(f"{text!r} is not a number; give one such as 300e9", param, ctx)
        above = x >= self.low if self.closed else x > self.low
        if not math.isfinite(x) or not above or x > self.high:
            self.fail(f"{text} is out of range; give a number {'from' if self.closed else 'more than'} {self.low:g} "
                      f"{'to' if self.closed else 'and at most'} {self.high:g}", param, ctx)
        return x

    def __repr__(self) -> str:
        return f"BoundedFloat({self.low}, {self.high})"


def is_standard_output(path: Path) -> bool:
    """Whether ``path`` is the file this process's standard output writes to (``/dev/stdout``, ``/proc/self/fd/1``,
    or the file stdout is redirected to), apart from a device that keeps nothing (``/dev/null``)."""
    try:
        out = os.fstat(sys.stdout.fileno())
        st = os.stat(path)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False  # no stdout file (a test's captured stream) or no such path yet
    if stat.S_ISCHR(out.st_mode) and not os.isatty(sys.stdout.fileno()):
        return False
    return (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino)


class OutputFile(click.ParamType):
    """A file to write, checked before any work is done (see ``simulator.spec._io.write_output``);
    ``suffixes`` restricts the formats (the Pareto figure is PNG, SVG or PDF by its suffix)."""

    name = "file"

    def __init__(self, what: str, suffixes: tuple[str, ...] = ()):
        self.what, self.suffixes = what, suffixes

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        path = check_output(value, self.what)
        if is_standard_output(path):
            # written there, the file would be replaced under the shell's redirection (the answer lost) or mixed
            # into the answer in a pipe
            self.fail(f"{str(path)!r} is this command's standard output, which carries its answer; name a file "
                      f"for the {self.what}", param, ctx)
        if self.suffixes and path.suffix.lower() not in self.suffixes:
            names = [s.lstrip(".").upper() for s in self.suffixes]
            kinds = ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]
            self.fail(f"{str(path)!r} ends in {path.suffix or 'no suffix'!r}; the {self.what} is written as {kinds}, "
                      f"chosen by the suffix, so name it like {path.stem or 'figure'}{self.suffixes[0]}", param, ctx)
        return path


TOKENS = BoundedFloat(0, limits.MAX_TOKENS)
GPUS = BoundedInt(1, limits.MAX_GPUS)
PARALLEL_SIZE = BoundedInt(1, limits.MAX_GPUS)
VIRTUAL_STAGES = BoundedInt(1, limits.MAX_LAYERS)
MICRO_BATCH = BoundedInt(1, limits.MAX_MICRO_BATCH_SIZE)
GLOBAL_BATCH = BoundedInt(1, limits.MAX_GLOBAL_BATCH_SIZE)
SEQ_LENGTH = BoundedInt(1, limits.MAX_SEQ_LENGTH)
LAYERS = BoundedInt(1, limits.MAX_LAYERS)
# the busiest expert rank's tokens over its balanced share: 1 is perfect balance
LOAD_IMBALANCE = BoundedFloat(1, limits.MAX_EXPERT_LOAD, closed=True)

# (param_decls, kwargs) in the order --help lists them; the parameter names are what
# job_from_options reads.
_OPTIONS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("--model",), dict(default="gpt3-175b", show_default=True, metavar="NAME|FILE",
                        help="Model preset (gpt3-175b, llama3-70b, ...; see `simulator models`), a YAML/JSON "
                             "file of ModelSpec fields, or a Hugging Face config.json.")),
    (("--seq-length", "seq_length"), dict(type=SEQ_LENGTH, default=None,
                                          help="Override the model's sequence length (tokens).")),
    (("--cluster",), dict(default="dgx-a100-80gb", show_default=True, metavar="NAME|FILE",
                          help="Cluster preset (dgx-a100-80gb, dgx-h100, ...; see `simulator clusters`) "
                               "or a YAML file.")),
    (("--gpus",), dict(type=GPUS, default=None,
                       help="Total GPUs; must equal TP x CP x PP x DP. Default: TP x CP x PP x DP.")),
    (("--tensor-model-parallel-size", "--tp", "tensor_parallel_size"),
     dict(type=PARALLEL_SIZE, default=1, show_default=True, help="Tensor-parallel size.")),
    (("--pipeline-model-parallel-size", "--pp", "pipeline_parallel_size"),
     dict(type=PARALLEL_SIZE, default=1, show_default=True, help="Pipeline stages.")),
    (("--data-parallel-size", "--dp", "data_parallel_size"),
     dict(type=PARALLEL_SIZE, default=None, help="Data-parallel size. Default: --gpus / (TP x CP x PP), or 1.")),
    (("--context-parallel-size", "--cp", "context_parallel_size"),
     dict(type=PARALLEL_SIZE, default=1, show_default=True,
          help="Context-parallel size: each sequence split over CP ranks (ring attention by default).")),
    (("--cp-comm-type", "cp_comm_type"),
     dict(type=click.Choice([c.value for c in CpCommType]), default="p2p", show_default=True,
          help="How CP exchanges keys and values: p2p ring, a2a (all-to-all to heads) or allgather.")),
    (("--virtual-pipeline-model-parallel-size", "--vpp", "virtual_pipeline_stages"),
     dict(type=VIRTUAL_STAGES, default=1, show_default=True, help="Model chunks per stage (interleaved 1F1B).")),
    (("--decoder-first-pipeline-num-layers", "decoder_first_pipeline_num_layers"),
     dict(type=LAYERS, default=None, help="Transformer layers of the first pipeline stage (uneven split).")),
    (("--decoder-last-pipeline-num-layers", "decoder_last_pipeline_num_layers"),
     dict(type=LAYERS, default=None, help="Transformer layers of the last pipeline stage (uneven split).")),
    (("--account-for-embedding-in-pipeline-split", "account_for_embedding_in_pipeline_split"),
     dict(is_flag=True, default=False, help="Count the input embedding as a layer of the first stage.")),
    (("--account-for-loss-in-pipeline-split", "account_for_loss_in_pipeline_split"),
     dict(is_flag=True, default=False, help="Count the output layer and loss as a layer of the last stage.")),
    (("--expert-model-parallel-size", "--ep", "expert_model_parallel_size"),
     dict(type=PARALLEL_SIZE, default=1, show_default=True,
          help="Mixture of experts: ranks each MoE layer's routed experts are spread over, within the TP x CP x DP "
               "ranks of a stage (must divide the experts).")),
    (("--expert-tensor-parallel-size", "--etp", "expert_tensor_parallel_size"),
     dict(type=PARALLEL_SIZE, default=None, help="Mixture of experts: ranks each expert is split over. Default: TP.")),
    (("--moe-token-dispatcher-type", "moe_token_dispatcher_type"),
     dict(type=click.Choice([d.value for d in MoEDispatcher]), default="allgather", show_default=True,
          help="Mixture of experts: how routed tokens reach their experts (Megatron's default allgather, or "
               "alltoall).")),
    (("--moe-grouped-gemm/--no-moe-grouped-gemm", "moe_grouped_gemm"),
     dict(default=False, show_default=True, help="Mixture of experts: a rank's experts run as one grouped GEMM.")),
    (("--moe-load-imbalance", "moe_load_imbalance"),
     dict(type=LOAD_IMBALANCE, default=None, metavar="FLOAT",
          help="Mixture of experts: plan for the busiest expert rank getting this many times its balanced share "
               "of tokens (>= 1; replaces the model's, 1 = perfectly balanced).")),
    (("--sequence-parallel/--no-sequence-parallel", "--sp/--no-sp", "sequence_parallel"),
     dict(default=False, show_default=True, help="Split norms and dropouts along the sequence (needs TP > 1).")),
    (("--micro-batch-size", "--mbs", "micro_batch_size"),
     dict(type=MICRO_BATCH, default=1, show_default=True, help="Sequences per micro-batch.")),
    (("--global-batch-size", "--gbs", "global_batch_size"),
     dict(type=GLOBAL_BATCH, default=None,
          help="Sequences per iteration. Default: micro-batch x DP x PP (one full pipeline of micro-batches).")),
    (("--recompute-granularity", "recompute_granularity"),
     dict(type=click.Choice([g.value for g in RecomputeGranularity]), default="none", show_default=True,
          help="Activation recomputation: none, selective (attention core) or full (whole layers).")),
    (("--recompute-method", "recompute_method"),
     dict(type=click.Choice([m.value for m in RecomputeMethod]), default="uniform", show_default=True,
          help="full only: uniform groups, or block (the first N layers of each chunk).")),
    (("--recompute-num-layers", "recompute_num_layers"),
     dict(type=LAYERS, default=None, help="full only: layers per group (uniform) or per chunk (block); default 1.")),
    (("--use-distributed-optimizer", "use_distributed_optimizer"),
     dict(is_flag=True, default=False, help="Shard fp32 master weights and Adam state over DP.")),
    (("--data-parallel-sharding-strategy", "data_parallel_sharding_strategy"),
     dict(type=click.Choice([d.value for d in DataParallelSharding]), default=None,
          help="What DP shards: no_shard, optim (the distributed optimizer), optim_grads, or optim_grads_params "
               "(FSDP, ZeRO-3). Default: optim with --use-distributed-optimizer, else no_shard.")),
    (("--precision",), dict(type=click.Choice([p.value for p in Precision]), default="bf16", show_default=True,
                            help="bf16/fp16 mixed precision with fp32 master weights, or fp32.")),
    (("--fp8-format", "fp8_format"),
     dict(type=click.Choice([f.value for f in Fp8Format]), default=None,
          help="FP8 GEMMs in the linear layers (Transformer Engine, Hopper only), with its casts; each linear "
               "layer saves its input in FP8, other activations stay bf16. MFU stays against the bf16 peak.")),
    (("--attention-backend", "attention_backend"),
     dict(type=click.Choice([b.value for b in AttentionBackend]), default=None,
          help="Megatron's --attention-backend [default: auto, Transformer Engine's flash/fused kernels]; unfused "
               "or local keep the s x s scores (Megatron's own path).")),
    (("--use-flash-attn", "use_flash_attention"),
     dict(is_flag=True, default=None, help="Older Megatron's flag: a fused kernel (the default already).")),
    (("--overlap-grad-reduce", "overlap_grad_reduce"),
     dict(is_flag=True, default=False, help="Overlap the DP gradient reduction with the backward pass.")),
    (("--overlap-param-gather", "overlap_param_gather"),
     dict(is_flag=True, default=False, help="Distributed optimizer: all-gather updated parameters during the next "
                                            "forward (needs --use-distributed-optimizer and --overlap-grad-reduce).")),
    (("--ddp-bucket-size", "ddp_bucket_size"),
     dict(type=BoundedInt(1, limits.MAX_DDP_BUCKET_SIZE), default=None, help="Parameters per gradient bucket. Default: max(40M, 1M x DP).")),
    (("--tp-comm-overlap", "tp_comm_overlap"),
     dict(is_flag=True, default=False, help="Pipeline SP's all-gathers and reduce-scatters with their GEMMs "
                                            "(Transformer Engine userbuffers; needs --sequence-parallel).")),
    (("--cuda-device-max-connections", "cuda_device_max_connections"),
     dict(type=BoundedInt(1, 32), default=None,
          help="CUDA work queues per GPU the job runs with (CUDA_DEVICE_MAX_CONNECTIONS). Default: what Megatron's "
               "launch sets, 1 with TP or CP, 8 under Megatron-FSDP; with more than one, the input-gradient "
               "all-reduce (SP: all-gather) runs after the GEMM it would overlap.")),
    (("--accumulate-allreduce-grads-in-fp32", "accumulate_allreduce_grads_in_fp32"),
     dict(is_flag=True, default=None, help="Accumulate and reduce gradients in fp32 (forced under bf16; "
                                           "fp16 default: 2-byte gradients).")),
    (("--grad-reduce-in-bf16", "grad_reduce_in_bf16"),
     dict(is_flag=True, default=False, help="bf16: keep the gradient buffer and its reduction in bf16 (2 bytes a "
                                            "parameter instead of 4).")),
    (("--use-precision-aware-optimizer", "use_precision_aware_optimizer"),
     dict(is_flag=True, default=False, help="Keep master weights and Adam moments in the dtypes below "
                                            "(Transformer Engine's FusedAdam; needs --use-distributed-optimizer).")),
    (("--main-grads-dtype", "main_grads_dtype"),
     dict(type=click.Choice(["fp32", "bf16"]), default=None, help="Precision-aware optimizer: the gradient buffer's "
                                                                 "dtype [default: fp32].")),
    (("--main-params-dtype", "main_params_dtype"),
     dict(type=click.Choice(["fp32", "fp16"]), default=None, help="Precision-aware optimizer: the master weights' "
                                                                 "dtype [default: fp32].")),
    (("--exp-avg-dtype", "exp_avg_dtype"),
     dict(type=click.Choice(["fp32", "fp16", "bf16", "fp8"]), default=None,
          help="Precision-aware optimizer: Adam's first moment [default: fp32].")),
    (("--exp-avg-sq-dtype", "exp_avg_sq_dtype"),
     dict(type=click.Choice(["fp32", "fp16", "bf16", "fp8"]), default=None,
          help="Precision-aware optimizer: Adam's second moment [default: fp32].")),
    (("--store-param-remainders/--no-store-param-remainders", "store_param_remainders"),
     dict(default=True, show_default=True, help="Precision-aware optimizer, bf16 with fp32 master weights: keep "
                                                "only the 16 bits each bf16 weight lacks (2 bytes, not 4).")),
    (("--fp8-param-gather", "fp8_param_gather"),
     dict(is_flag=True, default=False, help="FP8: keep the linear layers' weights in FP8 and all-gather them so "
                                            "(needs --fp8-format and --use-distributed-optimizer).")),
    (("--allow-tp-across-nodes", "allow_tp_across_nodes"),
     dict(is_flag=True, default=False, help="Accept tensor parallelism wider than a node (slow: TP over the network).")),
    (("--overlap-p2p-communication/--no-overlap-p2p-communication", "overlap_p2p_comm"),
     dict(default=None,
          help="Pipeline sends run beside compute. Default as Megatron: on in the interleaved schedule, off "
               "(its blocking send/receive exchange) otherwise.")),
    (("--json", "as_json"), dict(is_flag=True, default=False, help="Print machine-readable JSON to stdout.")),
)

PLAN_OPTION_NAMES = frozenset(decls[-1].lstrip("-").replace("-", "_").split("/")[0] for decls, _ in _OPTIONS)


def plan_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add every shared plan flag to a click command; pass its kwargs to ``job_from_options``."""
    for decls, kwargs in reversed(_OPTIONS):
        func = click.option(*decls, **kwargs)(func)
    return func


def data_parallel_size(gpus: int | None, tp: int, pp: int, dp: int | None, cp: int = 1) -> int:
    """DP from --gpus, --tp, --cp, --pp and --dp (either may derive the other); inconsistent sizes are a ConfigError."""
    if gpus is None:
        return dp or 1
    dims = f"tp({tp}) * cp({cp}) * pp({pp})" if cp > 1 else f"tp({tp}) * pp({pp})"
    if dp is None:
        if gpus % (tp * cp * pp):
            raise ConfigError(
                f"Invalid parallel dims: gpus({gpus}) is not divisible by {dims} = {tp * cp * pp}; "
                f"change --gpus, --tp{', --cp' if cp > 1 else ''} or --pp"
            )
        return gpus // (tp * cp * pp)
    if tp * cp * pp * dp != gpus:
        raise ConfigError(
            f"Invalid parallel dims: {dims} * dp({dp}) = {tp * cp * pp * dp} != gpus({gpus}); "
            "make the product equal --gpus or drop --dp to derive it"
        )
    return dp


def job_from_options(model_overrides: dict[str, Any] | None = None, plan_overrides: dict[str, Any] | None = None,
                     **kwargs: Any) -> Job:
    """Load the model and cluster and build the validated ``Job`` from ``plan_options``' kwargs.

    Keys that are not plan options (a command's own flags) are ignored, so a command can pass
    all of its kwargs. ``model_overrides`` replaces fields of the loaded model (Megatron's
    architecture flags) and ``plan_overrides`` sets plan fields no flag has (an explicit per-stage
    split). Every failure is a ``ConfigError`` naming the value and the fix.
    """
    o = {k: v for k, v in kwargs.items() if k in PLAN_OPTION_NAMES}
    tp, pp = o.get("tensor_parallel_size", 1), o.get("pipeline_parallel_size", 1)
    cp = o.get("context_parallel_size") or 1
    dp = data_parallel_size(o.get("gpus"), tp, pp, o.get("data_parallel_size"), cp)
    model = load_model(o.get("model", "gpt3-175b"), o.get("seq_length"))
    if model_overrides:
        model = build(ModelSpec, {**model.model_dump(), **model_overrides}, f"model {model.name!r}")
    model = with_load_imbalance(model, o.get("moe_load_imbalance"))
    cluster = load_cluster(o.get("cluster", "dgx-a100-80gb"))
    plan = build(ParallelPlan, {**plan_fields(o, dp), **(plan_overrides or {})}, "plan")
    return build(Job, {"model": model, "cluster": cluster, "plan": plan}, "job")


def plan_fields(o: dict[str, Any], dp: int) -> dict[str, Any]:
    """The ``ParallelPlan`` fields of ``plan_options``' values ``o`` (absent ones at their defaults), DP
    derived: the one mapping from flags to a plan, so the search's pins meet the rules `plan` applies as
    `plan` meets them (the attention flags that disagree, FP8 beside fp32, ...)."""
    tp, pp = o.get("tensor_parallel_size", 1), o.get("pipeline_parallel_size", 1)
    mbs = o.get("micro_batch_size", 1)
    vpp = o.get("virtual_pipeline_stages", 1)
    overlap_p2p = o.get("overlap_p2p_comm")
    return {
        "tensor_parallel_size": tp,
        "context_parallel_size": o.get("context_parallel_size") or 1,
        "cp_comm_type": o.get("cp_comm_type") or "p2p",
        "pipeline_parallel_size": pp,
        "data_parallel_size": dp,
        "virtual_pipeline_stages": vpp,
        "decoder_first_pipeline_num_layers": o.get("decoder_first_pipeline_num_layers"),
        "decoder_last_pipeline_num_layers": o.get("decoder_last_pipeline_num_layers"),
        "account_for_embedding_in_pipeline_split": o.get("account_for_embedding_in_pipeline_split", False),
        "account_for_loss_in_pipeline_split": o.get("account_for_loss_in_pipeline_split", False),
        "sequence_parallel": o.get("sequence_parallel", False),
        "expert_model_parallel_size": o.get("expert_model_parallel_size") or 1,
        "expert_tensor_parallel_size": o.get("expert_tensor_parallel_size"),
        "moe_token_dispatcher_type": o.get("moe_token_dispatcher_type") or "allgather",
        "moe_grouped_gemm": o.get("moe_grouped_gemm", False),
        "tp_comm_overlap": o.get("tp_comm_overlap", False),
        "cuda_device_max_connections": o.get("cuda_device_max_connections"),
        "micro_batch_size": mbs,
        "global_batch_size": o.get("global_batch_size") or mbs * dp * pp,
        "recompute": {
            "granularity": o.get("recompute_granularity", "none"),
            "method": o.get("recompute_method", "uniform"),
            "num_layers": o.get("recompute_num_layers") or 1,
        },
        "use_distributed_optimizer": o.get("use_distributed_optimizer", False),
        "data_parallel_sharding_strategy": o.get("data_parallel_sharding_strategy"),
        "precision": o.get("precision", "bf16"),
        "accumulate_allreduce_grads_in_fp32": o.get("accumulate_allreduce_grads_in_fp32"),
        "fp8_format": o.get("fp8_format"),
        "grad_reduce_in_bf16": o.get("grad_reduce_in_bf16", False),
        "use_precision_aware_optimizer": o.get("use_precision_aware_optimizer", False),
        **{k: o[k] for k in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype") if o.get(k)},
        "store_param_remainders": o.get("store_param_remainders", True),
        "fp8_param_gather": o.get("fp8_param_gather", False),
        **({"attention_backend": o["attention_backend"]} if o.get("attention_backend") else {}),
        **({"use_flash_attention": True} if o.get("use_flash_attention") else {}),
        "overlap_grad_reduce": o.get("overlap_grad_reduce", False),
        "overlap_param_gather": o.get("overlap_param_gather", False),
        "ddp_bucket_size": o.get("ddp_bucket_size"),
        # Megatron overlaps pipeline sends by default in the interleaved schedule, and only there
        "overlap_p2p_comm": overlap_p2p if overlap_p2p is not None else vpp > 1,
        "allow_tp_across_nodes": o.get("allow_tp_across_nodes", False),
    }


def with_load_imbalance(model: ModelSpec, imbalance: float | None) -> ModelSpec:
    """``--moe-load-imbalance``: the model with that imbalance to plan for (None keeps the model's)."""
    if imbalance is None:
        return model
    if not model.is_moe:
        raise ConfigError(f"--moe-load-imbalance {imbalance:g} is for a mixture-of-experts model; {model.name} is "
                          "dense, so drop it")
    return build(ModelSpec, {**model.model_dump(), "moe_load_imbalance": imbalance}, f"model {model.name!r}")


require_fit_option = click.option(
    "--require-fit", "require_fit_flag", is_flag=True, default=False,
    help="Exit with code 3 (after the answer) when the plan does not fit in GPU memory, for scripts.")


def require_fit(job: Job, memory: Any) -> None:
    """``--require-fit``: one sentence and exit code 3 when the memory plan does not fit."""
    if not memory.fits:
        from simulator.spec.units import format_gib

        raise PlanDoesNotFit(
            f"the plan does not fit: stage {memory.overflowing_stage} needs {format_gib(memory.peak_bytes)} GiB of the "
            f"{format_gib(memory.capacity_bytes)} GiB of a {job.cluster.gpu.name}; add recompute, sequence or "
            "pipeline parallelism, a smaller micro-batch or more GPUs"
        )
