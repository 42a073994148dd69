"""Measure this machine: GEMMs, attention, memory-bound kernels, collectives and host costs, as raw JSON points.

    python -m calibration.measure --device cuda|cpu [--quick] --out RAW.json

Needs only torch and the standard library (the GPU machine may have neither pydantic nor numpy); the
fit into a hardware profile happens in ``simulator calibrate``. Each section has a share of ``--budget-s`` and
skips, with a note in the output, the points that would overrun it. The file is rewritten after
every section, so a run cut short still leaves what it measured. The last section runs one large GEMM
back to back for up to half a minute: the clock a device holds at its power limit, which the others'
short bursts never meet.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from calibration.microbench import RAW_FORMAT, RAW_VERSION
from calibration.microbench.attention import attention_cases, run_attention
from calibration.microbench.collectives import collective_sizes, run_collectives, single_rank_issue_cost
from calibration.microbench.elementwise import elementwise_sizes, run_elementwise
from calibration.microbench.gemm import (
    SUSTAINED_S,
    SUSTAINED_SHAPE,
    held_out_keys,
    run_gemms,
    time_sustained_gemm,
)
from calibration.microbench.host import run_host
from calibration.microbench.sequence import run_sequence
from calibration.microbench.shapes import (
    LayerDims,
    grid_gemms,
    layer_gemms,
    output_gemms,
    unique_gemms,
)
from calibration.microbench.timing import Budget

# the sequence first: it times the layers as a training process runs them, before the kernel benchmarks' large
# buffers have moved the allocator's thresholds (after them its ops run measurably less slowed than in a step)
# the sustained GEMM last: it holds the device at its power limit, which the other sections' bursts must not inherit
SECTIONS = ("sequence", "gemm", "attention", "elementwise", "collectives", "host", "sustained")
SHARES = {"gemm": 0.37, "attention": 0.18, "elementwise": 0.15, "collectives": 0.25, "host": 0.05, "sequence": 0.05,
          "sustained": 0.10}
SEQUENCE_ROUNDS = {False: 16, True: 8}  # rounds of (the layers as a step runs them, their ops alone); by --quick
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# the model whose layer GEMMs are measured, per device: GPT-3 175B at TP 8 on a GPU (Korthikanti
# Table 3), GPT-3 125M on a CPU at a short sequence so a quick run stays within a couple of minutes
DEFAULT_LAYER = {
    "cuda": dict(hidden=12288, heads=96, ffn=49152, seq=2048, micro_batch=1, tp=8),
    "cpu": dict(hidden=768, heads=12, ffn=3072, seq=256, micro_batch=1, tp=1),
}
DEFAULT_BUDGET_S = {("cuda", False): 360.0, ("cuda", True): 120.0, ("cpu", False): 300.0, ("cpu", True): 60.0}
# The least a section is given under the default budget, whatever the sections before it took: the collectives'
# ranks take seconds to start (each imports torch) before their first point, more on a busy machine, and a
# profile needs their points; the host's loops take a fraction of a second, and without them the profile has no
# host block. A --budget-s given is kept to: the sections share it as they always did.
MIN_SECTION_S = {"collectives": 30.0, "host": 5.0}


def _cmd(args: list[str]) -> str | None:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nccl_version() -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # a build without NCCL
        return None
    return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)


def describe_device(device: torch.device, dtype_name: str) -> dict:
    """What was measured: device name, driver, versions, date and host."""
    desc = {
        "kind": device.type,
        "dtype": dtype_name,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "python_version": platform.python_version(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_threads": torch.get_num_threads(),
        "cpu_cores": os.cpu_count(),
        "load_average": _load_average(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        desc.update(
            name=props.name,
            driver=_cmd(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) or "unknown",
            device_count=torch.cuda.device_count(),
            sm_count=props.multi_processor_count,
            memory_bytes=props.total_memory,
            l2_cache_bytes=getattr(props, "L2_cache_size", None),
            compute_capability=f"{props.major}.{props.minor}",
            nccl_version=_nccl_version(),
            cudnn_version=torch.backends.cudnn.version(),
        )
    else:
        desc.update(name=_cpu_name(), driver="n/a", device_count=1, memory_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return desc


def _load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load averages: how busy the machine was with other work."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _write_atomic(path: Path, data: dict) -> None:
    """Replace a regular file through a temporary name of this process; write into a device or FIFO
    (/dev/null, a pipe) as it is, never replacing it."""
    text = json.dumps(data, indent=1)
    if path.exists() and not path.is_file():
        with open(path, "w") as f:
            f.write(text)
        return
    path = path.resolve()  # through a symlink to the file it names
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name[:64]}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m calibration.measure", description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), required=True)
    p.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    p.add_argument("--out", type=Path, required=True, help="raw points, JSON")
    p.add_argument("--budget-s", type=float, default=None, help="wall-clock allowance for all sections")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    p.add_argument("--dtype", choices=tuple(DTYPES), default=None, help="bf16 on cuda, fp32 on cpu by default")
    p.add_argument("--hidden", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--ffn", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--micro-batch", type=int)
    p.add_argument("--tp", type=int)
    p.add_argument("--num-query-groups", type=int, default=None)
    p.add_argument("--swiglu", action="store_true")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size: the output layer's GEMMs are measured too")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads (cpu: 1 by default, one core standing for one device, as a rank of the reference loop gets)")
    p.add_argument("--world-size", type=int, default=None, help="collective ranks: GPUs on cuda, 2 on cpu")
    p.add_argument("--collective-modes", default="isolated,in_loop",
                   help="isolated (each call alone), in_loop (right after a TP rank's attention or MLP block of the layer, as the step issues them; the mean call)")
    return p.parse_args(argv)


def _layer(args: argparse.Namespace) -> LayerDims:
    d = DEFAULT_LAYER[args.device]
    return LayerDims(
        hidden_size=args.hidden or d["hidden"], num_attention_heads=args.heads or d["heads"],
        ffn_hidden_size=args.ffn or (4 * args.hidden if args.hidden else d["ffn"]), seq_length=args.seq or d["seq"],
        micro_batch_size=args.micro_batch or d["micro_batch"], tensor_parallel_size=args.tp or d["tp"],
        num_query_groups=args.num_query_groups, swiglu=args.swiglu, vocab_size=args.vocab,
    )


def _group_layer(layer: LayerDims, world: int) -> LayerDims:
    """The layer as one rank of a tensor-parallel group of ``world`` ranks holds it (the layer itself when
    ``world`` does not split its heads and FFN, or is its own TP size already)."""
    if world < 2 or layer.num_attention_heads % world or layer.ffn_hidden_size % world:
        return layer
    return dataclasses.replace(layer, tensor_parallel_size=world)


def measure(args: argparse.Namespace, log=print) -> dict:
    """Run the selected sections and return (and keep writing to ``args.out``) the raw points."""
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device; use --device cpu or check the driver")
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise SystemExit(f"--sections: unknown {unknown}; use a subset of {','.join(SECTIONS)}")
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    dtype_name = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    dtype = DTYPES[dtype_name]
    gpu = args.device == "cuda"
    threads = args.threads or 1
    if args.threads or not gpu:
        torch.set_num_threads(threads)
    modes = tuple(m.strip() for m in args.collective_modes.split(",") if m.strip())
    if not modes or any(m not in ("isolated", "in_loop") for m in modes):
        raise SystemExit(f"--collective-modes {args.collective_modes!r}: use isolated, in_loop or both")
    layer = _layer(args)
    world = args.world_size or (torch.cuda.device_count() if gpu else 2)
    # between two of its collectives a rank of a TP group of ``world`` runs its shard of the layer
    group_layer = _group_layer(layer, world)
    total_s = args.budget_s or DEFAULT_BUDGET_S[(args.device, args.quick)]
    warmup, repeats = (3, 10) if args.quick else (5, 20)
    if not gpu:
        warmup, repeats = (2, 5) if args.quick else (3, 9)

    raw: dict = {
        "format": RAW_FORMAT, "version": RAW_VERSION,
        "device": describe_device(device, dtype_name),
        "settings": {"quick": args.quick, "budget_s": total_s, "warmup": warmup, "repeats": repeats,
                     "threads": threads, "collective_modes": list(modes),
                     "layer": {k: getattr(layer, k) for k in layer.__dataclass_fields__},
                     "in_loop_layer": {k: getattr(group_layer, k) for k in group_layer.__dataclass_fields__}},
        "gemm": [], "attention": [], "elementwise": [], "collectives": [], "host": [], "sequence": {}, "sustained": [],
        "sections": {},
    }
    log(f"measuring {raw['device']['name']} ({args.device}, {dtype_name}), torch {torch.__version__}, "
        f"budget {total_s:.0f} s, sections {','.join(sections)}")
    start = time.monotonic()
    for i, section in enumerate(sections):
        left = total_s - (time.monotonic() - start)
        share = SHARES[section] / sum(SHARES[s] for s in sections[i:])
        floor_s = MIN_SECTION_S.get(section, 0.0) if args.budget_s is None else 0.0
        budget = Budget(max(0.0, left * share, floor_s))
        log(f"[{section}] measuring, {budget.seconds:.0f} s allowed")
        info = {"budget_s": round(budget.seconds, 1), "status": "done", "skipped": budget.skipped, "error": None}
        try:
            if budget.seconds <= 0:
                info["status"] = "skipped"
                info["error"] = "no time left in the budget"
            elif section == "gemm":
                in_loop = layer_gemms(group_layer) if "collectives" in sections and "in_loop" in modes else []
                shapes = unique_gemms(layer_gemms(layer) + output_gemms(layer) + in_loop
                                      + grid_gemms(args.quick, args.device))
                raw["gemm"] = run_gemms(shapes, dtype, device, budget, warmup=warmup, repeats=repeats,
                                        held_out=held_out_keys(shapes))
            elif section == "attention":
                cases = attention_cases(args.quick, args.device, layer.local_heads, layer.head_dim,
                                        layer.micro_batch_size, layer.seq_length)
                raw["attention"] = run_attention(cases, dtype, device, budget, causal=True, warmup=warmup,
                                                 repeats=repeats)
            elif section == "elementwise":
                own = (layer.tokens * layer.hidden_size, layer.tokens * layer.ffn_hidden_size // layer.tensor_parallel_size,
                       layer.micro_batch_size * layer.local_heads * layer.seq_length**2)
                raw["elementwise"] = run_elementwise(elementwise_sizes(args.quick, args.device, own), layer.hidden_size,
                                                     dtype, device, budget, warmup=warmup, repeats=repeats)
            elif section == "collectives":
                if world < 2:
                    info["status"] = "skipped"
                    info["error"] = (f"{world} GPU(s): NCCL needs one GPU per rank, so collectives need at least 2; "
                                     "take collective figures from a multi-GPU run or a published profile")
                else:
                    mlp = [g for g in layer_gemms(group_layer) if g.name in ("fc1", "fc2")]
                    res = run_collectives(backend="nccl" if gpu else "gloo", world_size=world,
                                          sizes=collective_sizes(args.quick, args.device),
                                          dtype=dtype, warmup=warmup, repeats=repeats, budget_s=budget.seconds,
                                          modes=modes, compute_shapes=tuple((g.m, g.n, g.k) for g in mlp),
                                          threads=threads, block=group_layer)
                    raw["collectives"] = res["points"]
                    if res.get("error"):
                        info["status"], info["error"] = "cut short", res["error"]
                    if res.get("shared_compute"):
                        raw["shared_compute"] = res["shared_compute"]
                    if res.get("host"):
                        raw["collective_host"] = res["host"]
                    budget.skipped.extend(res["skipped"])
            elif section == "host":
                raw["host"] = run_host(device, dtype, micro_batch_shape=(layer.micro_batch_size, layer.seq_length + 1),
                                       hidden=layer.hidden_size)
                if gpu and not raw.get("collective_host"):
                    # one GPU: the host cost of issuing an NCCL call, in a group of one
                    raw["collective_host"] = single_rank_issue_cost(device, dtype)
            elif section == "sustained":
                size = SUSTAINED_SHAPE[args.device]
                burst_s = 1.0 if gpu else 0.5  # the bursts first, then the run; on a GPU well under a second each
                seconds = min(SUSTAINED_S[(args.device, args.quick)], budget.left_s() - burst_s)
                if budget.allows(seconds + burst_s, f"sustained {size}^3 GEMM") and seconds > 0:
                    # every GPU of the machine at once, as a job keeps them: the spread between them too
                    others = tuple(torch.device("cuda", i) for i in range(1, torch.cuda.device_count())) if gpu else ()
                    raw["sustained"] = [time_sustained_gemm(size, dtype, device, seconds=seconds, warmup=warmup,
                                                            repeats=repeats, others=others)]
                else:
                    info["status"] = "skipped"
                    info["error"] = "no time left in the budget for a sustained run"
            elif section == "sequence":
                if gpu:
                    info["status"] = "skipped"
                    info["error"] = ("not measured on a GPU: its host issues ahead of the kernels, and what issuing "
                                     "costs is the host section's; the profile takes 0")
                else:
                    raw["sequence"] = run_sequence(layer, dtype, device, budget, rounds=SEQUENCE_ROUNDS[args.quick])
        except Exception as exc:  # one broken section must not lose the others
            info["status"] = "failed"
            info["error"] = f"{type(exc).__name__}: {exc}"
            log(traceback.format_exc())
        info["elapsed_s"] = round(budget.elapsed_s(), 2)
        raw["sections"][section] = info
        n = len(raw.get(section, {}).get("rounds", [])) if section == "sequence" else len(raw.get(section, []))
        log(f"[{section}] {info['status']}: {n} points in {info['elapsed_s']:.1f} s of {info['budget_s']:.0f} s"
            + (f"; skipped {len(info['skipped'])} that would overrun" if info["skipped"] else "")
            + (f"; {info['error']}" if info["error"] else ""))
        _write_atomic(args.out, raw)
    raw["elapsed_s"] = round(time.monotonic() - start, 2)
    raw["device"]["load_average_end"] = _load_average()
    _write_atomic(args.out, raw)
    return raw


def _stop(signum: int, frame: object) -> None:
    # SIGTERM unwinds like Ctrl-C, so the temporary folders of the collectives are removed
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _stop)
    args = parse_args(argv)
    raw = measure(args, log=lambda msg: print(msg, flush=True))
    failed = [s for s, info in raw["sections"].items() if info["status"] == "failed"]
    print(f"wrote {args.out} in {raw['elapsed_s']:.1f} s" + (f"; failed sections: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
