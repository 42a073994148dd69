"""The Perfetto trace: whole nanoseconds, slices that nest and never cross, TP communication on every
micro-batch, a flow from each send to its receive, a memory counter per stage, args on every slice,
and every idle moment of a compute stream named."""

from __future__ import annotations

import json
from collections import defaultdict
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cli.options import job_from_options
from simulator.estimator.memory import memory_plan
from simulator.estimator.prediction import simulate_job
from simulator.outputs.trace import THREADS, _StepParts, trace_document, write_trace
from simulator.spec.units import GIB

# TP + SP, interleaved pipeline, DP, Megatron's blocking sends: every kind of slice at once.
INTERLEAVED = dict(model="gpt3-1.3b", gpus=16, tensor_parallel_size=2, pipeline_parallel_size=4,
                   virtual_pipeline_stages=2, sequence_parallel=True, recompute_granularity="selective",
                   global_batch_size=16, overlap_p2p_comm=False)


def _trace(tmp_path, model_overrides=None, **options):
    job = job_from_options(model_overrides, **options)
    sim = simulate_job(job, record=True)
    path = tmp_path / "trace.json"
    write_trace(sim, job, path)
    # Decimal keeps the file's digits, so "whole nanoseconds" is checked on the text itself
    return job, sim, json.loads(path.read_text(), parse_float=Decimal)


@pytest.fixture(scope="module")
def interleaved(tmp_path_factory):
    return _trace(tmp_path_factory.mktemp("trace"), **INTERLEAVED)


def _ns(x) -> int:
    value = Decimal(x) * 1000
    assert value == value.to_integral_value(), f"{x} us is not a whole number of nanoseconds"
    return int(value)


def _slices(doc):
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def crossings(doc) -> list[tuple[dict, dict]]:
    """Pairs of slices on one thread that overlap without one holding the other."""
    by_thread = defaultdict(list)
    for e in _slices(doc):
        by_thread[(e["pid"], e["tid"])].append((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), e))
    bad = []
    for events in by_thread.values():
        events.sort(key=lambda x: (x[0], -x[1]))
        stack: list[tuple[int, int, dict]] = []
        for start, end, e in events:
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack and end > stack[-1][1]:
                bad.append((stack[-1][2], e))
            stack.append((start, end, e))
    return bad


def test_timestamps_are_whole_nanoseconds_and_slices_never_cross(interleaved):
    _, _, doc = interleaved
    for e in doc["traceEvents"]:
        if "ts" in e:
            _ns(e["ts"])
        if "dur" in e:
            assert _ns(e["dur"]) >= 0
    assert crossings(doc) == []


@given(tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 4]), vpp=st.sampled_from([1, 2]),
       mbs=st.sampled_from([1, 2]), sp=st.booleans(), recompute=st.sampled_from(["none", "selective", "full"]),
       block=st.booleans(), overlap_p2p=st.booleans(), overlap_grad=st.booleans(), flash=st.booleans())
@settings(max_examples=12)
def test_no_plan_gives_crossing_slices(tmp_path_factory, tp, pp, vpp, mbs, sp, recompute, block, overlap_p2p,
                                       overlap_grad, flash):
    vpp = vpp if pp > 1 else 1
    options = dict(model="gpt3-350m", gpus=tp * pp * 2, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                   virtual_pipeline_stages=vpp, sequence_parallel=sp and tp > 1, micro_batch_size=mbs,
                   global_batch_size=mbs * 2 * pp * 2, recompute_granularity=recompute,
                   recompute_method="block" if block and recompute == "full" else "uniform",
                   overlap_p2p_comm=overlap_p2p, overlap_grad_reduce=overlap_grad, use_flash_attention=flash)
    job, sim, doc = _trace(tmp_path_factory.mktemp("plan"), **options)
    assert crossings(doc) == []
    _check_idle_is_named(doc, job)


