"""The memory model against Korthikanti et al. 2022 (Table 2, Section 4.3, Figures 1 and 7), the
pipeline schedules it claims to summarise, and the invariants any memory model must keep."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.cli.options import job_from_options
from simulator.estimator.memory import (
    CONTEXT_RESERVE_BYTES,
    WORKSPACE_RESERVE_BYTES,
    chunk_in_flight,
    in_flight_chunks,
    memory_plan,
)
from simulator.graph.parameters import layer_parameters_per_rank
from simulator.measure import korthikanti
from simulator.schedule.schedules import build_schedule, peak_in_flight
from simulator.spec.catalog import PRESETS
from simulator.spec.errors import SimulatorError
from simulator.spec.hardware import load_cluster
from simulator.spec.model import ModelSpec
from simulator.spec.plan import Job, ParallelPlan, PipelineSchedule, RecomputePolicy
from simulator.spec.units import GIB

CLUSTER = load_cluster("dgx-a100-80gb")

# Korthikanti Table 3: (tensor, pipeline, global batch, micro-batch, virtual stages of the interleaved schedule)
TABLE3 = {
    "megatron-22b": (8, 1, 4, 4, 1),
    "gpt3-175b": (8, 8, 64, 1, 3),
    "mt-nlg-530b": (8, 35, 280, 1, 3),
    "megatron-1t": (8, 64, 512, 1, 1),
}
FIGURE_NAMES = korthikanti.FIGURE_NAMES


def job(model: str | ModelSpec, **plan) -> Job:
    """Korthikanti's formulas count the s x s scores of Megatron's own (unfused) attention, so that is the
    default here; tests of flash attention ask for it."""
    spec = PRESETS[model] if isinstance(model, str) else model
    if "use_flash_attention" not in plan:
        plan.setdefault("attention_backend", "unfused")
    return Job(model=spec, cluster=CLUSTER, plan=ParallelPlan(**plan))


def table3_job(name: str, tp: int | None = None, sp=False, recompute="none", **extra) -> Job:
    t, p, gbs, mbs, v = TABLE3[name]
    return job(name, tensor_parallel_size=t if tp is None else tp, pipeline_parallel_size=p,
               virtual_pipeline_stages=v, global_batch_size=gbs, micro_batch_size=mbs, sequence_parallel=sp,
               recompute=RecomputePolicy(granularity=recompute), **extra)


def layer_activation_bytes(j: Job) -> Fraction:
    """Activations of one layer for one micro-batch, read back from the memory plan of stage 0."""
    s0 = memory_plan(j).stages[0]
    layers_held = s0.in_flight * j.layers_per_chunk[0]
    return Fraction(s0.activations_bytes - s0.extra_activations_bytes, layers_held)


# --- Table 2, exactly --------------------------------------------------------------------------------

def table2(name: str, row: str) -> Fraction:
    m = PRESETS[name]
    s, h, a = m.seq_length, m.hidden_size, m.num_attention_heads
    t, _, _, b, _ = TABLE3[name]
    sbh = Fraction(s * b * h)
    att = Fraction(5 * a * s, h)
    return {
        "no parallelism": sbh * (34 + att),
        "tensor parallel": sbh * (10 + Fraction(24, t) + att / t),
        "tensor + sequence parallel": sbh * (34 + att) / t,
        "tensor parallel + selective": sbh * (10 + Fraction(24, t)),
        "tensor + sequence parallel + selective": sbh * Fraction(34, t),
        "full recompute": sbh * 2,
    }[row]


ROWS = {
    "no parallelism": dict(tp=1),
    "tensor parallel": dict(),
    "tensor + sequence parallel": dict(sp=True),
    "tensor parallel + selective": dict(recompute="selective"),
    "tensor + sequence parallel + selective": dict(sp=True, recompute="selective"),
    "full recompute": dict(recompute="full"),
}


@pytest.mark.parametrize("row", list(ROWS))
@pytest.mark.parametrize("name", list(TABLE3))
def test_table2_per_layer_activations_exact(name, row):
    """Every row of Table 2, for the four Table 3 models, to the byte."""
    assert layer_activation_bytes(table3_job(name, **ROWS[row])) == table2(name, row)


def test_full_recompute_under_sp_keeps_the_sharded_input():
    """Megatron's checkpoint of a sequence-parallel layer is its [s/t, b, h] input: 2sbh/t."""
    m = PRESETS["gpt3-175b"]
    per_layer = layer_activation_bytes(table3_job("gpt3-175b", sp=True, recompute="full"))
    assert per_layer == Fraction(2 * m.seq_length * m.hidden_size, 8)


