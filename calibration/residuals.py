"""Where the model still misses the measured A100 sets, in the units a mechanism would be stated in.

    python -m calibration.residuals [--out calibration/published/residuals.json]

A mean error says how wrong the model is; a mechanism is found by asking what the missing time
scales with. This prints, from the published A100 profile and the development sets alone:

- vTrain single-node: the signed error by tensor-parallel size and micro-batch, and for TP 8 (all
  of it one pipeline stage, no data parallelism) the missing time per tensor-parallel all-reduce by
  hidden size and micro-batch: (measured - predicted) / (layers x micro-batches x 6), the 6 being
  Megatron's all-reduces of one layer without sequence parallelism under full recompute (the two
  RowParallelLinear outputs in the forward and again in its recompute, the two ColumnParallelLinear
  input gradients in the backward). A constant per all-reduce points at the collective in the
  loop; one that follows the micro-batch points at compute. And the error by the number of
  attention score matrices a rank holds (micro-batch x heads / TP), the batch count of the attention
  core's batched GEMMs and softmax, which the measured times do not follow smoothly.
- vTrain single-node, split by its sweep: the set times each plan at 12, 16, 20 and 24 layers and at
  several global batches (micro-batches per iteration m), so the single-stage runs of one hidden
  size, TP, DP and micro-batch size fit t = a0 + a1 m + b0 L + b1 L m by least squares, measured and
  predicted alike: b1 is one layer's forward, recompute and backward for one micro-batch; a1 what a
  micro-batch costs outside the layers (embedding, output layer, loss, its data); b0 what a layer
  costs once per iteration (its gradients' data-parallel reduction and its optimizer step); a0 the
  rest of the iteration. A miss in one term and not the others says which part of the model to
  look at. Beside b1, the model's floor for it: the layer's compute-stream ops one after another,
  tensor-core ops at the GEMM block's ceiling, the rest as modelled. A measured b1 below the floor
  cannot be met by faster GEMMs alone.
- vTrain multi-node: the missing time per iteration of the single-stage runs, by hidden size and TP
  (and so by how many data-parallel groups share a node's NICs, 8 / TP), which is constant across
  micro-batch sizes if it is a per-iteration cost.
- What-ifs the sets suggest but no source supports, each with every set's error under it, so that
  a change made later for a measured reason can be compared with what the sets alone would have
  asked for. Nothing here changes the model.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

from calibration.fit_host_overhead import _a100_sets
from simulator.measure.datasets import VTRAIN_MULTI_NODE, VTRAIN_SINGLE_NODE, DataSet

HERE = Path(__file__).resolve().parent
OUT = HERE / "published" / "residuals.json"
ALL_REDUCES_PER_LAYER = 6  # no SP, full recompute: 2 forward + 2 recomputed forward + 2 backward


def _rows(data: DataSet, profile=None, plan_update: dict | None = None) -> list[tuple]:
    """(run, predicted_s) for every run, the plan changed by ``plan_update`` where given."""
    from simulator.estimator.prediction import estimate

    out = []
    for run in data.runs():
        job = run.job
        assert profile is None or job.cluster.gpu.name == profile.gpu, (run.label, profile.gpu)
        if plan_update:
            job = job.model_copy(update={"plan": job.plan.model_copy(update=plan_update)})
        out.append((run, estimate(job, profile).iteration_time_s))
    return out


def _micro_batches(job) -> int:
    p = job.plan
    return p.global_batch_size // (p.data_parallel_size * p.micro_batch_size)


def _by_numbers(items) -> list:
    """Dict items ordered by the numbers in their keys ("tp2 mbs8" before "tp16 mbs1")."""
    return sorted(items, key=lambda kv: [int(n) for n in re.findall(r"\d+", kv[0])])


def _errors(rows: list[tuple]) -> dict:
    """A set's mean absolute error and signed bias (predicted / measured - 1) from its (run, predicted_s) rows."""
    errors = [predicted / run.measured_s - 1 for run, predicted in rows]
    return {"mean_abs_error": statistics.fmean(map(abs, errors)), "bias": statistics.fmean(errors)}


def _stats(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "runs": len(values)}