def _check_idle_is_named(doc, job):
    """A stage's compute thread is tiled, from 0 to the end of its optimizer step, by its top-level slices."""
    for stage in range(job.plan.pipeline_parallel_size):
        top = []
        for e in sorted((e for e in _slices(doc) if e["pid"] == stage and e["tid"] == THREADS["compute"]
                         and e["cat"] not in ("op", "host")), key=lambda e: _ns(e["ts"])):
            top.append((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])))
        assert top[0][0] == 0
        for (_, a_end), (b_start, _) in zip(top, top[1:]):
            assert a_end == b_start, f"stage {stage} has an unnamed gap at {a_end} ns"
        end = max(e for _, e in top)
        optimizer = next(e for e in _slices(doc) if e["name"] == "optimizer" and e["pid"] == stage)
        assert end == _ns(optimizer["ts"]) + _ns(optimizer["dur"])


def test_idle_time_is_named(interleaved):
    job, _, doc = interleaved
    _check_idle_is_named(doc, job)
    names = {e["name"] for e in _slices(doc) if e["cat"] == "bubble"}
    assert {"pipeline bubble (fill)", "blocked on send", "waiting for transfer"} <= names


def test_tensor_parallel_communication_on_every_micro_batch(interleaved):
    job, _, doc = interleaved
    plan = job.plan
    comm = [e for e in _slices(doc) if e["tid"] == THREADS["tp_comm"]]
    per_step = defaultdict(int)
    for e in comm:
        per_step[(e["pid"], e["args"]["micro_batch"])] += 1
    assert {mb for _, mb in per_step} == set(range(plan.num_micro_batches))
    middle = [n for (stage, _), n in per_step.items() if 0 < stage < plan.pipeline_parallel_size - 1]
    assert middle and len(set(middle)) == 1  # every micro-batch of a middle stage has the same collectives
    # compute ops are expanded for micro-batch 0 only (the file stays small for long pipelines)
    ops = [e for e in _slices(doc) if e["cat"] == "op" and e["tid"] == THREADS["compute"]]
    assert ops and {e["args"]["micro_batch"] for e in ops} == {0}


def test_tensor_parallel_size_one_has_no_tensor_parallel_communication(tmp_path):
    _, _, doc = _trace(tmp_path, model="gpt3-350m", pipeline_parallel_size=2, global_batch_size=4)
    assert not [e for e in _slices(doc) if e["tid"] == THREADS["tp_comm"]]


def test_each_send_flows_to_the_step_that_receives_it(interleaved):
    job, _, doc = interleaved
    plan = job.plan
    flows = defaultdict(dict)
    for e in doc["traceEvents"]:
        if e["ph"] in "sf":
            flows[e["id"]][e["ph"]] = e
    p, v, m = plan.pipeline_parallel_size, plan.virtual_pipeline_stages, plan.num_micro_batches
    assert len(flows) == 2 * (p * v - 1) * m  # each micro-batch crosses p v - 1 boundaries each way
    sends = {(e["pid"], e["tid"], _ns(e["ts"])): e for e in _slices(doc) if e["cat"] == "p2p"}
    steps = {(e["pid"], _ns(e["ts"])): e for e in _slices(doc) if e["cat"] in ("forward", "backward")}
    for flow in flows.values():
        s, f = flow["s"], flow["f"]
        send = sends[(s["pid"], s["tid"], _ns(s["ts"]))]
        step = steps[(f["pid"], _ns(f["ts"]))]
        assert f["bp"] == "e" and f["tid"] == THREADS["compute"]
        assert send["args"]["to_stage"] == f["pid"]
        assert send["args"]["micro_batch"] == step["args"]["micro_batch"]
        assert _ns(step["ts"]) >= _ns(send["ts"]) + _ns(send["dur"])  # received after it arrived


def test_memory_counter_peaks_at_the_memory_plan(interleaved):
    job, _, doc = interleaved
    stages = memory_plan(job).stages
    for s in stages:
        values = [sum(e["args"].values()) for e in doc["traceEvents"] if e["ph"] == "C" and e["pid"] == s.stage]
        held = s.weights_bytes + s.gradients_bytes + s.optimizer_bytes + s.activations_bytes
        assert float(max(values)) * GIB == pytest.approx(held, rel=1e-12)
        assert float(values[-1]) * GIB == pytest.approx(s.weights_bytes + s.gradients_bytes + s.optimizer_bytes)


