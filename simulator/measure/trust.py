"""The report's trust section: every measured data set's errors side by side with its role, and the
band of the published checks and of the headline.
"""

from __future__ import annotations

import json
from importlib import resources

from simulator.estimator.band import band
from simulator.estimator.prediction import estimate
from simulator.estimator.regime import OUTSIDE_WIDENING, band_table
from simulator.measure.datasets import REGISTRY, Role, SetErrors, evaluate

ROLE_TEXT = {
    Role.checked: "checked while building (nothing fitted)",
    Role.fitted: "fitted (in-sample for the constants named)",
    Role.held_out: "held out (never used while building)",
}


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def registry_section(headline_job=None, headline_days: float | None = None) -> tuple[list[str], dict]:
    """Markdown lines and data: one row per data set, its subsets, the Table 5 band and the headline's."""
    from simulator.measure import korthikanti as k

    lines = ["## 7. How far to trust it: every measured data set, in-sample and not", "",
             "Each data set in the repository is declared once (`simulator/measure/datasets.py`) with its source and its "
             "role. Errors are (predicted - measured) / measured with the published profile (the CPU runs with the "
             "profile measured beside them); a set the profile was fitted to measures the fit, not the model's "
             "reach, so read the roles before the numbers.", ""]
    rows, data = [], {}
    results: dict[str, SetErrors] = {}
    for ds in REGISTRY:
        e = evaluate(ds)
        if not e.rows:  # a set whose measurements this checkout does not hold
            continue
        results[ds.key] = e
        worst = "; ".join(f"{r.label} {_pct(r.error)}" for r in e.worst(2))
        rows.append(f"| {ds.title} | {ROLE_TEXT[ds.role]}{': ' + ', '.join(ds.fitted) if ds.fitted else ''} | "
                    f"{len(e.rows):,} | {e.mean_abs_error * 100:.1f}% | {_pct(e.bias)} | {worst} |")
        data[ds.key] = {"role": ds.role.value, "fitted": list(ds.fitted), "runs": len(e.rows),
                        "mean_abs_error": e.mean_abs_error, "bias": e.bias,
                        "subsets": {t: {str(v): list(x) for v, x in by.items()} for t, by in e.subsets.items()}}
    lines += ["| data set | role | runs | mean abs. error | signed bias | worst rows |", "|---|---|---|---|---|---|", *rows]
    for ds in (ds for ds in REGISTRY if ds.key in results):
        e = results[ds.key]
        for tag, by in e.subsets.items():
            cells = ", ".join(f"{tag} {v}: {_pct(bias)} ({n})" for v, (_, bias, n) in by.items())
            lines += ["", f"{ds.key}, signed bias by {tag} (runs): {cells}"]
    lines += _host_fit_left_out(data)
    lines += _from_runs_protocol(data)
    lines += _layer_sweep(data)
    lines += _what_ifs(data)
    table = band_table()
    lines += ["", "Measured runs kept outside the repository judge the model on data it never saw; they are not "
              "reproduced here.", "", "### The band: how wrong the model has been, and whether that holds on a set it did "
              "not see", "",
              "The band on every answer is the wider, on each side, of two things: the model's error on the measured "
              "runs of the plan's regime, and the unpinned profile constants at the ends of their declared ranges "
              "(`simulator/estimator/band.py`). The first is fitted by `" + table["command"] + "`: per GPU kind, the "
              "largest over its measured sets of each set's split-conformal 90% quantile of |measured / predicted - 1| "
              "(the ceil((n + 1) 0.9)-th smallest of its n runs), each set a calibration split of its own. A plan outside what the measured runs covered (a sharding, schedule, "
              "precision, context or expert parallelism none of them had, another GPU, more GPUs than the largest "
              f"measured run) gets the widest half-width times {OUTSIDE_WIDENING:g} on its fast side, and on its slow "
              f"side plus {OUTSIDE_WIDENING - 1:g}x the widest half-width for every step further out (each "
              "feature no run had is a step, and so is each doubling of the GPUs past the largest run); a plan whose "
              "MFU is above the best measured has its slow end scaled by its MFU over that best. The reasons are "
              "printed with it. Each set's coverage of the model-error part alone, fitted with and without the "
              "set, and the share of its runs measured faster than the fast end and slower than the slow end "
              "(the full band, with the constants' spread, is at least as wide):", "",
              "| data set | GPU | half-width, all sets | coverage (faster / slower than the band) | "
              "half-width, set left out | coverage left out (faster / slower) |",
              "|---|---|---|---|---|---|"]
    for row in table["leave_one_set_out"]:
        lines.append(f"| {row['set']} | {row['gpu']} | {row['half_width_in']:.1%} | {row['coverage_in']:.0%} "
                     f"({row['below_fast_end_in']:.0%} / {row['above_slow_end_in']:.0%}) | "
                     f"{row['half_width_left_out']:.1%} ({row['from']}) | {row['coverage_left_out']:.0%} "
                     f"({row['below_fast_end_left_out']:.0%} / {row['above_slow_end_left_out']:.0%}) |")
    sides = [f"{key} {s['fast_side']:.1%} faster / {s['slow_side']:.1%} slower"
             for g in table["gpus"].values() for key, s in sorted(g["sets"].items())]
    lines += ["", "Where each set's errors lie (each side's split-conformal 90% quantile of measured / predicted - 1): "
              + "; ".join(sides) + ". The sets disagree on the side (the single-node set errs both ways, the "
              "multi-node set mostly slow), so a band built per side from them would fail the single-node set "
              "when it is left out; the half-width stays the quantile of both sides together."]
    data["band_coverage"] = table["leave_one_set_out"]
    lines += ["", "On Table 5's rows and the headline:", "",
              "| configuration | published (s) | predicted (s) | band (s) | inside |", "|---|---|---|---|---|"]
    bands = []
    for row in k.table5_rows():
        job = k.table5_job(row)
        label = f"{job.model.name} {'SP + selective' if row['parallel']['sp'] else 'full recompute'}"
        published = row["measured"]["iteration_time_s"]
        est = estimate(job)
        pred = est.iteration_time_s
        b = band(job, None, pred, est.mfu)
        inside = b.iteration_time_s_low <= published <= b.iteration_time_s_high
        bands.append({"label": label, "published": published, "predicted": pred, "low": b.iteration_time_s_low,
                      "high": b.iteration_time_s_high, "inside": inside})
        lines.append(f"| {label} | {published:.2f} | {pred:.2f} | {b.iteration_time_s_low:.2f}-"
                     f"{b.iteration_time_s_high:.2f} | {'yes' if inside else 'no'} |")
    data["table5_band"] = bands
    if headline_job is not None and headline_days is not None:
        headline = estimate(headline_job)
        t = headline.iteration_time_s
        hb = band(headline_job, None, t, headline.mfu)
        low, high = headline_days * hb.iteration_time_s_low / t, headline_days * hb.iteration_time_s_high / t
        where = (f"in the regime {hb.regime.name}" if hb.regime.name is not None
                 else "outside every measured regime (" + "; ".join(hb.regime.outside) + ")")
        lines += ["", f"The headline's {headline_days:.1f} days (section 1) have the band {low:.1f}-{high:.1f} days, "
                  f"{where}; the constants that move it most: "
                  + ", ".join(f"`{d.constant}` ({_pct(d.change_at_low)} .. {_pct(d.change_at_high)})"
                              for d in hb.drivers[:3]) + "."]
        data["headline_band_days"] = [low, high]
    return lines + [""], data