def single_node(rows: list[tuple]) -> dict:
    by_tp_mbs, by_batches, tp8 = defaultdict(list), defaultdict(list), defaultdict(list)
    for run, predicted in rows:
        p, m = run.job.plan, run.job.model
        by_tp_mbs[f"tp{p.tensor_parallel_size} mbs{p.micro_batch_size}"].append(predicted / run.measured_s - 1)
        batches = p.micro_batch_size * m.num_attention_heads // p.tensor_parallel_size
        by_batches[f"h{m.hidden_size} tp{p.tensor_parallel_size} batches{batches}"].append(
            predicted / run.measured_s - 1)
        if p.tensor_parallel_size == 8 and p.pipeline_parallel_size == 1:
            calls = run.job.model.num_layers * _micro_batches(run.job) * ALL_REDUCES_PER_LAYER
            key = f"h{run.job.model.hidden_size} mbs{p.micro_batch_size}"
            tp8[key].append((run.measured_s - predicted) / calls * 1e6)
    return {"signed_error_by_tp_and_micro_batch": {k: _stats(v) for k, v in _by_numbers(by_tp_mbs.items())},
            "signed_error_by_attention_batches": {k: _stats(v) for k, v in _by_numbers(by_batches.items())},
            "tp8_missing_us_per_all_reduce": {k: _stats(v) for k, v in _by_numbers(tp8.items())}}


# the terms of the layer sweep's fit t = a0 + a1 m + b0 L + b1 L m, in the order of its design matrix's columns
SWEEP_TERMS = ("per_iteration_ms", "outside_layers_per_micro_batch_ms", "per_layer_per_iteration_ms",
               "per_layer_per_micro_batch_ms")


def layer_sweep(rows: list[tuple]) -> dict:
    """The single-stage runs split into the four terms of t = a0 + a1 m + b0 L + b1 L m (module docstring),
    fitted by least squares to the measured and to the predicted times of each (hidden size, TP, DP,
    micro-batch) whose runs vary both the layers L and the micro-batches m; by hidden size, TP and
    micro-batch, the mean over DP of each term (ms), the predicted term's signed error, and the term's
    share of the measured time of the runs it was fitted to (its coefficient times 1, m, L or L m)."""
    groups = defaultdict(list)
    for run, predicted in rows:
        p, m = run.job.plan, run.job.model
        if p.pipeline_parallel_size == 1:
            groups[(m.hidden_size, p.tensor_parallel_size, p.micro_batch_size, p.data_parallel_size)].append(
                (m.num_layers, _micro_batches(run.job), run.measured_s, predicted))
    terms = defaultdict(list)
    for (h, tp, mbs, _), points in groups.items():
        layers, micro = (np.array([pt[i] for pt in points], dtype=float) for i in (0, 1))
        if len(set(layers)) < 2 or len(set(micro)) < 2:
            continue  # a sweep of one dimension cannot tell the per-layer from the per-micro-batch terms
        design = np.stack([np.ones_like(layers), micro, layers, layers * micro], axis=1)
        times = np.array([pt[2] for pt in points])
        measured, predicted = (np.linalg.lstsq(design, np.array([pt[i] for pt in points]), rcond=None)[0] * 1e3
                               for i in (2, 3))
        share = (design * measured / 1e3 / times[:, None]).mean(axis=0)
        terms[(h, tp, mbs)].append((measured, predicted, share))
    out = {}
    for (h, tp, mbs), fits in sorted(terms.items()):
        measured, predicted, share = (np.mean([f[i] for f in fits], axis=0) for i in (0, 1, 2))
        out[f"h{h} tp{tp} mbs{mbs}"] = {
            "hidden_size": h, "tensor_parallel_size": tp, "micro_batch_size": mbs, "dp_groups": len(fits),
            **{name: {"measured": float(mv), "predicted": float(pv), "share_of_measured": float(sv),
                      "signed_error": float(pv / mv - 1) if mv > 0 else None}
               for name, mv, pv, sv in zip(SWEEP_TERMS, measured, predicted, share)}}
    return out


