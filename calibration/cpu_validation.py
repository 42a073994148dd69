"""Close the calibrate -> run -> validate loop on this CPU, and say how far to trust it.

    python -m calibration.cpu_validation --out reports/cpu-validation

One command does everything: it calibrates the CPU twice in a row (`simulator calibrate --device
cpu` for the reference model's shapes), runs the reference loop on six plans (TP 1, TP 2, TP 2 +
SP with selective recompute, TP 2 with full recompute, PP 2, DP 2) three times each, in rounds of one
run per plan so that every plan samples the same drift of the machine (``--runs``; the run with the
median mean iteration is the measurement), validates each run against
the first profile and predicts it again with the second, and writes the two profiles, the run
records, ``summary.json`` and a README.md with the tables and the issue's targets (the two
profiles' predictions within 10% of each other, each plan's iteration time within 20% of the
measurement, each phase within 30%), each marked met or missed.

It sets no thread variables itself: the launcher runs every rank with one thread, records it and
``validate`` checks it against the profile's. Timings on a shared machine are noise, so the load
average is recorded before, between and after the steps, and the README says how quiet it was.

A virtual machine's speed also drifts with no load to show for it, so a fixed piece of work
(``calibration.microbench.probe``: one layer's forward kernels at the model's shapes, one thread) is
timed before and after every calibration and every run. Each plan's row then says how fast the
machine was around its run against around the calibration, and what the error would be at that
speed: a diagnostic that bounds slow drift (it cannot see a change inside a run), never a target met.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

MODEL = Path(__file__).resolve().parent / "reference" / "gpt-small-cpu.yaml"
PLANS = {
    "TP 1": dict(global_batch_size=4),
    "TP 2": dict(tensor_parallel_size=2, global_batch_size=4),
    "TP 2 + SP, selective": dict(tensor_parallel_size=2, sequence_parallel=True,
                                 recompute_granularity="selective", global_batch_size=4),
    "TP 2, full recompute": dict(tensor_parallel_size=2, recompute_granularity="full", global_batch_size=4),
    # the loop's pipeline sends are non-blocking and waited for at the end of the iteration
    "PP 2": dict(pipeline_parallel_size=2, global_batch_size=8, overlap_p2p_comm=True),
    "DP 2": dict(data_parallel_size=2, global_batch_size=8),
}
STABILITY, ITERATION, PHASE = 0.10, 0.20, 0.30  # the targets
QUIET_LOAD = 0.5  # 1-minute load average under which the machine counts as quiet before starting
# phases too short to judge: a relative error of a phase under 2% of the iteration says nothing
MIN_PHASE_SHARE = 0.02


def load_average() -> tuple[float, float, float] | None:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        return None


@dataclass
class PlanResult:
    label: str
    record: str
    validation: dict  # Validation.model_dump()
    repeat_prediction_s: float  # iteration time under the second profile
    iteration_times_s: list[float]
    load_average: tuple[float, float, float] | None
    run_means_s: list[float] = field(default_factory=list)  # every run's mean iteration, the validated one among them
    probe_s: float | None = None  # the speed probe around the validated run (mean of the probes before and after it)
    calibration_probe_s: float | None = None  # the same probe around the calibration of the validated profile

    @property
    def predicted_s(self) -> float:
        return self.validation["iteration_time_s"]["predicted"]

    @property
    def measured_s(self) -> float:
        return self.validation["iteration_time_s"]["measured"]

    @property
    def stability(self) -> float:
        return self.repeat_prediction_s / self.predicted_s - 1.0

    @property
    def machine_slowdown(self) -> float | None:
        """How much longer the probe took around the run than around the calibration (1.2: 20% slower)."""
        if not self.probe_s or not self.calibration_probe_s:
            return None
        return self.probe_s / self.calibration_probe_s

    @property
    def error_at_run_speed(self) -> float | None:
        """(predicted x machine slowdown - measured) / measured: the error with the probed (slow) drift taken out."""
        slow = self.machine_slowdown
        return None if slow is None else self.predicted_s * slow / self.measured_s - 1.0

    def judged_phases(self) -> list[dict]:
        return [ph for ph in self.validation["phases"] if ph["relative_error"] is not None
                and max(ph["predicted"], ph["measured"]) >= MIN_PHASE_SHARE * self.measured_s]


@dataclass
class Session:
    started: str
    machine: str
    cores: int | None
    load_before: tuple[float, float, float] | None
    calibrations: list[dict] = field(default_factory=list)  # per profile: path, fit errors, notes, loads, attempts
    plans: list[PlanResult] = field(default_factory=list)
    load_after: tuple[float, float, float] | None = None
    probes: list[dict] = field(default_factory=list)  # every speed probe, in order: moment, median_s, load
    failed_runs: list[str] = field(default_factory=list)  # runs that failed once and were run again, and why

    @property
    def quiet(self) -> bool | None:
        return None if self.load_before is None else self.load_before[0] < QUIET_LOAD


def _prober(model_path: Path, session: Session, seconds: float, log):
    """``probe(moment) -> median seconds``: time ``speed_probe`` for the model's layer and record it."""
    from calibration.microbench.probe import speed_probe
    from simulator.spec.catalog import load_model

    m = load_model(str(model_path))

    def probe(moment: str) -> float:
        result = speed_probe(m.hidden_size, m.num_attention_heads, m.ffn_size, m.seq_length, seconds=seconds)
        session.probes.append({"moment": moment, "time": time.strftime("%H:%M:%S", time.gmtime()),
                               "load_average": load_average(), **result})
        log(f"  speed probe ({moment}): {result['median_s'] * 1e3:.2f} ms")
        return result["median_s"]

    return probe


