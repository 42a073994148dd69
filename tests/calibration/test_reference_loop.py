"""The reference loop on CPU: parallelism and recompute do not change the math, and every layer
saves exactly the bytes the simulator's memory model says (Korthikanti Table 2; flash attention's
q, k, v and fp32 log-sum-exp under the fused backends and context parallelism; the MoE layer's
tensors at the copies its experts took, with what the model does not declare named).

Starting processes is the slow part, so the jobs run in four launches (1, 2, 3 and 4 processes)
shared by every test here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from calibration.reference.launch import run_batch  # noqa: E402
from simulator.graph.layers import transformer_layer
from simulator.measure.run_record import RunRecord, load_run_record
from simulator.spec._io import build
from simulator.spec.hardware import load_cluster
from simulator.spec.model import ModelSpec
from simulator.spec.plan import Job, ParallelPlan, RecomputeGranularity

# every layout of the reference loop runs for real on gloo processes (over a minute and a half on 2
# cores): `make test-slow` runs it
pytestmark = pytest.mark.slow

TOLERANCE = 1e-5  # fp32, a few steps: only the order of the TP/DP sums differs
ITERATIONS = 3

# dropout off where layouts are compared (each layout draws its masks over different shards);
# on where recompute is compared within one layout (checkpointing restores the RNG state)
TINY = dict(num_layers=4, hidden_size=32, num_attention_heads=4, vocab_size=128, seq_length=16)
NO_DROPOUT = ModelSpec(name="tiny-nodrop", attention_dropout=0.0, hidden_dropout=0.0, **TINY)
DROPOUT = ModelSpec(name="tiny", **TINY)
# six layers: PP 2 x VPP 2 with the embedding and the loss each counted as a layer splits 6 + 2 evenly
SIX_LAYERS = ModelSpec(name="tiny6-nodrop", attention_dropout=0.0, hidden_dropout=0.0, **{**TINY, "num_layers": 6})
# the loop's fused (flash-style) attention has no attention dropout; hidden dropout stays on where recompute is compared
HIDDEN_DROPOUT = ModelSpec(name="tiny-hidden-dropout", attention_dropout=0.0, **TINY)
# mixture of experts in layers 0 and 2 (dense 1 and 3): 4 experts, top-2, experts of their own inner size
MOE = ModelSpec(name="tiny-moe", attention_dropout=0.0, hidden_dropout=0.0, num_experts=4, moe_router_topk=2,
                moe_ffn_hidden_size=48, moe_layer_freq=2, **TINY)
MOE_SHARED = MOE.model_copy(update={"name": "tiny-moe-shared", "moe_shared_expert_intermediate_size": 32})


def _job(model: ModelSpec, granularity: str = "none", method: str = "uniform", recompute_layers: int = 1,
         **plan) -> Job:
    plan.setdefault("global_batch_size", 4)
    plan.setdefault("attention_backend", "unfused")
    recompute = {"granularity": granularity, "method": method, "num_layers": recompute_layers}
    return Job(model=model, cluster=load_cluster("dgx-a100-80gb"),
               plan=ParallelPlan(precision="fp32", recompute=recompute, **plan))


LAYOUTS = {  # name -> (processes, job); "single" (or "single6") is the reference every layout must reproduce
    "single": (1, _job(NO_DROPOUT)),
    "single6": (1, _job(SIX_LAYERS)),
    "tp2": (2, _job(NO_DROPOUT, tensor_parallel_size=2)),
    "tp2-sp": (2, _job(NO_DROPOUT, tensor_parallel_size=2, sequence_parallel=True)),
    "pp2": (2, _job(NO_DROPOUT, pipeline_parallel_size=2)),
    "pp2-vpp2": (2, _job(NO_DROPOUT, pipeline_parallel_size=2, virtual_pipeline_stages=2)),
    "dp2": (2, _job(NO_DROPOUT, data_parallel_size=2)),
    # buckets of 5,000 parameters reduced as they fill during the last backward (several per chunk)
    "dp2-buckets": (2, _job(NO_DROPOUT, data_parallel_size=2, overlap_grad_reduce=True, ddp_bucket_size=5000)),
    "tp2-pp2": (4, _job(NO_DROPOUT, tensor_parallel_size=2, pipeline_parallel_size=2)),
    "tp2-pp2-sp": (4, _job(NO_DROPOUT, tensor_parallel_size=2, pipeline_parallel_size=2, sequence_parallel=True)),
    # uneven pipeline stages, as Megatron splits them
    "pp2-first1-last3": (2, _job(NO_DROPOUT, pipeline_parallel_size=2, decoder_first_pipeline_num_layers=1,
                                 decoder_last_pipeline_num_layers=3)),
    "pp2-vpp2-accounted": (2, _job(SIX_LAYERS, pipeline_parallel_size=2, virtual_pipeline_stages=2,
                                   account_for_embedding_in_pipeline_split=True,
                                   account_for_loss_in_pipeline_split=True)),
    "pp2-vpp2-first2-last4": (2, _job(SIX_LAYERS, pipeline_parallel_size=2, virtual_pipeline_stages=2,
                                      decoder_first_pipeline_num_layers=2, decoder_last_pipeline_num_layers=4)),
    "pp3-first2": (3, _job(NO_DROPOUT, pipeline_parallel_size=3, decoder_first_pipeline_num_layers=2)),
    # fused (flash-style) attention, and context parallelism's ring attention over it
    "fused": (1, _job(NO_DROPOUT, attention_backend="flash")),
    "cp2": (2, _job(NO_DROPOUT, context_parallel_size=2, attention_backend="auto")),
    "cp2-tp2-sp": (4, _job(NO_DROPOUT, context_parallel_size=2, tensor_parallel_size=2, sequence_parallel=True,
                           micro_batch_size=2, attention_backend="auto")),
    "cp4": (4, _job(NO_DROPOUT, context_parallel_size=4, attention_backend="auto")),  # a ring of more than 2
    "cp2-pp2": (4, _job(NO_DROPOUT, context_parallel_size=2, pipeline_parallel_size=2, attention_backend="auto")),
    "cp2-dp2": (4, _job(NO_DROPOUT, context_parallel_size=2, data_parallel_size=2, attention_backend="auto")),
    # mixture of experts: EP 2 over DP 2 with both dispatchers, under full recompute, over CP and PP; EP 2 x TP 2
    # (experts split over ETP = TP, or whole with ETP 1 and two EDP replicas), with shared experts
    "moe-single": (1, _job(MOE)),
    "moe-shared-single": (1, _job(MOE_SHARED)),
    "moe-ep2": (2, _job(MOE, data_parallel_size=2, expert_model_parallel_size=2,
                        moe_token_dispatcher_type="alltoall")),
    "moe-ep2-allgather": (2, _job(MOE, data_parallel_size=2, expert_model_parallel_size=2)),
    "moe-ep2-full": (2, _job(MOE, "full", data_parallel_size=2, expert_model_parallel_size=2,
                             moe_token_dispatcher_type="alltoall")),
    "moe-cp2-ep2": (2, _job(MOE, context_parallel_size=2, expert_model_parallel_size=2, attention_backend="auto",
                            moe_token_dispatcher_type="alltoall")),
    "moe-ep2-tp2": (4, _job(MOE_SHARED, tensor_parallel_size=2, sequence_parallel=True, data_parallel_size=2,
                            expert_model_parallel_size=2, moe_token_dispatcher_type="alltoall")),
    "moe-ep2-tp2-allgather": (4, _job(MOE, tensor_parallel_size=2, sequence_parallel=True, data_parallel_size=2,
                                      expert_model_parallel_size=2)),
    "moe-ep2-tp2-etp1": (4, _job(MOE, tensor_parallel_size=2, sequence_parallel=True, data_parallel_size=2,
                                 expert_model_parallel_size=2, expert_tensor_parallel_size=1,
                                 moe_token_dispatcher_type="alltoall")),
    "moe-pp2-ep2": (4, _job(MOE, pipeline_parallel_size=2, data_parallel_size=2, expert_model_parallel_size=2,
                            moe_token_dispatcher_type="alltoall")),
}
SINGLE = ("single", "single6", "moe-single", "moe-shared-single")
MOE_LAYOUTS = [name for name in LAYOUTS if name.startswith("moe-") and name not in SINGLE]
# no routing decision of the tests may sit within the layouts' rounding differences (about 1e-7) of a tie,
# or the layouts would route a token differently: the gap between the k-th and the (k+1)-th logit is checked
ROUTER_MARGIN = 1e-5
# (stage, chunk) of each layer in Megatron's numbering (get_transformer_layer_offset): model chunk c*p + s
# holds consecutive layers, the embedding and the loss take a layer's place in the first and last chunk
STAGE_AND_CHUNK_OF_LAYERS = {
    "pp2-first1-last3": [(0, 0), (1, 0), (1, 0), (1, 0)],
    "pp2-vpp2-accounted": [(0, 0), (1, 0), (1, 0), (0, 1), (0, 1), (1, 1)],
    "pp2-vpp2-first2-last4": [(0, 0), (1, 0), (1, 0), (0, 1), (1, 1), (1, 1)],
    "pp3-first2": [(0, 0), (0, 0), (1, 0), (2, 0)],
    "pp2-vpp2": [(0, 0), (1, 0), (0, 1), (1, 1)],
}
RECOMPUTE = {  # name -> (processes, job); each group of one layout must give the same losses
    f"{layout}-{g}": (n, _job(DROPOUT, g, **plan))
    for layout, n, plan in (("tp1", 1, {}), ("tp2", 2, {"tensor_parallel_size": 2}),
                            ("tp2-sp", 2, {"tensor_parallel_size": 2, "sequence_parallel": True}))
    for g in ("none", "selective", "full")
}
RECOMPUTE.update({f"cp2-{g}": (2, _job(HIDDEN_DROPOUT, g, context_parallel_size=2, attention_backend="auto"))
                  for g in ("none", "selective", "full")})
RECOMPUTE["tp1-block"] = (1, _job(DROPOUT, "full", method="block", recompute_layers=2))
RECOMPUTE["tp2-sp-block"] = (2, _job(DROPOUT, "full", method="block", recompute_layers=1,
                                     tensor_parallel_size=2, sequence_parallel=True))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[RunRecord, Path]]:
    root = tmp_path_factory.mktemp("reference")
    jobs = {**LAYOUTS, **RECOMPUTE}
    for nproc in sorted({n for n, _ in jobs.values()}):
        entries = [
            {"job": job, "out": root / f"{name}.json", "iterations": ITERATIONS,
             "dump_gradients": root / name if name in LAYOUTS else None}
            for name, (n, job) in jobs.items() if n == nproc
        ]
        run_batch(entries, nproc=nproc, device="cpu", workdir=root / f"launch{nproc}")
    return {name: (load_run_record(root / f"{name}.json"), root / name) for name in jobs}


def rank_dumps(directory: Path) -> list[dict]:
    return [torch.load(path) for path in sorted(directory.glob("rank*.pt"))]


def full_gradients(directory: Path) -> dict[str, "torch.Tensor"]:
    """Reassemble each parameter's gradient from its TP (or ETP) slices, taking each slice from the first rank
    that holds it: every rank of DP x CP holds the same reduced dense gradients, every rank of EDP the same
    expert gradients, and an expert lives on one EP rank only."""
    shards: dict[str, dict[int, tuple]] = {}
    for dump in rank_dumps(directory):
        for name, (grad, dim, shard) in dump["grads"].items():
            shards.setdefault(name, {}).setdefault(shard, (grad, dim))
    out = {}
    for name, by_rank in shards.items():
        parts = [by_rank[r] for r in sorted(by_rank)]
        dim = parts[0][1]
        out[name] = parts[0][0] if dim is None else torch.cat([g for g, _ in parts], dim=dim)
    return out


def single_process_run(runs, layout: str):
    """The one-process run of the same model."""
    model = LAYOUTS[layout][1].model
    (name,) = [n for n in SINGLE if LAYOUTS[n][1].model == model]
    return runs[name]


@pytest.mark.parametrize("layout", [name for name in LAYOUTS if name not in SINGLE])
def test_parallel_layouts_reproduce_the_single_process_losses_and_gradients(runs, layout):
    single, single_dir = single_process_run(runs, layout)
    record, directory = runs[layout]
    assert len(record.losses) == ITERATIONS
    assert max(abs(a - b) for a, b in zip(record.losses, single.losses)) <= TOLERANCE
    assert record.losses[-1] < record.losses[0]  # it trains
    expected, got = full_gradients(single_dir), full_gradients(directory)
    assert sorted(got) == sorted(expected)
    for name, grad in expected.items():
        assert got[name].shape == grad.shape, name
        assert (got[name] - grad).abs().max().item() <= TOLERANCE, name


@pytest.mark.parametrize("layout", [name for name in LAYOUTS if name not in SINGLE])
def test_every_rank_clips_by_the_norm_of_the_whole_models_gradients(runs, layout):
    """Megatron's gradient clipping: each rank counts the copies it holds once (replicated over DP x CP, over TP
    when not split, over EDP for experts, the tied embedding on both ends of the pipeline) and one all-reduce
    gives every rank the norm of the single-process model's gradients."""
    single_dir = single_process_run(runs, layout)[1]
    expected = sum(g.double().square().sum().item() for g in full_gradients(single_dir).values()) ** 0.5
    norms = [dump["grad_norm"] for dump in rank_dumps(runs[layout][1])]
    assert norms and all(abs(n - expected) <= 1e-5 * expected for n in norms), (norms, expected)


