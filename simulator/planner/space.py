"""The space the search covers: what a request asks for, and every candidate plan the rules allow.

A candidate is the handful of values that tell one plan from the others (TP, CP, PP, DP, virtual
stages, micro-batch, split, EP/ETP, SP, recompute, data-parallel sharding). The arithmetic rules of
``ParallelPlan`` and ``Job`` are applied while generating, as integers, so every candidate is a valid
plan; the pydantic model is built (``Candidate.plan``) only for candidates that survive the memory
prune, a fraction of them.
"""

from __future__ import annotations

from enum import Enum
from functools import lru_cache
from typing import Iterator, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.estimator.goodput import GoodputSettings
from simulator.spec.hardware import ClusterSpec
from simulator.spec._io import build
from simulator.spec.limits import (
    MAX_GLOBAL_BATCH_SIZE,
    MAX_GPUS,
    MAX_LAYERS,
    MAX_MICRO_BATCH_SIZE,
    MAX_PIPELINE_CHUNKS,
)
from simulator.spec.model import ModelSpec
from simulator.spec.pipeline_split import chunk_layers
from simulator.spec.plan import (
    AttentionBackend,
    DataParallelSharding,
    Fp8Format,
    MoEDispatcher,
    ParallelPlan,
    Precision,
    RecomputeGranularity,
    RecomputeMethod,
    RecomputePolicy,
)

MICRO_BATCH_SIZES = (1, 2, 4, 8, 16)
# Context parallelism pays off for long sequences; below this many tokens per CP rank it is not searched.
CP_MIN_TOKENS_PER_RANK = 2048
CP_SIZES = (2, 4, 8, 16, 32)


