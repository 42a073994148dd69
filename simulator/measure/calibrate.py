"""``calibrate``: measure this machine (or read raw points), fit a ``HardwareProfile``, report the errors.

The measuring runs in a separate process (``python -m calibration.measure``), so torch and its
worker processes never load into the planner; the fit uses ``simulator.measure.fitting``, the same forms the
cost models evaluate. A few GEMM shapes are held out of the fit and predicted, which is the honest
test of the GEMM model: residuals on fitted points only say the form can bend that far.

What one machine cannot measure is taken from the published profile of the same GPU, and its
``sources`` entry says so: collectives on a single GPU (NCCL needs one GPU per rank), and the
slowdown of compute beside NCCL kernels.

Each measured block (GEMM, elementwise, attention, collectives) is fitted in ``calibrate_blocks`` and the
host block in ``calibrate_host``; this module reads and checks the raw points, runs the measurement, and
puts the profile together.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from pydantic import ValidationError

from calibration.microbench import RAW_FORMAT, RAW_VERSION
from simulator.cost.profile import (
    SCHEMA_VERSION,
    DeviceInfo,
    HardwareProfile,
    default_profile,
    save_profile,
)
from simulator.measure import children
from simulator.measure.calibrate_blocks import (
    SWEEP_NOISE,
    BlockError,
    HeldOutGemm,
    _fit_attention,
    _fit_collectives,
    _fit_elementwise,
    _fit_gemm,
)
from simulator.measure.calibrate_host import fit_host
from simulator.spec._io import parse_json, read_text, short_repr, validation_message, write_output
from simulator.spec.errors import ConfigError, ProfileError
from simulator.spec.hardware import GpuSpec, load_gpu

REPO = Path(__file__).resolve().parents[2]
MEASURE_MODULE = "calibration.measure"  # run as `python -m MEASURE_MODULE --device ... --out RAW.json`
_REQUIRED = {
    "gemm": ("name", "m", "n", "k", "batch", "dtype", "time_s"),  # the name tells the layer's shapes from the grid's
    "attention": ("impl", "pass", "batch_heads", "seq", "head_dim", "causal", "dtype", "time_s"),
    "elementwise": ("kernel", "bytes_moved", "time_s"),
    "collectives": ("kind", "bytes", "group_size", "time_s"),
}
# Sizes (elements, bytes, ranks) and times of a raw point: positive, finite and physically possible,
# so that no fit starts from residuals that are not finite.
_NUMERIC = {"m", "n", "k", "batch", "batch_heads", "seq", "head_dim", "bytes_moved", "bytes", "group_size", "time_s"}
_TEXT = ("dtype", "impl", "pass", "kernel", "kind", "backend", "name")
_FLAGS = ("causal", "held_out")
_SEQUENCE_KEYS = ("loop_forward_s", "loop_backward_s", "alone_forward_s", "alone_backward_s")
_MAX_SIZE = 1e15
_MAX_TIME_S = 86_400.0


@dataclass
class CalibrationResult:
    profile: HardwareProfile
    fit_errors: list[BlockError]
    held_out: list[HeldOutGemm]
    notes: list[str] = field(default_factory=list)

    def held_out_rms(self) -> float:
        return float(np.sqrt(np.mean([h.error**2 for h in self.held_out]))) if self.held_out else float("nan")

    def to_dict(self) -> dict:
        return {
            "profile": self.profile.name,
            "fit_errors": [vars(e) for e in self.fit_errors],
            "held_out_gemms": [{**vars(h), "error": h.error} for h in self.held_out],
            "held_out_rms_error": self.held_out_rms() if self.held_out else None,
            "notes": self.notes,
        }


# --- raw points ---------------------------------------------------------------------------------

def read_raw(path: str | Path) -> dict:
    """Load and check a raw points file from ``calibration.measure``; every defect is one ProfileError."""
    path = Path(path)
    where = repr(str(path))
    data = parse_json(read_text(path, "raw points", ProfileError), f"raw points {where}", ProfileError,
                      fix="measure again with `python -m calibration.measure`")
    if not isinstance(data, dict) or data.get("format") != RAW_FORMAT:
        raise ProfileError(f"{where} is not a raw points file (its 'format' is not {RAW_FORMAT!r}); "
                           "pass the --out file of `python -m calibration.measure`")
    if data.get("version") != RAW_VERSION:
        raise ProfileError(f"raw points {where} have version {data.get('version')!r}, this simulator reads "
                           f"version {RAW_VERSION}; measure again with this version")
    device = data.get("device")
    if not isinstance(device, dict) or device.get("kind") not in ("cuda", "cpu"):
        raise ProfileError(f"raw points {where} have no device description with kind 'cuda' or 'cpu'; measure again")
    memory = device.get("memory_bytes")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, (int, float)) or not 0 <= memory <= _MAX_SIZE):
        raise ProfileError(f"raw points {where}: device memory_bytes={short_repr(memory)} is not a size; measure again")
    sections = data.get("sections", {})
    if not isinstance(sections, dict) or not isinstance(data.get("settings", {}), dict) or any(
            not isinstance(info, dict) or not isinstance(info.get("skipped", []), list)
            or not isinstance(info.get("error"), (str, type(None))) for info in sections.values()):
        raise ProfileError(f"raw points {where}: 'sections' and 'settings' must be the mappings calibration.measure "
                           "writes; measure again")
    for section, keys in _REQUIRED.items():
        rows = data.get(section, [])
        if not isinstance(rows, list):
            raise ProfileError(f"raw points {where}: {section!r} must be a list of points; measure again")
        for i, row in enumerate(rows):
            missing = [k for k in keys if not isinstance(row, dict) or k not in row]
            if missing:
                raise ProfileError(f"raw points {where}: {section} point {i} lacks {missing}; measure again")
            bad = [k for k in _TEXT if k in row and not isinstance(row[k], str)]
            bad += [k for k in _FLAGS if k in row and not isinstance(row[k], bool)]
            if bad:
                raise ProfileError(f"raw points {where}: {section} point {i} has {bad[0]}={short_repr(row[bad[0]])}, "
                                   f"not {'text' if bad[0] in _TEXT else 'true or false'}; measure again")
            for key in _NUMERIC.intersection(keys):
                x = row[key]
                top = _MAX_TIME_S if key == "time_s" else _MAX_SIZE
                if not _positive(x, top):
                    raise ProfileError(f"raw points {where}: {section} point {i} has {key}={short_repr(x)}; it must be "
                                       f"a positive number of at most {top:g}, measure again")
    _check_sequence(data.get("sequence"), where)
    _check_sustained(data.get("sustained"), where)
    for section in ("gemm", "elementwise"):
        if not data.get(section):
            raise ProfileError(f"raw points {where} hold no {section} points, which every profile needs; "
                               f"measure again with `python -m calibration.measure` (its --sections include {section})")
    return data


def _positive(x, top: float) -> bool:
    """A number (not a flag) in (0, top]."""
    return not isinstance(x, bool) and isinstance(x, (int, float)) and 0 < x <= top


def _check_sequence(seq, where: str) -> None:
    """The sequence section: absent, or rounds of four positive times and counts of ops that are whole numbers."""
    if seq is None or seq == {}:
        return
    rounds = seq.get("rounds") if isinstance(seq, dict) else None
    if not isinstance(rounds, list) or any(not isinstance(r, dict) for r in rounds):
        raise ProfileError(f"raw points {where}: 'sequence' must be the mapping with a list of rounds that "
                           "calibration.measure writes; measure again")
    for key in ("ops_forward", "ops_backward"):
        x = seq.get(key, 0)
        if isinstance(x, bool) or not isinstance(x, int) or x < 0:
            raise ProfileError(f"raw points {where}: sequence {key}={short_repr(x)} must be a count of ops; measure again")
    for i, r in enumerate(rounds):
        for key in _SEQUENCE_KEYS:
            x = r.get(key)
            if not _positive(x, _MAX_TIME_S):
                raise ProfileError(f"raw points {where}: sequence round {i} has {key}={short_repr(x)}; it must be "
                                   f"a positive number of seconds, measure again")


def _check_sustained(points, where: str) -> None:
    """The sustained section: absent, or points each with a positive burst time and a list of positive
    per-window times."""
    if points is None or points == []:
        return
    if not isinstance(points, list) or any(not isinstance(p, dict) for p in points):
        raise ProfileError(f"raw points {where}: 'sustained' must be the list of points calibration.measure writes; "
                           "measure again")

    def times(xs) -> bool:
        return isinstance(xs, list) and bool(xs) and all(_positive(x, _MAX_TIME_S) for x in xs)

    for i, p in enumerate(points):
        if not _positive(p.get("burst_s"), _MAX_TIME_S) or not times(p.get("window_s")):
            raise ProfileError(f"raw points {where}: sustained point {i} needs a positive burst_s and a non-empty "
                               "list of positive window_s; measure again")
        bursts, windows = _per_device(p)
        if not times(bursts) or not isinstance(windows, list) or len(windows) != len(bursts) or not all(
                times(w) for w in windows):
            raise ProfileError(f"raw points {where}: sustained point {i} needs one positive device_burst_s and one "
                               "non-empty list of positive device_window_s per device; measure again")


def layer_arguments(model) -> list[str]:
    """``calibration.measure``'s flags for ``model``'s (a ``ModelSpec``) shapes: its layer and its output layer."""
    args = ["--hidden", str(model.hidden_size), "--heads", str(model.num_attention_heads),
            "--ffn", str(model.ffn_size), "--seq", str(model.seq_length), "--vocab", str(model.vocab_size)]
    if model.num_query_groups:
        args += ["--num-query-groups", str(model.num_query_groups)]
    return args + (["--swiglu"] if model.swiglu else [])


def measure(device: str, raw_out: Path, *, quick: bool = False, budget_s: float | None = None,
            layer_args: list[str] = (), timeout_s: float | None = None,
            progress: Callable[[str], None] | None = None) -> dict:
    """Run ``python -m calibration.measure`` in a child process and return its checked raw points;
    ``progress`` is given the child's line on each section as it starts and ends."""
    cmd = [sys.executable, "-m", MEASURE_MODULE, "--device", device, "--out", str(raw_out), *layer_args]
    if quick:
        cmd.append("--quick")
    if budget_s is not None:
        cmd += ["--budget-s", str(budget_s)]
    on_line = None
    if progress is not None:
        def on_line(line: str) -> None:
            if line.startswith(("[", "measuring ")):
                progress(line)
    proc = children.run(cmd, cwd=REPO, timeout=timeout_s, on_line=on_line)
    if not raw_out.is_file():
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
        raise ProfileError(f"measuring on {device} failed (exit {proc.returncode}) before writing points: {tail}")
    return read_raw(raw_out)