def test_the_test_models_gradients_are_clipped(runs):
    """The losses above are compared after clipped steps: the tiny models' gradients exceed Megatron's --clip-grad."""
    from calibration.reference.grads import CLIP_GRAD
    assert all(rank_dumps(runs[name][1])[0]["grad_norm"] > CLIP_GRAD for name in SINGLE)


@pytest.mark.parametrize("layout", ["tp1", "tp2", "tp2-sp", "cp2"])
def test_recompute_does_not_change_the_math(runs, layout):
    none = runs[f"{layout}-none"][0].losses
    for granularity in ("selective", "full"):
        assert runs[f"{layout}-{granularity}"][0].losses == pytest.approx(none, abs=TOLERANCE)


def test_block_recompute_matches_no_recompute(runs):
    assert runs["tp1-block"][0].losses == pytest.approx(runs["tp1-none"][0].losses, abs=TOLERANCE)
    assert runs["tp2-sp-block"][0].losses == pytest.approx(runs["tp2-sp-none"][0].losses, abs=TOLERANCE)


def local_tokens(record: RunRecord) -> int:
    """Tokens a norm sees on one rank: s b / cp, and / t under sequence parallelism."""
    plan = record.plan
    tokens = record.model.seq_length * plan.micro_batch_size // plan.context_parallel_size
    return tokens // plan.tensor_parallel_size if plan.sequence_parallel else tokens