# --- pipeline in-flight --------------------------------------------------------------------------------

def _peaks_from_schedule(p, m, v, gpipe=False):
    sched = build_schedule(p, m, v, "gpipe" if gpipe else "1f1b")
    total = [peak_in_flight(steps) for steps in sched]
    per_chunk = {}
    for steps in sched:
        for c in range(v):
            live = peak = 0
            for step in steps:
                if step.chunk == c:
                    live += 1 if step.phase.value == "forward" else -1
                    peak = max(peak, live)
            per_chunk[steps[0].stage, c] = peak
    return total, per_chunk


CASES = [(p, m, 1) for p in (1, 2, 3, 4, 7, 8) for m in (1, 2, 3, 5, 8, 16)] + [
    (p, k * p, v) for p in (2, 3, 4, 8) for v in (2, 3, 4) for k in (1, 2, 3, 5)
]


@pytest.mark.parametrize("p,m,v", CASES)
def test_in_flight_closed_forms_equal_the_schedule_data(p, m, v):
    plan = ParallelPlan(pipeline_parallel_size=p, virtual_pipeline_stages=v, global_batch_size=m)
    total, per_chunk = _peaks_from_schedule(p, m, v)
    assert [in_flight_chunks(i, plan) for i in range(p)] == total
    for (stage, chunk), peak in per_chunk.items():
        assert chunk_in_flight(stage, chunk, p, m, v) == peak


@pytest.mark.parametrize("p,m", [(1, 1), (2, 5), (4, 8), (8, 3)])
def test_gpipe_holds_every_micro_batch(p, m):
    plan = ParallelPlan(pipeline_parallel_size=p, global_batch_size=m, schedule=PipelineSchedule.gpipe)
    total, _ = _peaks_from_schedule(p, m, 1, gpipe=True)
    assert [in_flight_chunks(i, plan) for i in range(p)] == total == [m] * p


@pytest.mark.parametrize("name", ["gpt3-175b", "mt-nlg-530b"])
def test_interleaved_first_stage_factor(name):
    """Section 4.2.3: the first stage holds L (1 + (p - 1) / (p v)) layers' activations."""
    j = table3_job(name, sp=True, recompute="selective")
    t, p, _, _, v = TABLE3[name]
    s0 = memory_plan(j).stages[0]
    layers_held = Fraction(s0.in_flight * j.layers_per_chunk[0])
    assert layers_held == j.model.num_layers * (1 + Fraction(p - 1, p * v))


def test_one_f_one_b_first_stage_holds_all_layers():
    """Eq. 5: with 1F1B the first stage holds p micro-batches of L/p layers = L layers, and the rest fewer."""
    j = table3_job("megatron-1t", sp=True)
    stages = memory_plan(j).stages
    assert stages[0].in_flight * j.layers_per_chunk[0] == j.model.num_layers
    acts = [s.activations_bytes - s.extra_activations_bytes for s in stages]
    assert acts == sorted(acts, reverse=True) and acts[0] > acts[-1]


# --- Section 4.3 extras ------------------------------------------------------------------------------