# --- fitting ------------------------------------------------------------------------------------

def gpu_for_device(device: dict) -> GpuSpec:
    """The GpuSpec a measured device stands for: the CPU spec, or the A100/H100/H200 by name and memory."""
    if device["kind"] == "cpu":
        return load_gpu("cpu")
    name = str(device.get("name", "")).upper()
    gib = float(device.get("memory_bytes") or 0) / 2**30
    for tag, spec in (("H200", "h200-sxm-141gb"), ("H100", "h100-sxm5-80gb")):
        if tag in name:
            return load_gpu(spec)
    if "A100" in name:
        return load_gpu("a100-sxm4-80gb" if gib > 48 else "a100-sxm4-40gb")
    raise ProfileError(f"no GPU spec matches the measured device {device.get('name')!r}; pass --gpu with a GPU "
                       "name or a YAML spec file of hardware_specs/gpus/ form")


def _host_sharing(raw: dict) -> tuple[float, str, list[str]]:
    """The compute slowdown of ranks sharing the machine: per round of the collectives section's shared-compute
    timing (the layer's blocks on one rank alone, then on every rank at once, by turns), the shared time over
    the lone one; the median round's ratio less 1, held at 0 (sharing cannot speed a rank up: a round below
    is the machine's noise)."""
    shared = raw.get("shared_compute")
    if not shared or not shared.get("alone_s"):
        return 0.0, ("not measured (no shared-compute timing in the raw points); taken as 0: ranks sharing a "
                     "machine are costed as if each had it to itself"), []
    ratios = [t / a for a, t in zip(shared["alone_s"], shared["together_s"]) if a > 0]
    median = statistics.median(ratios)
    slowdown = min(max(0.0, median - 1.0), 0.99)
    source = (f"measured: the layer's attention and MLP blocks on one of {shared['ranks']} ranks alone and on all at "
              f"once, by turns over {len(ratios)} rounds; the median round's shared / alone time less 1 "
              f"(rounds {min(ratios) - 1:+.0%} to {max(ratios) - 1:+.0%})")
    note = f"ranks sharing the machine slowed each other's compute by {median - 1:+.0%} (median of {len(ratios)} rounds)"
    return slowdown, source, [note]