def norm_statistics_bytes(record: RunRecord, granularity: RecomputeGranularity) -> int:
    """What PyTorch's LayerNorm keeps beyond its input: an fp32 mean and 1/std per local token, for
    each of the layer's two norms. The paper and the simulator leave them out; under full
    recompute the layer keeps only its input, so there are none."""
    if granularity is RecomputeGranularity.full:
        return 0
    return 2 * 2 * local_tokens(record) * 4


def metered_expert_tokens(directory: Path, index: int) -> int:
    """The copies the experts of the metered rank (its stage's TP, CP and DP rank 0) took in the metered
    micro-batch."""
    (dump,) = [d for d in rank_dumps(directory) if index in d["expert_tokens"]
               and d["tp_rank"] == d["cp_rank"] == d["dp_rank"] == 0]
    return dump["expert_tokens"][index]


def modelled_moe_bytes(record: RunRecord, tokens: int, granularity: RecomputeGranularity) -> int:
    """The memory model's MoE layer evaluated at the copies its experts really took. The model plans for the
    balanced share times moe_load_imbalance; every expert tensor it declares ('experts.*') is copies x width,
    so each is rescaled from the planned count to the measured one."""
    saved = transformer_layer(record.model, record.plan, moe=True).saved_tensors(granularity)
    fc1_input = next((t for t in saved if t.name == "experts.fc1.input"), None)
    if fc1_input is None:  # full recompute keeps the layer's input only
        return sum(t.bytes for t in saved)
    planned = fc1_input.numel // record.model.hidden_size
    return sum(t.bytes * tokens // planned if t.name.startswith("experts.") else t.bytes for t in saved)


@pytest.mark.parametrize("name", list(LAYOUTS) + list(RECOMPUTE))
def test_each_layer_saves_exactly_the_modelled_bytes(runs, name):
    record, directory = runs[name]
    layer_graph = transformer_layer(record.model, record.plan)
    assert len(record.layers) == record.model.num_layers
    for layer in record.layers:
        g = layer.recompute_granularity
        expected = layer_graph.activation_bytes(g)
        if record.model.is_moe_layer(layer.index):
            tokens = metered_expert_tokens(directory, layer.index)
            expected = modelled_moe_bytes(record, tokens, g)
        assert layer.activation_bytes == expected, (name, layer.index, g)
        assert layer.norm_statistics_bytes == norm_statistics_bytes(record, g), (name, layer.index)


@pytest.mark.parametrize("layout", MOE_LAYOUTS)
def test_the_experts_take_the_balanced_share_on_average(runs, layout):
    """Each copy a rank routes is computed by one EP rank, on each of its ETP ranks: over a stage's ranks the
    mean count is the balanced share the model plans for, local tokens x k x ETP. The routing here is not
    balanced (rank 0 takes more or fewer), so the byte checks above hold away from the planned count."""
    record, directory = runs[layout]
    dumps = rank_dumps(directory)
    share = local_tokens(record) * record.model.moe_router_topk * record.plan.expert_tp_size
    unbalanced = False
    for index in range(record.model.num_layers):
        counts = [d["expert_tokens"][index] for d in dumps if index in d["expert_tokens"]]
        assert bool(counts) == record.model.is_moe_layer(index)
        if counts:
            assert sum(counts) == share * len(counts), (index, counts)
            unbalanced |= len(set(counts)) > 1
    assert unbalanced


def test_no_routing_decision_is_near_a_tie(runs):
    """Layouts sum in other orders, so their router logits differ in the last bits: each chosen expert must beat
    every unchosen one by far more than that, or the layouts could route a token differently."""
    for name in (n for n in LAYOUTS if n.startswith("moe-")):
        margins = [d["router_margin"] for d in rank_dumps(runs[name][1])]
        assert min(margins) > ROUTER_MARGIN, (name, margins)


@pytest.mark.parametrize("layout", sorted(STAGE_AND_CHUNK_OF_LAYERS))
def test_each_rank_builds_the_layers_megatron_gives_its_chunks(runs, layout):
    record = runs[layout][0]
    assert [(layer.stage, layer.chunk) for layer in record.layers] == STAGE_AND_CHUNK_OF_LAYERS[layout]
    assert [layer.index for layer in record.layers] == list(range(record.model.num_layers))


def test_recompute_saves_less_and_block_recompute_mixes(runs):
    for layout in ("tp1", "tp2", "tp2-sp", "cp2"):
        saved = [runs[f"{layout}-{g}"][0].layers[0].activation_bytes for g in ("none", "selective", "full")]
        assert saved[0] > saved[1] > saved[2] > 0
    block = [layer.recompute_granularity.value for layer in runs["tp1-block"][0].layers]
    assert block == ["full", "full", "none", "none"]


def test_fused_attention_keeps_q_k_v_and_the_fp32_log_sum_exp_instead_of_the_probabilities(runs):
    """Against the unfused path the fused one drops the s x s softmax output (b a s^2 fp32 here) and keeps
    one fp32 log-sum-exp per row; under CP each rank keeps its s/cp rows, and selective recompute drops
    exactly the log-sum-exp (q, k, v are the checkpoint's inputs, the output the projection's)."""
    m, b = NO_DROPOUT, 1
    lse = b * m.num_attention_heads * m.seq_length * 4
    probabilities = b * m.num_attention_heads * m.seq_length ** 2 * 4
    unfused, fused = (runs[name][0].layers[0].activation_bytes for name in ("single", "fused"))
    assert unfused - fused == probabilities - lse
    none, selective = (runs[f"cp2-{g}"][0].layers[0].activation_bytes for g in ("none", "selective"))
    assert none - selective == lse // 2


def test_records_carry_times_for_every_layer(runs):
    record = runs["tp2-pp2"][0]
    assert record.world_size == 4 and record.peak_allocated_bytes_per_stage is None
    assert {layer.stage for layer in record.layers} == {0, 1}
    for layer in record.layers:
        assert layer.forward_s > 0 and layer.backward_s > 0 and layer.recompute_s == 0
    for layer in runs["tp2-selective"][0].layers:
        assert layer.recompute_s > 0
    assert all(t > 0 for t in record.iteration_times_s)


def test_every_rank_runs_one_thread_even_alone(runs):
    """torchrun sets OMP_NUM_THREADS only for more than one process; the loop sets and records it."""
    for name in ("single", "tp2", "tp2-pp2"):
        record = runs[name][0]
        assert record.threads_per_rank == 1 and record.device == "cpu (1 threads per rank)"
        assert record.load_average is not None


def test_megatron_timers_per_iteration_and_rank(runs):
    from calibration.reference.timers import TIMER_NAMES

    for name in ("single", "tp2-sp", "pp2", "dp2", "dp2-buckets", "tp2-pp2"):
        record = runs[name][0]
        assert set(record.timers) == {*TIMER_NAMES, "iteration"}
        for per_iteration in record.timers.values():
            assert len(per_iteration) == ITERATIONS and all(len(r) == record.world_size for r in per_iteration)
        for i in range(ITERATIONS):
            for rank in range(record.world_size):
                parts = sum(record.timers[t][i][rank] for t in TIMER_NAMES)
                assert 0 < parts <= record.timers["iteration"][i][rank] * 1.01 + 1e-4, (name, i, rank)
                assert record.timers["forward-compute"][i][rank] > 0 and record.timers["backward-compute"][i][rank] > 0

    def total(name: str, timer: str) -> float:
        return sum(map(sum, runs[name][0].timers[timer]))

    assert total("pp2", "forward-recv") > 0 and total("pp2", "backward-send") > 0
    assert total("single", "forward-recv") == 0
    assert total("tp2-sp", "layernorm-grads-all-reduce") > 0 and total("tp2", "layernorm-grads-all-reduce") == 0
    assert total("dp2", "grads-all-reduce") > 0
    assert total("tp2-pp2", "embedding-grads-all-reduce") > 0


def test_gradients_accumulate_in_an_fp32_buffer_in_buckets():
    """Megatron-Core's layout: one fp32 buffer in reverse parameter order, split at the bucket size."""
    from torch import nn

    from calibration.reference.grads import GradBuffer

    params = [nn.Parameter(torch.zeros(3000, dtype=torch.bfloat16)) for _ in range(4)]
    buffer = GradBuffer(params, dp_group=None, dp_size=1, bucket_params=5000, overlap=True, device=torch.device("cpu"))
    assert buffer.buffer.dtype == torch.float32 and buffer.num_buckets == 2
    assert params[-1].main_grad.data_ptr() == buffer.buffer.data_ptr()  # the last parameter comes first
    (sum(p.float().sum() for p in params) * 2).backward()
    assert all(p.grad is None and torch.equal(p.main_grad, torch.full((3000,), 2.0)) for p in params)
    one = GradBuffer(params, dp_group=None, dp_size=1, bucket_params=5000, overlap=False, device=torch.device("cpu"))
    assert one.num_buckets == 1  # without overlap Megatron keeps one bucket


def test_weight_gradients_accumulate_into_main_grad_in_the_gemm():
    """Gradient-accumulation fusion: the weight-gradient GEMM adds into main_grad (twice over two backwards, once
    each), the hook adds nothing more; a weight with a second use (the tied embedding) gets zeros from the GEMM
    and its other gradient through the hook."""
    from torch import nn

    from calibration.reference.grads import GradBuffer
    from calibration.reference.parallel import column_parallel_matmul

    torch.manual_seed(0)
    weight, tied = nn.Parameter(torch.randn(5, 4)), nn.Parameter(torch.randn(5, 4))
    tied.zero_out_wgrad = True
    GradBuffer([weight, tied], dp_group=None, dp_size=1, bucket_params=None, overlap=False, device=torch.device("cpu"))
    x = torch.randn(3, 4)
    for _ in range(2):
        (column_parallel_matmul(x, weight, None, None, False).sum()
         + column_parallel_matmul(x, tied, None, None, False).sum() + tied.sum()).backward()
    wgrad = torch.ones(3, 5).t() @ x
    assert weight.grad is None and torch.allclose(weight.main_grad, 2 * wgrad)
    assert torch.allclose(tied.main_grad, 2 * (wgrad + 1.0))


def test_this_torch_reduce_scatters_and_all_gathers_on_gloo_in_one_call():
    """The SP collectives use gloo's single-tensor calls where the installed torch has them, not an emulation."""
    from calibration.reference import parallel

    assert parallel._REDUCE_SCATTER is not None and parallel._ALL_GATHER is not None


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_each_rank_holds_two_load_balanced_chunks_and_the_ring_computes_exactly_the_visible_blocks(cp):
    """Rank r holds chunks r and 2cp-1-r; at each ring step the block it computes (rows x columns, causal or
    not) is exactly where the causal mask over the global positions lets a query see a key, and every rank
    sees as many (query, key) pairs."""
    from calibration.reference.attention import _visible, context_parallel_positions

    s = 8 * cp
    positions = [context_parallel_positions(s, cp, r) for r in range(cp)]
    assert sorted(torch.cat(positions).tolist()) == list(range(s))
    pairs = []
    for r in range(cp):
        n = s // (2 * cp)
        assert positions[r].tolist() == [*range(r * n, (r + 1) * n), *range((2 * cp - 1 - r) * n, (2 * cp - r) * n)]
        seen = 0
        for src in range(cp):
            visible = positions[src].unsqueeze(0) <= positions[r].unsqueeze(1)  # (queries, keys)
            rows, cols, causal = _visible(r, src, s // cp // 2)
            computed = torch.zeros_like(visible)
            block = torch.ones_like(computed[rows, cols])
            computed[rows, cols] = block.tril() if causal else block
            assert torch.equal(computed, visible), (cp, r, src)
            seen += int(visible.sum())
        pairs.append(seen)
    assert len(set(pairs)) == 1


def test_the_moe_functions_differentiate_correctly():
    """The MoE layer's own autograd functions against finite differences (float64, one process)."""
    from calibration.reference.moe import _Permute, _SortChunks, _Unpermute, _WeightedGelu

    gen = torch.Generator().manual_seed(0)
    z, p = (torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True) for shape in ((5, 3), (5,)))
    assert torch.autograd.gradcheck(_WeightedGelu.apply, (z, p))
    tokens, probs = (torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True)
                     for shape in ((4, 3), (4, 2)))
    order = torch.argsort(torch.tensor([1, 0, 2, 1, 0, 2, 3, 1]), stable=True)  # 4 tokens x top-2 choices
    assert torch.autograd.gradcheck(lambda t, q: _Permute.apply(t, q, order, 2), (tokens, probs))
    copies = torch.randn((8, 3), generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda c: _Unpermute.apply(c, order, 2, 4), (copies,))
    assert torch.autograd.gradcheck(lambda c: _SortChunks.apply(c, [1, 2, 0, 3, 1, 1], 2), (copies,))
    # chunks (source 0: experts 0 1 2, source 1: experts 0 1 2) sorted to (expert 0: sources 0 1, ...)
    sorted_rows = _SortChunks.apply(torch.arange(8.0).unsqueeze(1), [1, 2, 0, 3, 1, 1], 2).squeeze(1)
    assert sorted_rows.tolist() == [0.0, 3.0, 4.0, 5.0, 1.0, 2.0, 6.0, 7.0]


