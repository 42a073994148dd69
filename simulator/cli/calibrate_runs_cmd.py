"""``simulator calibrate --from-runs LOG...``: a profile fitted to the user's own measured runs (their Megatron
training logs), with the constants the runs pinned, each run before and after, and the band of the fit."""

from __future__ import annotations

import json
from pathlib import Path

import click

from simulator.spec.errors import ConfigError


def calibrate_from_runs(logs: tuple[str, ...], out: Path, cluster: str, model: str, launch: str | None,
                        base_path: str | None, warmup: int, name: str | None, as_json: bool) -> None:
    from simulator.cli.runs_input import job_of_log
    from simulator.cost.profile import default_profile, load_profile, save_profile
    from simulator.measure.calibrate_runs import describe, fit_runs, fitted_profile
    from simulator.measure.megatron_log import log_files, measured_time, read_log
    from simulator.measure.run_logs import log_digest

    runs, digests = [], []
    for path in log_files(list(logs)):
        log = read_log(path)
        job, _ = job_of_log(log, cluster, model, launch)
        runs.append((str(path), job, measured_time(log, warmup).iteration_time_s))
        digests.append(log_digest(path))
    if not runs:
        raise ConfigError("no training logs given to --from-runs; name the runs' logs")
    base = load_profile(base_path) if base_path else default_profile(runs[0][1].cluster.gpu.name)
    fit = fit_runs(runs, base)
    profile = fitted_profile(base, fit, [job for _, job, _ in runs], name or f"{base.gpu.lower()}-from-runs",
                             tuple(digests))
    save_profile(profile, out)
    if as_json:
        click.echo(json.dumps({"profile": str(out), "fit": fit.model_dump(mode="json")}, indent=2))
        return
    lines = [f"wrote {out}: profile {profile.name!r} for {profile.gpu}, fitted to {len(runs)} run(s) from {base.name}",
             ""] + describe(fit) + [
        "", f"use it with --profile {out} on plan, search, sweep and validate; plans like these runs get the band "
            "above, others keep their regime's"]
    click.echo("\n".join(lines))