class SearchPins(BaseModel):
    """Dimensions the user fixed (None = search it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # bounded as the plan's own fields are, so a pin no plan can take is refused where it is given
    tensor_parallel_size: int | None = Field(None, gt=0, le=MAX_GPUS)
    pipeline_parallel_size: int | None = Field(None, gt=0, le=MAX_GPUS)
    virtual_pipeline_stages: int | None = Field(None, gt=0, le=MAX_LAYERS)
    micro_batch_size: int | None = Field(None, gt=0, le=MAX_MICRO_BATCH_SIZE)
    sequence_parallel: bool | None = None
    recompute_granularity: RecomputeGranularity | None = None
    use_distributed_optimizer: bool | None = None
    context_parallel_size: int | None = Field(None, gt=0, le=MAX_GPUS)
    expert_model_parallel_size: int | None = Field(
        None, gt=0, le=MAX_GPUS, description="Mixture of experts: EP, ranks the routed experts are spread over.")
    expert_tensor_parallel_size: int | None = Field(
        None, gt=0, le=MAX_GPUS, description="Mixture of experts: ETP, ranks each expert is split over.")


class RankBy(str, Enum):
    """What the search orders its plans by."""

    upper = "upper"  # the band's slow end: the plan most likely to deliver, measured error and regime counted
    point = "point"  # the predicted iteration time alone
    expected_days = "expected-days"  # the iteration time over the run's ETTR: failures, saves and restarts counted


def plan_default(field: str):
    """A ``ParallelPlan`` field's default: the one place every command, the sweep and the API take a
    setting the user left out from, so the same point gives the same answer through each."""
    return ParallelPlan.model_fields[field].default


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelSpec
    cluster: ClusterSpec
    num_gpus: int = Field(gt=0, le=MAX_GPUS)
    global_batch_size: int = Field(gt=0, le=MAX_GLOBAL_BATCH_SIZE)
    pins: SearchPins = SearchPins()
    precision: Precision = plan_default("precision")
    use_flash_attention: bool = Field(
        plan_default("use_flash_attention"), description="Plans use a fused attention kernel (Megatron's default, "
                                                         "attention_backend auto); False: Megatron's unfused path.")
    attention_backend: AttentionBackend | None = Field(
        None, description="Megatron's --attention-backend of every plan; None: auto with use_flash_attention, "
                          "else unfused.")
    overlap_grad_reduce: bool = plan_default("overlap_grad_reduce")
    fp8_format: Fp8Format | None = Field(None, description="Every plan's linear layers in FP8 (Hopper).")
    finalists: int = Field(16, gt=0, description="Plans the engine simulates after the closed-form screen.")
    rank_by: RankBy = Field(RankBy.upper, description="Order plans by the band's slow end (upper: a plan outside "
                                                      "every measured regime, or above the best measured MFU, pays "
                                                      "for it), by the predicted time alone (point), or by the "
                                                      "expected days with failures, saves and restarts "
                                                      "(expected-days: the time over the run's ETTR).")
    goodput: GoodputSettings = Field(GoodputSettings(), description="Failures and checkpoints, for expected days.")

    @model_validator(mode="before")
    @classmethod
    def _attention_flags_agree(cls, data):
        """A backend given alone sets ``use_flash_attention``; given together, they must say one thing."""
        if not isinstance(data, dict) or data.get("attention_backend") is None:
            return data
        fused = AttentionBackend(data["attention_backend"]).fused_kernel
        if data.get("use_flash_attention") is None:
            return {**data, "use_flash_attention": fused}
        if bool(data["use_flash_attention"]) != fused:
            raise ValueError(f"attention_backend={AttentionBackend(data['attention_backend']).value!r} and "
                             f"use_flash_attention={data['use_flash_attention']} disagree; give one of them")
        return data


class Candidate(NamedTuple):
    """One plan of the space as plain values; ``split`` holds the plan fields that state the pipeline
    split, as (field, value) pairs (empty for an even split)."""

    t: int
    cp: int
    p: int
    d: int
    v: int
    mbs: int
    split: tuple[tuple[str, object], ...]
    ep: int
    etp: int | None  # None: the experts keep the dense layers' TP
    sp: bool
    recompute: RecomputePolicy
    sharding: DataParallelSharding

    def plan(self, template: ParallelPlan) -> ParallelPlan:
        """The plan: ``template`` (``plan_template``) with this layout. Copying one plan is far cheaper
        than building each from its defaults, and every rule it checks was applied while generating."""
        return template.model_copy(update=dict(
            tensor_parallel_size=self.t, context_parallel_size=self.cp, pipeline_parallel_size=self.p,
            data_parallel_size=self.d, virtual_pipeline_stages=self.v, sequence_parallel=self.sp,
            micro_batch_size=self.mbs, recompute=self.recompute, expert_model_parallel_size=self.ep,
            expert_tensor_parallel_size=self.etp,
            overlap_p2p_comm=self.v > 1,  # Megatron's default: interleaved schedules overlap their sends
            use_distributed_optimizer=self.sharding is not DataParallelSharding.no_shard,
            data_parallel_sharding_strategy=(self.sharding if self.sharding in (DataParallelSharding.optim_grads,
                                                                                DataParallelSharding.optim_grads_params)
                                             else None), **dict(self.split)))


def plan_template(req: SearchRequest) -> ParallelPlan:
    """What every candidate's plan has in common: the request's precision, attention and overlap.
    Built at one sequence, which every rule allows, then given the batch."""
    backend = req.attention_backend or (AttentionBackend.auto if req.use_flash_attention else AttentionBackend.unfused)
    # MoE plans exchange tokens all-to-all with the experts run as one grouped GEMM, as Megatron-Core
    # recommends for expert parallelism
    moe = dict(moe_token_dispatcher_type=MoEDispatcher.alltoall, moe_grouped_gemm=True) if req.model.is_moe else {}
    # through the boundary's check: a request whose settings break a rule (FP8 beside fp32) is one sentence
    return build(ParallelPlan, dict(global_batch_size=1, precision=req.precision, fp8_format=req.fp8_format,
                                    attention_backend=backend,
                                    overlap_grad_reduce=req.overlap_grad_reduce, **moe), "search").model_copy(
                                        update={"global_batch_size": req.global_batch_size})


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pinned(allowed, pin) -> list:
    """The allowed values, or the pinned one if the rules allow it (a pin never adds a value they refuse)."""
    return list(allowed) if pin is None else [x for x in allowed if x == pin]


@lru_cache(maxsize=1024)
def recompute_options(chunk_layers: int, pinned: RecomputeGranularity | None) -> tuple[RecomputePolicy, ...]:
    """none, selective, full (uniform, one layer per group) and full/block with 1..n-1 checkpointed layers."""
    out = []
    if pinned in (None, RecomputeGranularity.none):
        out.append(RecomputePolicy())
    if pinned in (None, RecomputeGranularity.selective):
        out.append(RecomputePolicy(granularity=RecomputeGranularity.selective))
    if pinned in (None, RecomputeGranularity.full):
        out.append(RecomputePolicy(granularity=RecomputeGranularity.full))
        out += [RecomputePolicy(granularity=RecomputeGranularity.full, method=RecomputeMethod.block, num_layers=k)
                for k in range(1, chunk_layers)]
    return tuple(out)


def pipeline_splits(num_layers: int, p: int, v: int) -> list[dict]:
    """How Megatron can split the layers over p stages of v chunks: evenly where that divides; else
    with the embedding and the loss counted as layers; else with lighter first and last stages and
    the rest even (the most even such split). Each is the plan fields that state it."""
    L = num_layers
    if L % (p * v) == 0:
        return [{}]
    if p == 1:
        return []
    if (L + 2) % (p * v) == 0 and (L + 2) // (p * v) >= 2:
        return [{"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}]
    if p > 2:
        for middle in range(-(-L // p), L):
            rest = L - middle * (p - 2)
            if rest < 2 * v:
                break
            if rest % 2 == 0 and (rest // 2) % v == 0 and middle % v == 0:
                return [{"decoder_first_pipeline_num_layers": rest // 2, "decoder_last_pipeline_num_layers": rest // 2}]
    return []


def split_layers(L: int, p: int, v: int, split: dict) -> tuple[tuple[int, ...], ...]:
    """Transformer layers of each chunk of each stage under one of ``pipeline_splits``."""
    return chunk_layers(L, p, v, first=split.get("decoder_first_pipeline_num_layers"),
                        last=split.get("decoder_last_pipeline_num_layers"),
                        account_for_embedding=split.get("account_for_embedding_in_pipeline_split", False),
                        account_for_loss=split.get("account_for_loss_in_pipeline_split", False))


def candidates(req: SearchRequest) -> Iterator[Candidate]:
    """Every plan the rules allow, in a fixed order (so the ranking is deterministic).

    TP up to the GPUs NVLink joins (a node, or the nodes a job takes of an NVLink domain); CP for long
    sequences (with a fused attention kernel); PP any size whose layers split as Megatron can split them
    (``pipeline_splits``); virtual stages; micro-batch; SP; recompute; and the data-parallel sharding
    (the distributed optimizer, and Megatron-FSDP's deeper levels where there is no pipeline).
    """
    m, c, pins, n = req.model, req.cluster, req.pins, req.num_gpus
    L, gbs, s = m.num_layers, req.global_batch_size, m.seq_length
    tps = [t for t in _divisors(c.ranks_per_nvlink_domain)
           if m.num_attention_heads % t == 0 and m.vocab_size % t == 0 and m.ffn_size % t == 0
           and (m.query_groups % t == 0 or t % m.query_groups == 0)]
    cps = [1] + [cp for cp in CP_SIZES
                 if req.use_flash_attention and s % (2 * cp) == 0 and s // cp >= CP_MIN_TOKENS_PER_RANK]
    for t in _pinned(tps, pins.tensor_parallel_size):
        for cp in _pinned(cps, pins.context_parallel_size):
            for p in _pinned(range(1, L + 1), pins.pipeline_parallel_size):
                if n % (t * cp * p):
                    continue
                d = n // (t * cp * p)
                for mbs in MICRO_BATCH_SIZES if pins.micro_batch_size is None else [pins.micro_batch_size]:
                    if gbs % (mbs * d):
                        continue
                    micro_batches = gbs // (mbs * d)
                    vs = [1] + ([v for v in range(2, L // p + 1) if micro_batches % p == 0] if p > 1 else [])
                    for v in _pinned(vs, pins.virtual_pipeline_stages):
                        if p * v * micro_batches > MAX_PIPELINE_CHUNKS:  # a schedule too long to play
                            continue
                        for split in pipeline_splits(L, p, v):
                            chunk = max(max(c_) for c_ in split_layers(L, p, v, split))
                            for ep, etp in _expert_layouts(m, c.ranks_per_nvlink_domain, pins, t, cp, d):
                                yield from _variants(pins, t, cp, p, d, v, mbs, tuple(split.items()), chunk, ep, etp,
                                                     sp_splits=(s // cp) % t == 0, moe=m.is_moe)


def enumerate_plans(req: SearchRequest) -> Iterator[ParallelPlan]:
    """Every plan the rules allow (``candidates``, each built as its plan), in the same fixed order."""
    template = plan_template(req)
    return (c.plan(template) for c in candidates(req))


def _expert_layouts(m: ModelSpec, nvlink_gpus: int, pins: SearchPins, t: int, cp: int,
                    d: int) -> list[tuple[int, int | None]]:
    """(EP, ETP) pairs for a stage of t x cp x d ranks: EP any divisor of the experts that, with ETP, tiles
    the stage's ranks (Megatron's expert rank generator); ETP either 1 (whole experts, Megatron-Core's
    advice for fine-grained experts) or the dense layers' TP (its default). A dense model has (1, None)."""
    if not m.is_moe:
        return [(1, None)]
    out = []
    for etp in _pinned(sorted({1, t}), pins.expert_tensor_parallel_size):
        if m.expert_ffn_size % etp or etp > nvlink_gpus:
            continue
        for ep in _pinned(_divisors(m.num_experts), pins.expert_model_parallel_size):
            if (t * cp * d) % (etp * ep) == 0:
                out.append((ep, None if etp == t else etp))
    return out