def test_extras_single_stage():
    """p = 1: embedding dropout sbh/t, final norm 2sbh/t, output input 2sbh/t, fp32 logits 4sbv/t (TP+SP)."""
    j = table3_job("megatron-22b", sp=True)
    m, (t, _, _, b, _) = j.model, TABLE3["megatron-22b"]
    s, h, v = m.seq_length, m.hidden_size, m.vocab_size
    expected = Fraction(s * b * h, t) * (1 + 4) + Fraction(4 * s * b * v, t)
    assert memory_plan(j).stages[0].extra_activations_bytes == expected
    # the paper's closed form: (sbhL/t)(p/L + (4/L)(1 + v/h))
    assert expected == Fraction(s * b * h * m.num_layers, t) * (Fraction(1, m.num_layers) + Fraction(4, m.num_layers) * (1 + Fraction(v, h)))


def test_extras_pipelined():
    """p > 1 (1F1B): the first stage keeps p embedding-dropout masks, sbhp/t; the last keeps one micro-batch's
    final norm, output input and logits (the paper drops them because the first stage is the peak)."""
    j = table3_job("megatron-1t", sp=True)
    m, (t, p, _, b, _) = j.model, TABLE3["megatron-1t"]
    s, h, v = m.seq_length, m.hidden_size, m.vocab_size
    stages = memory_plan(j).stages
    assert stages[0].extra_activations_bytes == Fraction(s * b * h * p, t)
    assert stages[-1].extra_activations_bytes == Fraction(4 * s * b * h + 4 * s * b * v, t)
    assert all(st.extra_activations_bytes == 0 for st in stages[1:-1])
    assert stages[0].peak_bytes > stages[-1].peak_bytes


# --- Figures 7 and 1 (digitized values from the repo's copy of the paper data) --------------------------

@pytest.mark.parametrize("label", list(FIGURE_NAMES))
def test_figure7_ratios_within_half_a_point(label):
    """Activation memory relative to the TP baseline: SP, selective, SP + selective, full recompute."""
    rows = [c for c in korthikanti.figure7() if c.label.split()[0] == label]
    assert len(rows) == 4
    for c in rows:
        assert abs(c.predicted - c.published) <= 0.5, c


@pytest.mark.parametrize("label", list(FIGURE_NAMES))
def test_figure1_memory(label):
    """Activations within 3% and params+optimizer within 5% of Figure 1 (whose "GB" are GiB).

    Figure 1's params+optimizer bar is reproduced by a stage *without* the embedding (stage 1 when
    p > 1; the only stage for the 22B model, p = 1) at 18 bytes per parameter: 2 (bf16 weight) +
    4 (fp32 gradient) + 12 (fp32 master weight, Adam m and v), no distributed optimizer. The
    activation bars are the first stage (the peak), with the interleaving factor for 175B/530B.
    """
    params_opt, act_base, act_present = [c for c in korthikanti.figure1() if c.label.split()[0] == label]
    assert abs(params_opt.relative_error) <= 0.05, params_opt
    assert abs(act_base.relative_error) <= 0.03, act_base
    assert abs(act_present.relative_error) <= 0.03, act_present


def test_figure1_params_are_18_bytes_per_parameter():
    st = memory_plan(table3_job("gpt3-175b")).stages[1]
    assert st.weights_bytes + st.gradients_bytes + st.optimizer_bytes == 18 * st.parameters


# --- weights, gradients and optimizer ------------------------------------------------------------------

def test_parameters_add_up_to_the_model():
    """All ranks of all stages hold every parameter once, plus the replicated pieces and the tied copy."""
    m = PRESETS["gpt3-175b"]
    t, p = 8, 8
    j = job(m, tensor_parallel_size=t, pipeline_parallel_size=p)
    held = sum(s.parameters for s in memory_plan(j).stages) * t
    h, v = m.hidden_size, m.vocab_size
    replicated_per_layer = 2 * m.norm_parameters() + 2 * h  # norms, row-parallel biases
    extra = (t - 1) * (m.num_layers * replicated_per_layer + m.seq_length * h + m.norm_parameters())
    tied_copy = v * h
    assert held == m.num_parameters() + extra + tied_copy