def _host_fit_left_out(data: dict) -> list[str]:
    """The host constants' leave-one-set-out table: each A100 set judged with the constants fitted to the others."""
    path = resources.files("calibration") / "published" / "host_overhead_loso.json"
    if not path.is_file():
        return []
    table = json.loads(path.read_text(encoding="utf-8"))
    lines = ["", "The profile's `host` constants are the only ones fitted to end-to-end runs. Fitted to every A100 set "
             f"but one, each set weighing the same (`{table['command']}`), and judged on the one left out, against no "
             "host block at all. Each constant has a prior (eager PyTorch's 5-25 us an op or collective call, no host "
             "work beyond the ops) it leaves only where a set's errors say so, so sets bound by the GPU leave the "
             "constants near it:", "",
             "| set left out | fitted on | mean abs. error without | with | bias without | with |", "|---|---|---|---|---|---|"]
    for row in table["rows"]:
        w, wo = row["with"], row["without"]
        lines.append(f"| {row['left_out']} | {', '.join(row['fitted_on'])} | {wo['mean_abs_error']:.1%} | "
                     f"{w['mean_abs_error']:.1%} | {_pct(wo['bias'])} | {_pct(w['bias'])} |")
    # worse as the table shows it: a change below its last digit is no change to the reader
    worse = [row for row in table["rows"]
             if f"{row['with']['mean_abs_error']:.1%}" != f"{row['without']['mean_abs_error']:.1%}"
             and row["with"]["mean_abs_error"] > row["without"]["mean_abs_error"]]
    if worse:
        lines += ["", "Fitted to the other sets, the host block makes " + ", ".join(
            f"{row['left_out']} worse ({row['without']['mean_abs_error']:.1%} -> {row['with']['mean_abs_error']:.1%})"
            for row in worse) + ": those sets, bound by the GPU rather than the host, do not pin what it measures, and "
            "their optimism is not host time. The published constants are fitted to all of them together, each "
            "weighing the same (`python -m calibration.fit_host_overhead`); the rows above show how far that fit "
            "carries to a set it did not see."]
    data["host_fit_left_out"] = table["rows"]
    return lines