def compute_floors(rows: list[tuple], sweep: dict) -> dict:
    """For each (hidden size, TP, micro-batch) of the layer sweep, the least time the model could give one layer's
    forward, recompute and backward for one micro-batch: the compute stream's ops one after another (it runs one
    kernel at a time), every tensor-core op at the GEMM block's ceiling (MAMF's best shape, which no shape beats)
    and every other op as modelled; collectives and the host left out. A measured per-layer term below it says
    that the runs replayed less than the model does or that their memory-bound kernels ran faster than modelled,
    whatever the GEMMs did."""
    from simulator.cost import TENSOR_CORE_KINDS
    from simulator.graph.layers import LayerKey, OpKind, layer_graph, ordered_ops
    from simulator.schedule.timing import cost_model_for

    jobs = {}
    for run, _ in rows:
        p, m = run.job.plan, run.job.model
        jobs.setdefault(f"h{m.hidden_size} tp{p.tensor_parallel_size} mbs{p.micro_batch_size}", run.job)
    out = {}
    for key, terms in sweep.items():
        job = jobs[key]
        cost = cost_model_for(job, None)
        ceiling = cost.peak_flops * cost.profile.gemm.ceiling_efficiency
        layer = layer_graph(job.model, LayerKey.of(job.plan))
        floor_s = sum(op.flops / ceiling if op.kind in TENSOR_CORE_KINDS else cost.step_op_time_s(op)
                      for graph in (layer.forward, layer.recompute, layer.backward) for op in ordered_ops(graph)
                      if op.kind is not OpKind.collective)
        measured = terms["per_layer_per_micro_batch_ms"]["measured"]
        out[key] = {"compute_floor_ms": floor_s * 1e3, "measured_ms": measured,
                    "predicted_ms": terms["per_layer_per_micro_batch_ms"]["predicted"],
                    "measured_below_floor": bool(measured < floor_s * 1e3)}
    return out


def multi_node(rows: list[tuple]) -> dict:
    missing = defaultdict(list)
    for run, predicted in rows:
        p = run.job.plan
        if p.pipeline_parallel_size == 1:
            key = f"h{run.job.model.hidden_size} tp{p.tensor_parallel_size} dp{p.data_parallel_size}"
            missing[key].append(run.measured_s - predicted)
    return {"missing_s_per_iteration_single_stage": {k: _stats(v) for k, v in _by_numbers(missing.items())}}


WHAT_IFS = {
    # Megatron's default under fp16 reduces gradients in the model's 2-byte dtype, and DeepSpeed's
    # communication dtype defaults to fp16 as well; nothing in the sets' READMEs says otherwise.
    "gradients reduced in fp32": {"plan": {"accumulate_allreduce_grads_in_fp32": True}},
    # The A100 profile holds the clock He (2024) measured at the power limit; MAMF's bursts are the range's
    # other end. The host block stays as fitted with the sustained clock.
    "tensor cores at the benchmarks' bursts (sustained_clock_fraction at its fast end)": {
        "profile_at": ("sustained_clock_fraction", "high")},
    # The in-node collectives of 2-8 GPUs read from the measured tables (vtrain-nccl-a100), or from the
    # link model fitted to the one published 8-GPU sweep ([stas-net]), scaled to other ring sizes.
    "collectives inside a node from the 8-GPU link model, not the measured 2-8 GPU tables": {
        "profile_change": "link_model_only"},
    # Hopper's GEMM block gives each GEMM the fastest of CUTLASS's tiles, with shape terms fitted to XLA's
    # H100 table; the A100's keeps one 256x128 tile in strict waves. Here the H100 form is carried to the
    # A100 (k_half scaled by the machine's balance), the host block as fitted without it.
    "A100 GEMMs choosing among CUTLASS's tiles as Hopper's do (the XLA H100 fit carried)": {
        "profile_change": "tile_choice"},
    # The optimizer step's multi-tensor kernels (norm, unscale, Adam, the copy to the model's weights) stream flat
    # buffers once each, as a memcopy does, where the profile costs them at the fraction fitted to all its kernels,
    # row reductions included; the single-node set's layer sweep puts a layer's once-per-iteration time below the
    # model's at every TP, DP 1 (no gradient reduction) included.
    "the optimizer step's kernels at the memcopy's fraction of HBM bandwidth": {
        "profile_change": "optimizer_streaming"},
    # Sinha et al. (SC22) on V100 and MI60 clusters; no A100 spread is measured.
    "the job paced by its slowest device (device_speed_spread at its range's high end)": {
        "profile_at": ("device_speed_spread", "high")},
}
A100 = "A100-SXM4-80GB"  # every run of the measured A100 sets