def test_tied_embedding_is_shared_when_one_stage():
    m = PRESETS["gpt3-1.3b"]
    one = memory_plan(job(m)).stages[0].parameters
    assert one == m.num_parameters()
    untied = m.model_copy(update={"untie_embeddings_and_output_weights": True})
    assert memory_plan(job(untied)).stages[0].parameters == untied.num_parameters() == one + m.vocab_size * m.hidden_size


@pytest.mark.parametrize("overrides", [dict(swiglu=True, add_bias_linear=False, normalization="RMSNorm",
                                            position_embedding_type="rope", num_query_groups=8),
                                       dict(num_query_groups=4), dict()])
def test_layer_parameters_per_rank_sum_to_layer_parameters(overrides):
    m = ModelSpec(num_layers=4, hidden_size=1024, num_attention_heads=16, **overrides)
    assert layer_parameters_per_rank(m, 1) == m.layer_parameters()
    for t in (2, 4):
        replicated = 2 * m.norm_parameters() + (2 * m.hidden_size if m.add_bias_linear else 0)
        assert (layer_parameters_per_rank(m, t) - replicated) * t == m.layer_parameters() - replicated


def test_distributed_optimizer_shards_the_fp32_state():
    """Megatron: 6 + 12/d bytes per parameter with the distributed optimizer, 18 without."""
    common = dict(tensor_parallel_size=8, pipeline_parallel_size=8, data_parallel_size=4, global_batch_size=64)
    plain = memory_plan(job("gpt3-175b", **common)).stages[1]
    dist = memory_plan(job("gpt3-175b", use_distributed_optimizer=True, **common)).stages[1]
    assert plain.optimizer_bytes == 12 * plain.parameters
    assert dist.weights_bytes + dist.gradients_bytes == 6 * dist.parameters
    assert dist.optimizer_bytes == 12 * dist.parameters // 4
    fp32 = memory_plan(job("gpt3-175b", precision="fp32", **common)).stages[1]
    assert (fp32.weights_bytes, fp32.gradients_bytes, fp32.optimizer_bytes) == tuple(
        k * fp32.parameters for k in (4, 4, 8))


# --- peak, reserve, verdict ----------------------------------------------------------------------------

def test_peak_is_the_sum_and_the_verdict_uses_the_gpu_memory():
    mp = memory_plan(table3_job("megatron-22b"))
    s = mp.stages[0]
    assert s.peak_bytes == sum((s.weights_bytes, s.gradients_bytes, s.optimizer_bytes, s.activations_bytes,
                                s.transient_bytes, s.reserve_bytes))
    assert s.reserve_bytes >= CONTEXT_RESERVE_BYTES + WORKSPACE_RESERVE_BYTES
    # Figure 1: the 22B baseline (about 105 GiB) does not fit in 80 GB; SP + selective (about 56 GiB) does
    assert mp.capacity_bytes == 80 * GIB and not mp.fits and mp.overflowing_stage == 0
    assert memory_plan(table3_job("megatron-22b", sp=True, recompute="selective")).fits


def test_transient_is_one_recomputed_group():
    sel = memory_plan(table3_job("gpt3-175b", sp=True, recompute="selective")).stages[0]
    m = PRESETS["gpt3-175b"]
    s, a = m.seq_length, m.num_attention_heads
    assert sel.transient_bytes == 5 * a * s * s // 8  # softmax, dropout mask and output of one layer
    assert memory_plan(table3_job("gpt3-175b")).stages[0].transient_bytes == 0


# --- properties ----------------------------------------------------------------------------------------

DIVISORS = {name: [d for d in (1, 2, 4, 8) if m.num_attention_heads % d == 0] for name, m in PRESETS.items()}