def test_the_loop_refuses_what_its_moe_layer_does_not_implement():
    from calibration.reference.launch import check_supported
    from simulator.spec.errors import ConfigError

    alltoall = {"moe_token_dispatcher_type": "alltoall"}
    cases = [
        (MOE.model_copy(update={"moe_expert_capacity_factor": 1.0}), {},
         r"token dropping \(moe_expert_capacity_factor=1.0\); leave moe_expert_capacity_factor unset \(dropless\)$"),
        (MOE, {"tensor_parallel_size": 2},
         "tensor_parallel_size=2 and no sequence parallelism; add --sequence-parallel$"),
        (MOE, {"data_parallel_size": 3, "expert_model_parallel_size": 3, "global_batch_size": 3},
         "expert_model_parallel_size=3 does not divide num_experts=4"),
        (MOE, {"expert_model_parallel_size": 2, **alltoall}, r"expert_model_parallel_size=2 x "
         r"expert_tensor_parallel_size=1 does not divide the 1 TP x CP x DP ranks of a stage"),
        (NO_DROPOUT, {"data_parallel_size": 2, "expert_model_parallel_size": 2},
         "expert_model_parallel_size=2 needs a model with experts; set num_experts or use 1$"),
        (MOE.model_copy(update={"swiglu": True}), {}, "does not implement swiglu; use a GeLU MLP$"),
    ]
    for model, plan, message in cases:
        # the expert layouts are refused by Job itself too (below); the loop checks again for jobs built unchecked
        unchecked = _job(NO_DROPOUT)
        unchecked = Job.model_construct(model=model, cluster=unchecked.cluster,
                                        plan=unchecked.plan.model_copy(update=plan))
        with pytest.raises(ConfigError, match=message):
            check_supported(unchecked)
    for model, plan, message in cases[2:5]:
        with pytest.raises(ConfigError, match=message.rstrip("$")):
            build(Job, {"model": model, "cluster": load_cluster("dgx-a100-80gb"),
                        "plan": {"precision": "fp32", "global_batch_size": 4, **plan}}, "job")
    check_supported(LAYOUTS["moe-ep2-tp2"][1])