def _layer_args(model_path: Path) -> list[str]:
    from simulator.measure.calibrate import layer_arguments
    from simulator.spec.catalog import load_model

    return layer_arguments(load_model(str(model_path)))


def _calibrate(path: Path, raw: Path, *, quick: bool, budget_s: float | None, layer_args: list[str],
               attempts: int, log) -> dict:
    """One profile; a refused one (a point more than 2x off) is measured again, up to ``attempts`` times."""
    from simulator.measure.calibrate import calibrate
    from simulator.spec.errors import ProfileError

    refusals = []
    for attempt in range(1, attempts + 1):
        before = load_average()
        start = time.monotonic()
        try:
            result = calibrate(path, device="cpu", quick=quick, budget_s=budget_s, keep_raw=raw,
                               layer_args=layer_args)
        except ProfileError as exc:
            refusals.append(str(exc))
            log(f"  calibration refused (attempt {attempt} of {attempts}): {exc}")
            continue
        p = result.profile
        link = p.collectives.network
        return {"path": path.name, "attempts": attempt, "refusals": refusals, "elapsed_s": time.monotonic() - start,
                "load_before": before, "load_at_start": p.device.load_average, "load_at_end": p.device.load_average_end,
                "fit_errors": [vars(e) for e in result.fit_errors], "notes": result.notes,
                "link": {"latency_s": link.latency_s, "max_busbw_gbps": link.max_busbw_gbps,
                         "half_size_bytes": link.half_size_bytes, "ramp_exponent": link.ramp_exponent},
                "host": p.host.model_dump(exclude={"sources", "fits", "ranges"}) if p.host else None,
                "sequence_slowdown": p.sequence_slowdown, "host_sharing_slowdown": p.host_sharing_slowdown}
    raise ProfileError(f"the CPU calibration was refused {attempts} times (last: {refusals[-1]}); run it again "
                       "when the machine is quiet")


def _run_once_more_if_it_failed(run_one, log, failures: list[str] | None = None):
    """A run that fails is tried once more: gloo on this machine now and then aborts a rank in native code
    ('terminate called without an active exception') with nothing wrong in the plan; a second failure is an error."""
    from simulator.spec.errors import RunRecordError

    try:
        return run_one()
    except RunRecordError as exc:
        log(f"  the run failed ({exc}); running it once more")
        if failures is not None:
            failures.append(str(exc))
        return run_one()