def _step_jitter(raw: dict) -> tuple[float, str]:
    """How much one rank's compute varies independently of the others': in each round of the shared-compute
    timing every rank runs the same blocks at once, so its deviation from the round's mean over ranks is its
    own (what the machine does to all ranks alike cancels). The spread is the normal one with the measured
    mean absolute deviation, E|d| = sigma sqrt(2 (n - 1) / (pi n)): a waiting rank pays the mean gap to the
    later one (for two ranks E[max] - mean = E|d| exactly), which a few long stalls would inflate a standard
    deviation past."""
    shared = raw.get("shared_compute") or {}
    by_rank = shared.get("together_by_rank_s")
    if not by_rank or len(by_rank) < 2 or len(by_rank[0]) < 2:
        return 0.0, ("not measured (no per-rank shared-compute timing in the raw points); taken as 0: each step "
                     "takes its expected time")
    times = np.asarray(by_rank, dtype=float)  # (ranks, rounds)
    n, rounds = times.shape
    deviations = times - times.mean(axis=0, keepdims=True)
    sd = float(np.abs(deviations).mean() / np.sqrt(2 * (n - 1) / (np.pi * n)))
    mean = float(times.mean())
    jitter = min(sd / mean, 0.99)
    span_ms = mean * 1e3 * shared.get("passes", 1)
    return jitter, (f"measured: the layer's attention and MLP blocks run on all {n} ranks at once, {rounds} rounds; "
                    f"the normal spread with a rank's mean absolute deviation from the round's mean over ranks, "
                    f"over the mean time ({span_ms:.3g} ms spans)")