@st.composite
def valid_jobs(draw, recompute=True):
    name = draw(st.sampled_from(sorted(PRESETS)))
    m = PRESETS[name]
    t = draw(st.sampled_from(DIVISORS[name]))
    p = draw(st.sampled_from([d for d in range(1, 17) if m.num_layers % d == 0]))
    v = draw(st.sampled_from([d for d in (1, 2, 3, 4) if p > 1 and m.num_layers % (p * d) == 0] or [1]))
    dp = draw(st.sampled_from([1, 2, 8]))
    mbs = draw(st.sampled_from([1, 2, 4]))
    k = draw(st.integers(1, 4))
    plan = dict(
        tensor_parallel_size=t, pipeline_parallel_size=p, data_parallel_size=dp, virtual_pipeline_stages=v,
        micro_batch_size=mbs, global_batch_size=mbs * dp * p * k,
        # a model with experts beside TP must use SP (Megatron's rule); a dense one may
        sequence_parallel=t > 1 and (m.is_moe or draw(st.booleans())),
        use_distributed_optimizer=draw(st.booleans()),
        use_flash_attention=draw(st.booleans()),
        precision=draw(st.sampled_from(["bf16", "fp16", "fp32"])),
    )
    return job(name, **plan)


def _with_recompute(j: Job, granularity: str, method: str = "uniform", num_layers: int = 1) -> Job:
    policy = RecomputePolicy(granularity=granularity, method=method, num_layers=num_layers)
    return j.model_copy(update={"plan": j.plan.model_copy(update={"recompute": policy})})


@given(valid_jobs())
def test_valid_plans_give_finite_positive_numbers(j):
    mp = memory_plan(j)
    assert len(mp.stages) == j.plan.pipeline_parallel_size
    for s in mp.stages:
        for value in (s.weights_bytes, s.gradients_bytes, s.optimizer_bytes, s.activations_bytes,
                      s.reserve_bytes, s.peak_bytes):
            assert value > 0 and math.isfinite(value)
        assert s.in_flight >= 1
    assert mp.peak_bytes == max(s.peak_bytes for s in mp.stages)
    assert mp.fits == (mp.overflowing_stage is None) == (mp.peak_bytes <= mp.capacity_bytes)


@given(valid_jobs())
def test_more_recompute_never_needs_more_memory(j):
    def peaks(jj):
        return [s.peak_bytes for s in memory_plan(jj).stages]

    chunk = min(j.layers_per_chunk)
    ladder = [peaks(_with_recompute(j, "none")), peaks(_with_recompute(j, "selective")),
              peaks(_with_recompute(j, "full"))]
    for more, less in zip(ladder[1:], ladder):
        assert all(a <= b for a, b in zip(more, less))
    block = [peaks(_with_recompute(j, "full", "block", k)) for k in range(1, chunk + 1)]
    for more, less in zip(block[1:], block):
        assert all(a <= b for a, b in zip(more, less))
    assert all(a <= b for a, b in zip(block[0], ladder[0]))
    assert block[-1] == ladder[2]  # every layer checkpointed: block and uniform agree


@given(valid_jobs())
def test_larger_tp_never_needs_more_weight_memory(j):
    name = j.model.name
    weights = []
    for t in DIVISORS[name]:
        # SP splits no weight; a model with experts beside TP must have it on (Megatron's rule)
        plan = j.plan.model_copy(update={"tensor_parallel_size": t, "sequence_parallel": t > 1 and j.model.is_moe})
        weights.append([s.weights_bytes for s in memory_plan(Job(model=j.model, cluster=j.cluster, plan=plan)).stages])
    for larger, smaller in zip(weights[1:], weights):
        assert all(a <= b for a, b in zip(larger, smaller))