def _variants(pins: SearchPins, t: int, cp: int, p: int, d: int, v: int, mbs: int, split: tuple, chunk: int,
              ep: int = 1, etp: int | None = None, sp_splits: bool = True, moe: bool = False) -> Iterator[Candidate]:
    """``sp_splits``: TP divides each CP rank's sequence, as sequence parallelism needs."""
    # experts beside tensor parallelism need sequence parallelism (Megatron's rule, for EP 1 too)
    sps = ([True] if moe else [False, True]) if t > 1 else [False]
    if not sp_splits:
        sps = [sp for sp in sps if not sp]
    shardings = [DataParallelSharding.no_shard, DataParallelSharding.optim] if d * cp > 1 else [DataParallelSharding.no_shard]
    if d * cp > 1 and p == 1:  # Megatron-FSDP's deeper levels, which do not combine with pipelining
        shardings += [DataParallelSharding.optim_grads, DataParallelSharding.optim_grads_params]
    if pins.use_distributed_optimizer is not None:
        shardings = [x for x in shardings if (x is not DataParallelSharding.no_shard) == pins.use_distributed_optimizer]
    for sp in _pinned(sps, pins.sequence_parallel):
        for rec in recompute_options(chunk, pins.recompute_granularity):
            for sharding in shardings:
                yield Candidate(t, cp, p, d, v, mbs, split, ep, etp, sp, rec, sharding)