def _sequence_slowdown(raw: dict, host) -> tuple[float, str, list[str]]:
    """How much slower a step's ops run in sequence than each alone: per round of the sequence section (the
    reference loop's layers forward and backward as a step runs them, then each of their ops repeated alone,
    by turns), the step's time less what the host block charges for issuing its ops, over the ops' time alone;
    the median round's ratio less 1, held at 0 (a round below is the machine's noise)."""
    seq = raw.get("sequence") or {}
    rounds = seq.get("rounds", [])  # read_raw has checked every time positive
    if not rounds:
        return 0.0, ("not measured (no sequence timing in the raw points); taken as 0: an op in a step costs what "
                     "it costs repeated alone"), []
    issue_s = 0.0
    if host is not None:  # issuing is the host block's (added to each op), not the kernels'
        issue_s = seq.get("ops_forward", 0) * host.op_s + seq.get("ops_backward", 0) * host.backward_op_s
    ratios = [(r["loop_forward_s"] + r["loop_backward_s"] - issue_s) / (r["alone_forward_s"] + r["alone_backward_s"])
              for r in rounds]
    median = statistics.median(ratios)
    forward = statistics.median(r["loop_forward_s"] / r["alone_forward_s"] for r in rounds)
    backward = statistics.median(r["loop_backward_s"] / r["alone_backward_s"] for r in rounds)
    source = (f"measured: {seq.get('layers')} of the reference loop's layers forward and backward as a step runs "
              f"them ({seq.get('ops_forward')} + {seq.get('ops_backward')} ops), then each op repeated alone, by "
              f"turns over {len(ratios)} rounds; the median round's step time (less the host block's issue "
              f"cost) over its ops' time alone, less 1 (rounds {min(ratios) - 1:+.0%} to {max(ratios) - 1:+.0%}; "
              f"forward {forward - 1:+.0%}, backward {backward - 1:+.0%})")
    note = f"ops ran {median - 1:+.0%} slower in a step's sequence than alone (median of {len(ratios)} rounds)"
    return min(max(0.0, median - 1.0), 1.99), source, [note]


def _per_device(point: dict) -> tuple[list, list]:
    """A sustained point's (burst, windows) per device; a point from one device carries them once."""
    return point.get("device_burst_s", [point["burst_s"]]), point.get("device_window_s", [point["window_s"]])