def what_ifs(sets: list[DataSet]) -> dict:
    from simulator.cost.profile import default_profile

    out = {}
    for name, change in WHAT_IFS.items():
        profile = None
        if "profile_at" in change:
            profile = default_profile(A100)
            path, end = change["profile_at"]
            low, high = next((lo, hi) for p, _, lo, hi in profile.unpinned() if p == path)
            profile = profile.with_value(path, low if end == "low" else high)
        if change.get("profile_change") == "link_model_only":
            profile = default_profile(A100)
            nvlink = profile.collectives.nvlink.model_copy(update={"all_reduce_curves": None})
            profile = profile.model_copy(update={"collectives": profile.collectives.model_copy(
                update={"nvlink": nvlink})})
        if change.get("profile_change") == "tile_choice":
            from calibration.build_published_profiles import gemm_block

            profile = default_profile(A100).model_copy(update={"gemm": gemm_block(A100, tile_choice=True)})
        if change.get("profile_change") == "optimizer_streaming":
            profile = default_profile(A100)
            el = profile.elementwise
            profile = profile.model_copy(update={"elementwise": el.model_copy(update={
                "kernel_fractions": {**el.kernel_fractions, "optimizer": el.fraction("copy")}})})
        out[name] = {data.key: _errors(_rows(data, profile, change.get("plan"))) for data in sets}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    sets = _a100_sets()
    rows = {data.key: _rows(data) for data in sets}  # each set predicted once, for every table below
    sweep = layer_sweep(rows[VTRAIN_SINGLE_NODE.key])
    result = {
        "command": "python -m calibration.residuals",
        "sets": {key: _errors(r) for key, r in rows.items()},
        "vtrain-single-node": {**single_node(rows[VTRAIN_SINGLE_NODE.key]), "layer_sweep": sweep,
                               "layer_compute_floor": compute_floors(rows[VTRAIN_SINGLE_NODE.key], sweep)},
        "vtrain-multi-node-dev": multi_node(rows[VTRAIN_MULTI_NODE.key]),
        "what_if": what_ifs(sets),
    }
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"{args.out}")
    for key, e in result["sets"].items():
        print(f"  {key}: mean abs error {e['mean_abs_error']:.1%}, bias {e['bias']:+.1%}")
    print("vTrain single-node, signed error by TP and micro-batch:")
    for key, s in result["vtrain-single-node"]["signed_error_by_tp_and_micro_batch"].items():
        print(f"  {key:12s} {s['mean']:+.1%} ({s['runs']} runs)")
    print("vTrain single-node, signed error by hidden size, TP and attention score matrices per rank "
          "(micro-batch x heads / TP):")
    for key, s in result["vtrain-single-node"]["signed_error_by_attention_batches"].items():
        print(f"  {key:24s} {s['mean']:+.1%} ({s['runs']} runs)")
    print("vTrain single-node TP 8, missing time per tensor-parallel all-reduce (us):")
    for key, s in result["vtrain-single-node"]["tp8_missing_us_per_all_reduce"].items():
        print(f"  {key:12s} {s['mean']:6.0f} (range {s['min']:.0f} to {s['max']:.0f}, {s['runs']} runs)")
    print("vTrain single-node, single-stage runs split by the layer sweep (ms, measured / predicted): one layer per "
          "micro-batch | outside the layers per micro-batch | one layer per iteration:")
    for key, t in result["vtrain-single-node"]["layer_sweep"].items():
        print(f"  {key:18s}" + " | ".join(
            f"{t[name]['measured']:6.2f} / {t[name]['predicted']:6.2f}"
            for name in ("per_layer_per_micro_batch_ms", "outside_layers_per_micro_batch_ms",
                         "per_layer_per_iteration_ms")))
    print("vTrain single-node, one layer per micro-batch (ms): measured against the model's compute floor (tensor-core "
          "ops at the ceiling, the rest as modelled); where the measurement lies below it:")
    for key, f in result["vtrain-single-node"]["layer_compute_floor"].items():
        if f["measured_below_floor"]:
            print(f"  {key:18s} measured {f['measured_ms']:6.2f} < floor {f['compute_floor_ms']:6.2f} "
                  f"(predicted {f['predicted_ms']:6.2f})")
    print("vTrain multi-node, single-stage runs, missing time per iteration (s):")
    for key, s in result["vtrain-multi-node-dev"]["missing_s_per_iteration_single_stage"].items():
        print(f"  {key:20s} {s['mean']:+.2f} (range {s['min']:+.2f} to {s['max']:+.2f}, {s['runs']} runs)")
    for name, per_set in result["what_if"].items():
        print(f"what if {name} (not applied):")
        for key, e in per_set.items():
            print(f"  {key}: mean abs error {e['mean_abs_error']:.1%}, bias {e['bias']:+.1%}")


if __name__ == "__main__":
    main()