@given(st.integers(-2, 200), st.integers(-2, 20), st.integers(-2, 40), st.integers(-1, 8), st.integers(-1, 9),
       st.booleans(), st.sampled_from(["none", "selective", "full"]), st.integers(-1, 3),
       st.sampled_from(sorted(PRESETS)))
def test_any_plan_is_valid_or_a_project_error(t, p, gbs, v, mbs, sp, granularity, k, name):
    """Random raw values at the boundary: either a job that obeys every rule, or a SimulatorError."""
    try:
        j = job_from_options(model=name, tensor_parallel_size=t, pipeline_parallel_size=p, global_batch_size=gbs,
                             virtual_pipeline_stages=v, micro_batch_size=mbs, sequence_parallel=sp,
                             recompute_granularity=granularity, recompute_num_layers=k)
    except SimulatorError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    plan = j.plan
    assert min(plan.tensor_parallel_size, plan.pipeline_parallel_size, plan.micro_batch_size) >= 1
    assert j.model.num_attention_heads % plan.tensor_parallel_size == 0
    assert j.model.num_layers % (plan.pipeline_parallel_size * plan.virtual_pipeline_stages) == 0
    assert plan.global_batch_size % (plan.micro_batch_size * plan.data_parallel_size) == 0
    assert not plan.sequence_parallel or plan.tensor_parallel_size > 1
    assert memory_plan(j).peak_bytes > 0


def test_state_dtypes_set_the_bytes_per_parameter():
    """bf16 gradients halve the gradient buffer; FP8 weights take 1 byte for the linear layers' matrices only;
    the precision-aware optimizer's dtypes (and its 2-byte remainders of fp32 master weights) set the state."""
    from simulator.cli.options import job_from_options
    from simulator.graph.parameters import stage_fp8_parameters
    from simulator.estimator.memory import stage_state

    common = dict(model="llama3-8b", cluster="dgx-h100", gpus=8, use_distributed_optimizer=True,
                  fp8_format="hybrid", global_batch_size=8)
    base = stage_state(job_from_options(**common), 0)
    bf16 = stage_state(job_from_options(**common, grad_reduce_in_bf16=True), 0)
    assert (base.gradients, bf16.gradients) == (4 * base.parameters, 2 * base.parameters)
    fp8_job = job_from_options(**common, overlap_grad_reduce=True, fp8_param_gather=True)
    fp8 = stage_state(fp8_job, 0)
    linear, experts = stage_fp8_parameters(fp8_job, 0)
    assert experts == 0 and 0.8 * base.parameters < linear < base.parameters  # embedding and output stay bf16
    assert base.weights - fp8.weights == linear
    aware = stage_state(job_from_options(**common, use_precision_aware_optimizer=True, exp_avg_dtype="bf16",
                                         exp_avg_sq_dtype="bf16"), 0)
    assert aware.optimizer == -(-base.parameters * (2 + 2 + 2) // 8)  # remainders, m, v: 6 bytes over DP 8
    kept = stage_state(job_from_options(**common, use_precision_aware_optimizer=True, store_param_remainders=False), 0)
    assert kept.optimizer == base.optimizer


@pytest.mark.parametrize("flags, needle", [
    (dict(grad_reduce_in_bf16=True, precision="fp16"), "is for bf16"),
    (dict(exp_avg_dtype="bf16", use_distributed_optimizer=True), "needs use_precision_aware_optimizer"),
    (dict(use_precision_aware_optimizer=True), "distributed optimizer"),
    (dict(fp8_param_gather=True, use_distributed_optimizer=True), "fp8_format"),
    (dict(grad_reduce_in_bf16=True, accumulate_allreduce_grads_in_fp32=True), "contradicts"),
])
def test_state_dtype_rules_are_one_sentence(flags, needle):
    from simulator.cli.options import job_from_options
    from simulator.spec.errors import ConfigError

    with pytest.raises(ConfigError, match=needle):
        job_from_options(model="gpt3-1.3b", gpus=8, **flags)