def test_the_loop_refuses_attention_dropout_with_fused_attention_and_cp_other_than_the_ring():
    from calibration.reference.launch import check_supported
    from simulator.spec.errors import ConfigError

    with pytest.raises(ConfigError, match=r"attention_dropout=0.1 with the fused 'auto' attention backend; "
                                          r"use a model with attention_dropout 0$"):
        check_supported(_job(DROPOUT, context_parallel_size=2, attention_backend="auto"))
    with pytest.raises(ConfigError, match="or --attention-backend unfused$"):
        check_supported(_job(DROPOUT, attention_backend="flash"))
    with pytest.raises(ConfigError, match="cp_comm_type 'a2a'; use the p2p ring"):
        check_supported(_job(NO_DROPOUT, context_parallel_size=2, attention_backend="auto", cp_comm_type="a2a"))
    check_supported(_job(HIDDEN_DROPOUT, context_parallel_size=2, attention_backend="auto"))


def test_a_pipelined_run_records_the_overlapped_transfers_it_ran(runs):
    """The loop's sends are non-blocking and each next receive is posted before the step's compute: Megatron's
    --overlap-p2p-communication, which the record says even when the job did not ask for it, so that a
    validation plays the transfers as they ran; every other field of the plan is the job's."""
    asked = LAYOUTS["pp2"][1].plan
    assert not asked.overlap_p2p_comm
    recorded = runs["pp2"][0].plan
    assert recorded.overlap_p2p_comm
    assert recorded.model_copy(update={"overlap_p2p_comm": False}) == asked
    assert runs["single"][0].plan == LAYOUTS["single"][1].plan  # no pipeline: nothing to say