def test_every_slice_has_args(interleaved):
    _, _, doc = interleaved
    for e in _slices(doc):
        assert e["args"], e
        if e["cat"] in ("op", "forward", "backward", "p2p"):
            assert "micro_batch" in e["args"], e
        if e["cat"] in ("op", "forward", "backward"):
            assert e["args"]["flops"] >= 0
        if e["cat"] in ("op", "p2p", "dp", "optimizer"):
            assert e["args"]["bytes"] > 0 or e["args"].get("kind") in ("elementwise", "gemm", "flash_attention"), e
    gemms = [e for e in _slices(doc) if e["args"].get("kind") == "gemm"]
    assert gemms and all(e["args"]["flops"] > 0 and e["args"]["bytes"] > 0 for e in gemms)


def test_a_detailed_step_is_its_parts_and_the_wait_for_the_host(interleaved):
    job, sim, doc = interleaved
    parts = _StepParts(sim, job)
    host = {(e["pid"], e["args"]["micro_batch"]): _ns(e["dur"]) for e in _slices(doc) if e["cat"] == "host"}
    for iv in sim.engine.intervals:
        if iv.step is not None:
            device = sum(x.timeline.duration_s for x in parts(iv.stage, iv.step.chunk, iv.step.phase))
            step = iv.end_s - iv.start_s
            assert device <= step * (1 + 1e-9)  # the engine plays the layers' device time, and host time if any
            if iv.step.micro_batch == 0 and step - device > 1e-9:
                assert host[(iv.stage, 0)] > 0


def test_the_document_says_what_was_simulated(interleaved):
    job, sim, doc = interleaved
    other = doc["otherData"]
    assert other["seq_length"] == 2048 and other["precision"] == "bf16" and other["attention_backend"] == "auto"
    assert float(other["iteration_time_s"]) == sim.estimate.iteration_time_s
    assert {e["pid"] for e in doc["traceEvents"]} == set(range(job.plan.pipeline_parallel_size))


def test_a_simulation_without_intervals_is_refused():
    job = job_from_options(model="gpt3-350m")
    with pytest.raises(ValueError, match="record=True"):
        trace_document(simulate_job(job), job)


def test_the_crossing_check_sees_a_crossing():
    doc = {"traceEvents": [{"ph": "X", "pid": 0, "tid": 0, "ts": "1.000", "dur": "2.000"},
                           {"ph": "X", "pid": 0, "tid": 0, "ts": "2.000", "dur": "2.000"},
                           {"ph": "X", "pid": 0, "tid": 0, "ts": "1.500", "dur": "0.500"}]}
    assert len(crossings(doc)) == 1


@pytest.mark.parametrize("split", [dict(account_for_embedding_in_pipeline_split=True,
                                        account_for_loss_in_pipeline_split=True),
                                   dict(decoder_first_pipeline_num_layers=4, decoder_last_pipeline_num_layers=2)])
def test_every_layer_is_in_exactly_one_step_of_uneven_interleaved_stages(tmp_path, split):
    # 22 layers on 4 stages x 2 chunks: chunks of unequal size, so a chunk's first layer is the sum of the
    # chunks before it in model order, not its position times one chunk size
    job, _, doc = _trace(tmp_path, {"num_layers": 22}, model="gpt3-1.3b", gpus=4, pipeline_parallel_size=4,
                         virtual_pipeline_stages=2, global_batch_size=8, **split)
    assert len(set(map(sum, job.chunk_layers))) > 1  # the split really is uneven
    spans = {}
    for e in _slices(doc):
        args = e.get("args", {})
        if args.get("phase") == "forward" and args.get("micro_batch") == 0 and args.get("layers"):
            first, last = map(int, args["layers"].split("-"))
            spans[(e["pid"], args["chunk"])] = (first, last)
    assert len(spans) == 8
    layers = sorted(i for first, last in spans.values() for i in range(first, last + 1))
    assert layers == list(range(22))
    for (stage, chunk), (first, last) in spans.items():
        assert last - first + 1 == job.chunk_layers[stage][chunk]