def _from_runs_protocol(data: dict) -> list[str]:
    """``calibrate --from-runs`` on three runs of a set, judged on the rest (the committed protocol table)."""
    path = resources.files("calibration") / "published" / "from_runs_protocol.json"
    if not path.is_file():
        return []
    table = json.loads(path.read_text(encoding="utf-8"))
    lines = ["", "A user's own runs: `simulator calibrate --from-runs` fitted to three runs of a set, picked by a rule "
             "fixed before any error was seen (the smallest, median and largest GPU counts), and judged on the rest "
             f"of the set against the uncalibrated profile (`{table['command']}`). The band is the calibrated "
             "profile's, on an evenly spaced sample of the runs left; where the three runs had other regime features "
             "or TP sizes, a run keeps the regime's band:", "",
             "| set | fitted to | judged on | mean abs. error uncalibrated | calibrated | bias uncalibrated | "
             "calibrated | band coverage / width where it applies | over all |", "|---|---|---|---|---|---|---|---|---|"]

    def cell(b: dict) -> str:
        return "-" if not b["runs"] else f"{b['coverage']:.0%} / {b['median_width']:.0%} ({b['runs']})"

    for row in table["rows"]:
        u, c = row["uncalibrated"], row["calibrated"]
        lines.append(f"| {row['set']} | {'; '.join(row['chosen'])} | {row['judged_on']} | {u['mean_abs_error']:.1%} | "
                     f"{c['mean_abs_error']:.1%} | {_pct(u['bias'])} | {_pct(c['bias'])} | "
                     f"{cell(row['band_where_it_applies'])} | {cell(row['band_all'])} |")
    kept = [row["set"] for row in table["rows"] if row.get("kept_profile")]
    if kept:
        lines += ["", "On " + ", ".join(kept) + " the constants fitted to two of the three runs predicted the third no "
                  "better than the profile as it is, so `calibrate --from-runs` kept the profile's constants (the "
                  "same rule a user's fit follows) and the band is the profile's own errors on the three runs: the "
                  "model's remaining error depends on the layout (the bias by TP above), which the constants a fit "
                  "can move shift for every layout alike."]
    worse = [row["set"] for row in table["rows"]
             if row["calibrated"]["mean_abs_error"] > row["uncalibrated"]["mean_abs_error"]]
    if worse:
        lines += ["", "Fitted to three runs, the profile predicts the rest of " + ", ".join(worse) + " worse than "
                  "the uncalibrated one: the model's remaining error depends on the layout (section 7's bias by TP), "
                  "and the constants three runs can move shift every layout alike, so a run of a badly predicted "
                  "layout among the three pulls the others off. Runs like the plan to be made carry further."]
    data["from_runs_protocol"] = table["rows"]
    return lines