def _median_runs(jobs: dict[str, tuple], iterations: int, runs: int, run_reference, probe=None, log=print,
                 failures: list[str] | None = None) -> dict[str, tuple]:
    """Run every plan ``runs`` times, in rounds (each round runs every plan once, in order), and keep for each
    plan the run whose mean iteration is the median, written at its record path. ``jobs``: label -> (job,
    record path). Returns label -> (record, every run's mean, the mean of the probes around the kept run).

    The machine's speed drifts from minute to minute (the same plan took 558 and 842 ms per iteration in two
    runs a minute apart here); in rounds every plan samples the same stretch of it, where one plan after the
    other would give the last plans the drift of the last minutes. With ``probe``, the speed is probed before
    every run and after the last."""
    import statistics

    from simulator.measure.run_record import write_run_record

    records = {label: [] for label in jobs}
    sequence, probes = [], []  # the labels in the order they ran; the probe before each run, then one after all
    for i in range(runs):
        log(f"round {i + 1} of {runs}")
        for label, (job, record_path) in jobs.items():
            if probe is not None:
                probes.append(probe(f"before run {i + 1} of {record_path.stem}"))
            path = record_path.with_name(f"{record_path.stem}.{i}.json")
            log(f"  {label} -> {path.name}")
            records[label].append(_run_once_more_if_it_failed(
                lambda job=job, path=path: run_reference(job, device="cpu", iterations=iterations, out=path),
                log, failures))
            sequence.append(label)
    if probe is not None and sequence:
        probes.append(probe("after the last run"))
    kept_runs = {}
    for label, (job, record_path) in jobs.items():
        means = [statistics.fmean(r.timed_iteration_times_s) for r in records[label]]
        kept = sorted(range(runs), key=lambda i: means[i])[(runs - 1) // 2]
        for i in range(runs):
            for suffix in (".json", ".json.log"):
                record_path.with_name(f"{record_path.stem}.{i}{suffix}").unlink(missing_ok=True)
        write_run_record(records[label][kept], record_path)
        at = [k for k, name in enumerate(sequence) if name == label][kept]  # the kept run's place in the sequence
        kept_runs[label] = (records[label][kept], means, statistics.fmean(probes[at:at + 2]) if probes else None)
    return kept_runs


def run(out: Path, *, iterations: int, quick: bool, budget_s: float | None, attempts: int, plans: list[str],
        model: Path = MODEL, log=print, runs: int = 3, probe_s: float = 2.0) -> Session:
    """Calibrate twice, run and validate every plan; write everything under ``out``."""
    from calibration.reference.launch import run_reference
    from simulator.cli.options import job_from_options
    from simulator.cost.profile import load_profile
    from simulator.estimator.prediction import estimate
    from simulator.measure.validate import validate

    out.mkdir(parents=True, exist_ok=True)
    session = Session(started=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      machine=f"{platform.processor() or platform.machine()}", cores=os.cpu_count(),
                      load_before=load_average())
    log(f"load average before starting: {session.load_before} on {session.cores} cores")
    layer_args = _layer_args(model)
    probe = _prober(model, session, probe_s, log) if probe_s > 0 else None
    profiles = []
    for name in ("cpu-profile.json", "cpu-profile-repeat.json"):
        log(f"calibrating -> {out / name}")
        before = probe(f"before {name}") if probe else None
        info = _calibrate(out / name, out / name.replace(".json", "-raw.json"), quick=quick, budget_s=budget_s,
                          layer_args=layer_args, attempts=attempts, log=log)
        info["probe_s"] = (before + probe(f"after {name}")) / 2 if probe else None
        session.calibrations.append(info)
        profiles.append(load_profile(out / name))
    jobs = {label: (job_from_options(model=str(model), cluster="local-cpu", precision="fp32",
                                     allow_tp_across_nodes=True, attention_backend="unfused", **PLANS[label]),
                    out / f"run-{_slug(label)}.json") for label in plans}
    log(f"running {len(jobs)} plan(s) {runs} time(s) each, in rounds")
    kept = _median_runs(jobs, iterations, runs, run_reference, probe, log, session.failed_runs)
    for label, (job, record_path) in jobs.items():
        record, means, run_probe_s = kept[label]
        v = validate(record, str(out / "cpu-profile.json"), run=record_path.name)
        again = estimate(job, profiles[1]).iteration_time_s
        session.plans.append(PlanResult(label, record_path.name, v.model_dump(mode="json"), again,
                                        record.timed_iteration_times_s, record.load_average, means,
                                        run_probe_s, session.calibrations[0]["probe_s"]))
        log(f"  {label}: predicted {v.iteration_time_s.predicted * 1e3:.0f} ms, measured "
            f"{v.iteration_time_s.measured * 1e3:.0f} ms ({v.iteration_time_s.relative_error:+.1%}); {v.verdict}")
    session.load_after = load_average()
    (out / "summary.json").write_text(json.dumps(_summary(session), indent=2) + "\n")
    (out / "README.md").write_text(render(session, out))
    return session


def _slug(label: str) -> str:
    return label.lower().replace(" ", "").replace(",", "-").replace("+", "")


def targets(session: Session) -> list[tuple[str, float | None, float, bool]]:
    """(target, worst value, limit, met) for the issue's three targets."""
    worst_stability = max((abs(p.stability) for p in session.plans), default=None)
    worst_iteration = max((abs(p.validation["iteration_time_s"]["relative_error"]) for p in session.plans),
                          default=None)
    phases = [abs(ph["relative_error"]) for p in session.plans for ph in p.judged_phases()]
    worst_phase = max(phases, default=None)
    out = []
    for what, value, limit in (("two calibrations' predictions agree", worst_stability, STABILITY),
                               ("iteration time, predicted vs measured", worst_iteration, ITERATION),
                               ("each phase, predicted vs measured", worst_phase, PHASE)):
        out.append((what, value, limit, value is not None and value <= limit))
    return out


def relative_to_tp1(session: Session) -> list[tuple[str, float, float]]:
    """(plan, measured / TP 1's measured, predicted / TP 1's predicted) for every plan but TP 1."""
    base = next((p for p in session.plans if p.label == "TP 1"), None)
    if base is None:
        return []
    return [(p.label, p.measured_s / base.measured_s, p.predicted_s / base.predicted_s)
            for p in session.plans if p is not base]


def _summary(session: Session) -> dict:
    return {
        "started": session.started, "machine": session.machine, "cores": session.cores,
        "load_average_before": session.load_before, "load_average_after": session.load_after,
        "quiet": session.quiet, "calibrations": session.calibrations,
        "plans": [{"plan": p.label, "record": p.record, "predicted_s": p.predicted_s,
                   "predicted_by_repeat_profile_s": p.repeat_prediction_s, "measured_s": p.measured_s,
                   "iteration_times_s": p.iteration_times_s, "load_average": p.load_average,
                   "run_means_s": p.run_means_s, "probe_s": p.probe_s,
                   "calibration_probe_s": p.calibration_probe_s, "machine_slowdown": p.machine_slowdown,
                   "error_at_run_speed": p.error_at_run_speed,
                   "validation": p.validation} for p in session.plans],
        "probes": session.probes, "failed_runs": session.failed_runs,
        "targets": [{"target": t, "worst": v, "limit": lim, "met": met} for t, v, lim, met in targets(session)],
        "relative_to_tp1": [{"plan": label, "measured": m, "predicted": pr} for label, m, pr in relative_to_tp1(session)],
    }


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f} ms"