def _late_s(windows: list[float]) -> float:
    """Time per product once the run has settled: the median of the later half of its windows."""
    return statistics.median(windows[len(windows) // 2:])


def _sustained_clock(raw: dict, cpu: bool) -> tuple[float, str, list[str]]:
    """The share of the GEMM block's bursts a long run holds: per device, one square GEMM's burst time (the
    median of a few repetitions, as the GEMM section times every shape) over its time per product in the
    later half of a run back to back (the median window, every device of the machine running at once),
    averaged over the devices and held at 1 (a later window faster than the burst is the clock boosting or
    noise, not a limit). A CPU's point is kept in the raw file and not used: its clock follows its load,
    which the sharing and sequence factors measure."""
    points = raw.get("sustained") or []
    if not points:
        return 1.0, ("not measured (no sustained GEMM in the raw points); taken as 1: a long run's kernels as fast "
                     "as the benchmarks' bursts"), []
    p = points[-1]
    bursts, windows = _per_device(p)
    ratio = statistics.fmean(b / _late_s(w) for b, w in zip(bursts, windows))
    shape = f"{p.get('m')}x{p.get('n')}x{p.get('k')} {p.get('dtype')}"
    if cpu:
        return 1.0, (f"not applied on a CPU (its clock follows its load, which host_sharing_slowdown and "
                     f"sequence_slowdown measure); the {shape} GEMM held {ratio:.3f} of its burst"), []
    on = f"each of {len(bursts)} devices at once" if len(bursts) > 1 else "one device"
    source = (f"measured: a {shape} GEMM on normally distributed inputs, {on}; its burst (median of repetitions) "
              f"over its time per product in the later half of {p.get('seconds', 0):.0f} s back to back (median "
              f"window), averaged over the devices: {ratio:.4f}, held at 1")
    return min(ratio, 1.0), source, [f"a {shape} GEMM run back to back held {ratio:.1%} of its burst throughput"]


def _device_spread(raw: dict, cpu: bool) -> tuple[float, str]:
    """The spread of speed from device to device: the sample standard deviation over the mean of the
    devices' settled throughputs in the sustained run (all of them at once); with one device, or on a CPU,
    not measured."""
    points = raw.get("sustained") or []
    windows = _per_device(points[-1])[1] if points else []
    if cpu or len(windows) < 2:
        return 0.0, ("not measured (a sustained GEMM on two or more GPUs of a machine at once measures it); taken as "
                     "0: every device as fast as the one the benchmarks timed")
    speeds = [1.0 / _late_s(w) for w in windows]
    spread = statistics.stdev(speeds) / statistics.fmean(speeds)
    return min(spread, 0.49), (f"measured: the settled throughput of a sustained GEMM on {len(speeds)} GPUs of one "
                               f"machine at once, their sample standard deviation over their mean ({spread:.4f}; "
                               f"slowest {min(speeds) / statistics.fmean(speeds) - 1:+.1%} of the mean); a few "
                               "devices of one machine, so a floor for a cluster's spread")


def _device_info(device: dict, settings: dict) -> DeviceInfo:
    text = {k: (str(device[k]) if device.get(k) is not None else None)
            for k in ("name", "driver", "torch_version", "cuda_version", "date", "host")}
    load = device.get("load_average")
    return DeviceInfo(**text, kind=device.get("kind"),
                      threads=settings.get("threads", device.get("cpu_threads")),
                      cores=device.get("cpu_cores"),
                      load_average=tuple(load) if load else None,
                      load_average_end=tuple(device["load_average_end"]) if device.get("load_average_end") else None)


def fit_profile(raw: dict, *, gpu: GpuSpec | None = None, name: str | None = None, check: bool = True) -> CalibrationResult:
    """Fit a measured ``HardwareProfile`` to raw points (from ``read_raw``); with ``check``, refuse (ProfileError)
    a profile that gives one of its own points back more than 2x off through the cost model."""
    device = raw["device"]
    cpu = device["kind"] == "cpu"
    gpu = gpu or gpu_for_device(device)
    base = None
    if not cpu:
        try:
            base = default_profile(gpu.name)
        except ProfileError:
            base = None
    gemm, gemm_err, held = _fit_gemm(raw, gpu, cpu)
    elementwise, elt_err = _fit_elementwise(raw, gpu)
    attention, att_err = _fit_attention(raw, gpu, base)
    collectives, coll_err, notes = _fit_collectives(raw, base, gpu)
    host, host_notes = fit_host(raw, base)
    notes += host_notes
    if base is not None:
        overlap, overlap_src = base.overlap_compute_slowdown, f"not measured here; from {base.name!r}: {base.overlap_source}"
    else:
        overlap, overlap_src = 0.0, ("not measured: on a CPU every op, collectives included, runs on the issuing "
                                     "thread, so nothing overlaps; 0")
    sharing, sharing_src, sharing_notes = _host_sharing(raw)
    notes += sharing_notes
    jitter, jitter_src = _step_jitter(raw)
    sequence, sequence_src, sequence_notes = _sequence_slowdown(raw, host)
    notes += sequence_notes
    sustained, sustained_src, sustained_notes = _sustained_clock(raw, cpu)
    notes += sustained_notes
    spread, spread_src = _device_spread(raw, cpu)
    skipped = {s: len(i.get("skipped", [])) for s, i in raw.get("sections", {}).items() if i.get("skipped")}
    if skipped:
        notes.append(f"points skipped to stay within the time budget: {skipped}")
    profile = HardwareProfile(
        schema_version=SCHEMA_VERSION,
        name=name or f"{gpu.name.lower()}-measured",
        source="measured",
        gpu=gpu.name,
        device=_device_info(device, raw.get("settings", {})),
        gemm=gemm, elementwise=elementwise, attention=attention, collectives=collectives, host=host,
        overlap_compute_slowdown=overlap, overlap_source=overlap_src,
        host_sharing_slowdown=sharing, host_sharing_source=sharing_src, step_jitter=jitter,
        step_jitter_source=jitter_src, sequence_slowdown=sequence, sequence_source=sequence_src,
        sustained_clock_fraction=sustained, sustained_clock_source=sustained_src,
        device_speed_spread=spread, device_speed_spread_source=spread_src,
        notes="; ".join([f"measured with calibration.measure, settings {json.dumps(raw.get('settings', {}), sort_keys=True)}"]
                        + notes),
    )
    if check:
        from simulator.measure.profile_check import check_profile

        notes += check_profile(profile, raw, gpu)
    return CalibrationResult(profile, [gemm_err, *elt_err, *att_err, *coll_err], held, notes)


def calibrate(out: str | Path, *, device: str | None = None, quick: bool = False, raw_path: str | Path | None = None,
              keep_raw: str | Path | None = None, gpu: GpuSpec | None = None, name: str | None = None,
              budget_s: float | None = None, layer_args: list[str] = (),
              progress: Callable[[str], None] | None = None) -> CalibrationResult:
    """Measure (or read ``raw_path``), fit, and write the profile to ``out`` atomically; ``progress`` is given
    a line as each section of the measurement starts and ends."""
    if raw_path is not None:
        raw = read_raw(raw_path)
        if device is not None and raw["device"]["kind"] != device:
            raise ConfigError(f"--device {device} but the raw points {str(raw_path)!r} were measured on "
                              f"{raw['device']['kind']}; drop --device or pass matching points")
    else:
        if device not in ("cuda", "cpu"):
            raise ConfigError(f"device={device!r}: pass --device cuda or --device cpu, or --raw with measured points")
        # measured into a folder of our own, removed however the command ends; the points are kept
        # (even those of a run cut short) only where --keep-raw says
        with tempfile.TemporaryDirectory(prefix="simulator-calibrate-") as tmp:
            raw_file = Path(tmp) / "raw.json"
            try:
                raw = measure(device, raw_file, quick=quick, budget_s=budget_s, layer_args=list(layer_args),
                              progress=progress)
            finally:
                if keep_raw is not None and raw_file.is_file():
                    write_output(keep_raw, raw_file.read_bytes(), "raw points")
    try:
        result = fit_profile(raw, gpu=gpu, name=name)
        # what `load_profile` would say of the file, said before it is written
        HardwareProfile.model_validate_json(result.profile.model_dump_json())
    except ValidationError as exc:
        raise ProfileError(f"the points measured give a profile the simulator would refuse "
                           f"({validation_message(exc, 'profile')}); nothing was written, measure again "
                           "on an idle machine") from None
    except (ValueError, FloatingPointError, np.linalg.LinAlgError) as exc:
        raise ProfileError(f"the fit failed on these points ({' '.join(str(exc).split())}); nothing was written, "
                           "measure again on an idle machine") from None
    save_profile(result.profile, out)
    return result


__all__ = [
    "MEASURE_MODULE",
    "REPO",
    "SWEEP_NOISE",
    "BlockError",
    "CalibrationResult",
    "HeldOutGemm",
    "calibrate",
    "fit_profile",
    "gpu_for_device",
    "layer_arguments",
    "measure",
    "read_raw",
]