def _residuals() -> dict:
    """The committed ``python -m calibration.residuals`` table, empty where this checkout does not hold it."""
    path = resources.files("calibration") / "published" / "residuals.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _layer_sweep(data: dict) -> list[str]:
    """Which part of an iteration the single-node set's error sits in: its single-stage runs split by their sweep of
    layers and micro-batches (``python -m calibration.residuals``), the predicted term's mean signed error by TP."""
    sweep = _residuals().get("vtrain-single-node", {}).get("layer_sweep")
    if not sweep:
        return []
    terms = (("per_layer_per_micro_batch_ms", "one layer, per micro-batch"),
             ("outside_layers_per_micro_batch_ms", "outside the layers, per micro-batch"),
             ("per_layer_per_iteration_ms", "one layer, per iteration"))
    by_tp: dict[int, dict[str, list[tuple[float, float]]]] = {}
    for t in sweep.values():
        tp = t["tensor_parallel_size"]
        for name, _ in terms:
            if t[name]["signed_error"] is not None:
                by_tp.setdefault(tp, {}).setdefault(name, []).append(
                    (t[name]["signed_error"], t[name]["share_of_measured"]))
    lines = ["", "Where in an iteration the single-node set's error sits: its single-stage runs time each plan at "
             "12-24 layers and at several global batches, so measured and predicted times alike split into one layer's "
             "forward, recompute and backward per micro-batch, what a micro-batch costs outside the layers (embedding, "
             "output layer, loss), and what a layer costs once per iteration (its gradients' reduction and optimizer "
             "step). The predicted term's mean signed error over hidden sizes and micro-batch sizes, and in "
             "brackets the term's mean share of the measured time (`python -m calibration.residuals`, which prints "
             "each term in ms):", "",
             "| TP | " + " | ".join(label for _, label in terms) + " |", "|---|" + "---|" * len(terms)]
    for tp in sorted(by_tp):
        cells = []
        for name, _ in terms:
            v = by_tp[tp].get(name)
            cells.append(f"{_pct(sum(e for e, _ in v) / len(v))} ({sum(s for _, s in v) / len(v):.0%})" if v else "-")
        lines.append(f"| {tp} | " + " | ".join(cells) + " |")
    data["layer_sweep"] = sweep
    floors = _residuals().get("vtrain-single-node", {}).get("layer_compute_floor", {})
    if floors:
        data["layer_compute_floor"] = floors
    below = {key: f for key, f in floors.items() if f["measured_below_floor"]}
    if below:
        lines += ["", "Where the measured per-layer term lies below the model's own floor for it (the layer's compute "
                  "kernels one after another, every tensor-core op at the GEMM block's ceiling, the rest as modelled), "
                  "faster GEMMs alone cannot close the gap: those runs replayed less than the model does, or their "
                  "memory-bound kernels ran faster than modelled. " + "; ".join(
                      f"{key}: measured {f['measured_ms']:.2f} ms, floor {f['compute_floor_ms']:.2f} ms, predicted "
                      f"{f['predicted_ms']:.2f} ms" for key, f in below.items()) + "."]
    return lines


def _what_ifs(data: dict) -> list[str]:
    """What the measured A100 sets would say were a declared constant at an end of its range, or another
    setting no source supports (``python -m calibration.residuals``): nothing here is applied."""
    table = _residuals()
    cases = table.get("what_if", {})
    if not cases:
        return []
    keys = list(table["sets"])
    lines = ["", "Not applied: each measured A100 set's mean absolute error (signed bias) were one of these so, the "
             f"host block as fitted (`{table['command']}`), beside the model as it is. A row that helps one set and "
             "hurts another names no mechanism: each waits for a measurement, or a configuration of the measured "
             "runs, that settles it.", "",
             "| what if | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for name, per_set in {"the model as it is": table["sets"], **cases}.items():
        lines.append(f"| {name} | " + " | ".join(
            f"{per_set[k]['mean_abs_error']:.1%} ({_pct(per_set[k]['bias'])})" for k in keys) + " |")
    data["what_if"] = cases
    return lines