def _pct(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{0.0 if abs(x) < 5e-4 else x * 100:+.1f}%"  # never "-0.0%"


def _load(x) -> str:
    return "unknown" if not x else f"{x[0]:.2f}"


def machine_speed_section(session: Session) -> list[str]:
    """The speed probes, and each plan's error at the speed the machine had during its run."""
    if not session.probes:
        return []
    base = session.calibrations[0].get("probe_s") if session.calibrations else None
    lines = ["", "## The machine's speed", "",
             "The same fixed work (one layer's forward kernels at the model's shapes, one thread, about 2 s of "
             "repetitions) timed before and after each calibration and each run. Its time against the first "
             "calibration's says how much slower or faster the machine ran at that moment; the last column of the "
             "second table is each plan's error with that drift taken out: a diagnostic, not a target met. The "
             "probe runs in one process, so it does not see two ranks contending for the two cores, and it brackets a run "
             "without seeing inside it: on this virtual machine one kernel's speed switches between two levels within "
             "half a second (the attention dropout's bernoulli_ at 3.7 or 5.8 ms in one process), so the column is a "
             "bound on slow drift, not a correction.", "",
             "| moment | at (UTC) | probe | against the first calibration | load |", "|---|---|---|---|---|"]
    for pr in session.probes:
        against = f"{pr['median_s'] / base:.2f}x" if base else "-"
        lines.append(f"| {pr['moment']} | {pr['time']} | {pr['median_s'] * 1e3:.2f} ms | {against} | "
                     f"{_load(pr.get('load_average'))} |")
    if len(session.calibrations) > 1 and base and session.calibrations[1].get("probe_s"):
        second = session.calibrations[1]["probe_s"] / base
        lines += ["", f"The second calibration ran with the machine at {second:.2f}x "
                  "the first's probe time."]
    lines += ["", "| plan | machine during the run, against the calibration | error | error at the run's speed |",
              "|---|---|---|---|"]
    for p in session.plans:
        slow = p.machine_slowdown
        lines.append(f"| {p.label} | {'-' if slow is None else f'{slow:.2f}x'} | "
                     f"{_pct(p.validation['iteration_time_s']['relative_error'])} | {_pct(p.error_at_run_speed)} |")
    return lines


def render(session: Session, out: Path) -> str:
    quiet = {True: "quiet", False: "busy: these timings are noise, rerun when it is quiet", None: "unknown"}
    lines = [
        "# Closing the calibrate -> run -> validate loop on a CPU",
        "",
        f"Regenerate with `python -m calibration.cpu_validation --out {out}` (it calibrates twice, runs the six plans "
        "and validates them; the numbers are this machine at one moment).",
        "",
        f"Machine: {session.machine}, {session.cores} cores; one torch thread per rank (set by the launcher, "
        f"recorded in each run, checked against the profile); model `{MODEL.name}`; started {session.started}.",
        "",
        f"**How quiet it was**: 1-minute load average {_load(session.load_before)} before starting "
        f"({quiet[session.quiet]}; quiet means under {QUIET_LOAD}), {_load(session.load_after)} at the end. "
        "Each calibration and run recorded its own (below); the runs' own ranks raise it.",
        "",
        "## Targets",
        "",
        "| target | worst | limit | |",
        "|---|---|---|---|",
    ]
    for what, value, limit, met in targets(session):
        lines.append(f"| {what} | {'-' if value is None else f'{value:.1%}'} | {limit:.0%} | "
                     f"{'met' if met else 'missed'} |")
    lines += ["", f"Phases shorter than {MIN_PHASE_SHARE:.0%} of their iteration are listed but not judged.", "",
              "## Profiles", "",
              "| profile | attempts | load at start / end | link latency per step | link busbw | host per op | "
              "ops in a step against alone | ranks sharing the cores |",
              "|---|---|---|---|---|---|---|---|"]
    for c in session.calibrations:
        host = f"{c['host']['op_s'] * 1e6:.1f} us" if c.get("host") else "-"
        factors = [f"{c[k]:+.1%}" if c.get(k) is not None else "-" for k in ("sequence_slowdown", "host_sharing_slowdown")]
        lines.append(f"| `{c['path']}` | {c['attempts']} | {_load(c['load_at_start'])} / {_load(c['load_at_end'])} | "
                     f"{c['link']['latency_s'] * 1e6:.0f} us | {c['link']['max_busbw_gbps']:.3g} GB/s | {host} | "
                     f"{factors[0]} | {factors[1]} |")
    lines += ["", "Fit errors (rms / max of (model - measured) / measured over each block's points):", "",
              "| block | " + " | ".join(f"`{c['path']}`" for c in session.calibrations) + " |",
              "|---|" + "---|" * len(session.calibrations)]
    blocks = [e["block"] for e in session.calibrations[0]["fit_errors"]] if session.calibrations else []
    for block in blocks:
        cells = []
        for c in session.calibrations:
            e = next((x for x in c["fit_errors"] if x["block"] == block), None)
            cells.append("-" if e is None else f"{e['rms'] * 100:.1f}% / {e['max_abs'] * 100:.1f}%")
        lines.append(f"| {block} | " + " | ".join(cells) + " |")
    lines += ["", "## Iteration time", "",
              "| plan | predicted | by the repeat profile | between calibrations | measured (min .. max) | error | "
              "every run's mean | load at start | verdict |",
              "|---|---|---|---|---|---|---|---|---|"]
    for p in session.plans:
        t = p.iteration_times_s
        lines.append(f"| {p.label} | {_ms(p.predicted_s)} | {_ms(p.repeat_prediction_s)} | {_pct(p.stability)} | "
                     f"{_ms(p.measured_s)} ({_ms(min(t))} .. {_ms(max(t))}) | "
                     f"{_pct(p.validation['iteration_time_s']['relative_error'])} | "
                     f"{', '.join(_ms(m) for m in p.run_means_s) or '-'} | {_load(p.load_average)} | "
                     f"{p.validation['verdict']} |")
    lines += machine_speed_section(session)
    relative = relative_to_tp1(session)
    if relative:
        lines += ["", "## Relative to TP 1", "",
                  "Each plan's time over TP 1's, measured and predicted: what the calibration gets wrong about this "
                  "machine's kernels, and a drift of its speed between the calibration and the runs, scale both plans "
                  "alike and cancel here; what the model gets wrong about the plan does not.", "",
                  "| plan | measured / TP 1 | predicted / TP 1 | error |", "|---|---|---|---|"]
        for label, measured, predicted in relative:
            lines.append(f"| {label} | {measured:.3f} | {predicted:.3f} | {_pct(predicted / measured - 1)} |")
    lines += ["", "## Phases (Megatron's timers, mean over timed iterations and the stage's ranks)", "",
              "| plan | phase | stage | predicted | measured (min .. max) | error |", "|---|---|---|---|---|---|"]
    for p in session.plans:
        for ph in p.validation["phases"]:
            lines.append(f"| {p.label} | {ph['phase']} | {ph['stage']} | {_ms(ph['predicted'])} | "
                         f"{_ms(ph['measured'])} ({_ms(ph['measured_min'])} .. {_ms(ph['measured_max'])}) | "
                         f"{_pct(ph['relative_error'])} |")
    lines += ["", "## Per layer and outside the layers", "",
              "| plan | layer fwd error | layer bwd error | outside the layers, predicted / measured | "
              "activation bytes predicted / measured |", "|---|---|---|---|---|"]
    for p in session.plans:
        first = p.validation["layers"][0]
        outside = p.validation.get("outside_layers_s") or {}
        lines.append(f"| {p.label} | {_pct(first['forward_s']['relative_error'])} | "
                     f"{_pct(first['backward_s']['relative_error'])} | {_ms(outside.get('predicted'))} / "
                     f"{_ms(outside.get('measured'))} | {first['activation_bytes']['predicted']:,.0f} / "
                     f"{first['activation_bytes']['measured']:,.0f} |")
    checks = sorted({f"{c['name']}: {c['detail']}" for p in session.plans for c in p.validation["checks"]
                     if c["ok"] is False})
    lines += ["", "Run/profile checks: " + ("; ".join(checks) if checks else "every run matched its profile "
                                            "(device, threads per rank)") + ".", ""]
    for c in session.calibrations:
        for note in c["notes"]:
            lines.append(f"- `{c['path']}`: {note}")
        for refusal in c["refusals"]:
            lines.append(f"- `{c['path']}` refused once: {refusal}")
    for failure in session.failed_runs:
        lines.append(f"- a run failed and was run again: {failure}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--iterations", type=int, default=8, help="Iterations per plan (the first is a warm-up).")
    parser.add_argument("--quick", action="store_true", help="Quick calibrations (fewer sizes and repetitions).")
    parser.add_argument("--budget-s", type=float, default=None, help="Measuring allowance per calibration, s.")
    parser.add_argument("--attempts", type=int, default=3, help="Calibrations tried per profile before giving up.")
    parser.add_argument("--runs", type=int, default=3,
                        help="Runs per plan; the run with the median mean iteration is validated.")
    parser.add_argument("--probe-s", type=float, default=2.0,
                        help="Seconds of each speed probe around the calibrations and runs (0: no probes).")
    parser.add_argument("--plans", default=",".join(map(_slug, PLANS)),
                        help="Comma-separated subset of: " + ", ".join(map(_slug, PLANS)))
    args = parser.parse_args(argv)
    from simulator.spec.errors import SimulatorError

    by_slug = {_slug(label): label for label in PLANS}
    chosen = [p.strip() for p in args.plans.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in by_slug]
    plans = [by_slug[p] for p in chosen if p in by_slug]
    if unknown or not plans or args.iterations < 2 or args.attempts < 1 or args.runs < 1 or not args.probe_s >= 0:
        print(f"error: --plans {unknown or chosen} are not among {', '.join(by_slug)}" if unknown or not plans else
              "error: --iterations must be at least 2 (one warm-up), --attempts and --runs at least 1, --probe-s at "
              "least 0",
              file=sys.stderr)
        return 2
    try:
        session = run(args.out, iterations=args.iterations, quick=args.quick, budget_s=args.budget_s,
                      attempts=args.attempts, plans=plans, log=lambda m: print(m, flush=True), runs=args.runs,
                      probe_s=args.probe_s)
    except SimulatorError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    for what, value, limit, met in targets(session):
        print(f"{what}: worst {'-' if value is None else f'{value:.1%}'} (limit {limit:.0%}) "
              f"{'met' if met else 'missed'}")
    print(f"wrote {args.out / 'README.md'} and {args.out / 'summary.json'}; the machine was "
          f"{'quiet' if session.quiet else 'busy' if session.quiet is False else 'of unknown load'} "
          f"(load average {_load(session.load_before)} before starting)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
