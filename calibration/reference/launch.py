"""Starting the reference loop under torchrun, so users need not (no torch import here).

``simulator reference`` and the tests call these; both turn a failed launch into one
``RunRecordError`` sentence, with the full output kept in a log file next to the record.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from simulator.measure import children
from simulator.measure.run_record import RunRecord, load_run_record, write_run_record
from simulator.spec._io import check_output, write_output
from simulator.spec.errors import ConfigError, RunRecordError
from simulator.spec.model import Normalization, PositionEmbedding
from simulator.spec.plan import CpCommType, Job, RecomputeGranularity, RecomputeMethod

REPO_ROOT = Path(__file__).resolve().parents[2]
TRAIN_SCRIPT = Path(__file__).resolve().with_name("train.py")


def torchrun_command(nproc: int, train_args: list[str], script: Path | None = None) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N train.py ...`` with this interpreter."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            str(script or TRAIN_SCRIPT), *train_args]


def check_supported(job: Job) -> None:
    """The reference loop implements GPT-style layers (and dropless mixture-of-experts layers), and context
    parallelism as the p2p ring; say so before any process starts."""
    m, p = job.model, job.plan
    unsupported = [
        (m.swiglu, "swiglu", "use a GeLU MLP"),
        (m.normalization is not Normalization.layernorm, "RMSNorm", "use LayerNorm"),
        (m.position_embedding_type is not PositionEmbedding.learned_absolute, "rotary embeddings",
         "use learned absolute positions"),
        (m.query_groups != m.num_attention_heads, f"num_query_groups={m.num_query_groups}", "drop grouped-query attention"),
        (m.untie_embeddings_and_output_weights, "untied output weights", "tie them"),
        (not m.add_bias_linear, "linear layers without bias", "keep the biases"),
        # the fused backends run the loop's flash-style attention, which has no dropout on the probabilities
        (p.use_flash_attention and m.attention_dropout > 0,
         f"attention_dropout={m.attention_dropout} with the fused {p.attention_backend.value!r} attention backend",
         "use a model with attention_dropout 0" + ("" if p.context_parallel_size > 1 else
                                                    " or --attention-backend unfused")),
        (p.context_parallel_size > 1 and p.cp_comm_type is not CpCommType.p2p,
         f"context parallelism with cp_comm_type {p.cp_comm_type.value!r}", "use the p2p ring"),
        (p.use_distributed_optimizer, "the distributed optimizer", "drop --use-distributed-optimizer"),
        (p.recompute.granularity is RecomputeGranularity.full and p.recompute.method is RecomputeMethod.uniform
         and p.recompute.num_layers > 1, f"uniform recompute groups of {p.recompute.num_layers} layers",
         "use --recompute-num-layers 1 or --recompute-method block"),
    ]
    if m.is_moe:
        unsupported += [
            (m.moe_expert_capacity_factor is not None,
             f"token dropping (moe_expert_capacity_factor={m.moe_expert_capacity_factor})",
             "leave moe_expert_capacity_factor unset (dropless)"),
            # Megatron's rule: the experts take the sequence-parallel shards of the TP ranks
            (p.tensor_parallel_size > 1 and not p.sequence_parallel,
             f"mixture-of-experts layers with tensor_parallel_size={p.tensor_parallel_size} and no sequence "
             "parallelism", "add --sequence-parallel"),
        ]
    for bad, what, fix in unsupported:
        if bad:
            raise ConfigError(f"the reference training loop does not implement {what}; {fix}")
    _check_expert_layout(job)


def _check_expert_layout(job: Job) -> None:
    """The expert dimensions must tile the ranks of a stage and split the experts evenly (else the rank layout
    has no expert groups to build)."""
    m, p = job.model, job.plan
    ep, etp = p.expert_model_parallel_size, p.expert_tp_size
    ranks = p.tensor_parallel_size * p.context_parallel_size * p.data_parallel_size
    if not m.is_moe:
        if ep > 1:
            raise ConfigError(f"expert_model_parallel_size={ep} needs a model with experts; set num_experts or use 1")
        return
    if ranks % (ep * etp):
        raise ConfigError(f"expert_model_parallel_size={ep} x expert_tensor_parallel_size={etp} does not divide the "
                          f"{ranks} TP x CP x DP ranks of a stage; pick sizes whose product divides {ranks}")
    if m.num_experts % ep:
        raise ConfigError(f"expert_model_parallel_size={ep} does not divide num_experts={m.num_experts}; use a "
                          "divisor of the expert count")
    if m.expert_ffn_size % etp:
        raise ConfigError(f"expert_tensor_parallel_size={etp} does not divide the experts' ffn size "
                          f"{m.expert_ffn_size}; use a divisor of it")
    shared = m.moe_shared_expert_intermediate_size
    if shared and shared % p.tensor_parallel_size:
        raise ConfigError(f"tensor_parallel_size={p.tensor_parallel_size} does not divide "
                          f"moe_shared_expert_intermediate_size={shared}; use a divisor of it")


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception)(: .*)?$")


def _first_error(output: str) -> str:
    """The line that says what went wrong: the loop's own 'error:' line, else the last exception line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("error: "):
            return line[len("error: "):].rstrip(".")
    for line in reversed(lines):
        if _EXCEPTION_LINE.match(line) and not line.startswith("torch.distributed"):
            return line.rstrip(".")
    # a rank that died in native code leaves no Python exception: say how it died (torchrun's failure table
    # lists the root cause, the first rank to fail, last)
    signals = [line.split(":", 1)[1].strip() for line in lines if line.startswith("traceback :")]
    native = next((line for line in lines if line.startswith("terminate called")), None)
    if signals or native:
        return "; ".join(x for x in (native, f"a rank got {signals[-1]}" if signals else None) if x).rstrip(".")
    return lines[-1].rstrip(".") if lines else "no output"


# glibc's malloc hands a large freed block back to the kernel and maps a fresh one for the next, whose every
# page faults on first touch (3-4 thousand faults, about 5% of a reference-model step here); these keep freed
# memory in the process for reuse, as CUDA's caching allocator does on a GPU. A user's own setting wins.
CPU_ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**30), "MALLOC_TRIM_THRESHOLD_": str(2**34)}


def launch(nproc: int, train_args: list[str], log: Path, script: Path | None = None, timeout_s: float | None = None,
           threads: int = 1, device: str = "cpu") -> None:
    """Run torchrun with ``threads`` torch threads per rank; raise RunRecordError naming the first error if any
    rank fails.

    torchrun sets OMP_NUM_THREADS=1 only when it starts more than one process, so a one-process run
    would take every core where the profile measured one; the variables are set here for any count,
    and the loop sets and checks torch's thread count itself. The run has a process group of its own,
    stopped whole when it runs past its time or this command ends early (a rank left behind would
    keep its GPU's memory from the next run).
    """
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    if device == "cpu":
        for var, value in CPU_ALLOCATOR_ENV.items():
            env.setdefault(var, value)
    try:
        done = children.run(torchrun_command(nproc, train_args, script), env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RunRecordError(f"the reference run took more than {timeout_s:.0f} s and was stopped; "
                             "use fewer iterations or a smaller model") from None
    if done.returncode != 0:
        write_output(log, done.stdout + done.stderr, "reference run log")
        raise RunRecordError(
            f"the reference run failed (torchrun exit code {done.returncode}): {_first_error(done.stderr + done.stdout)}; "
            f"no record was written, the full output is in {str(log)!r}"
        )


def _log_path(out: Path) -> Path:
    """Beside the record, unless the record goes to a device or FIFO (/dev/null): then in the temp folder."""
    if not out.exists() or out.is_file():
        return out.with_name(out.name + ".log")
    return Path(tempfile.gettempdir()) / f"simulator-reference-{os.getpid()}.log"


def run_reference(job: Job, *, device: str, iterations: int, out: Path, seed: int = 1234,
                  script: Path | None = None, threads: int = 1, timeout_s: float | None = None) -> RunRecord:
    """One run of ``job`` on ``job.num_gpus`` processes of ``threads`` threads; returns the record, also
    written to ``out``.

    A stale record at ``out`` is removed first, so it never passes for this run's; the loop writes
    into a folder of its own and ``out`` is written once the record has been read back whole. Only
    a regular file is removed or replaced: a device or FIFO such as /dev/null is written through.
    """
    out = check_output(out, "run record")
    if out.is_file() and not out.is_symlink():
        out.unlink()
    with tempfile.TemporaryDirectory(prefix="simulator-reference-") as tmp:
        fresh = Path(tmp) / "run.json"
        args = ["--job", job.model_dump_json(), "--device", device, "--iterations", str(iterations),
                "--out", str(fresh), "--seed", str(seed), "--threads", str(threads)]
        launch(job.num_gpus, args, _log_path(out), script, timeout_s=timeout_s, threads=threads, device=device)
        record = load_run_record(fresh)
    write_run_record(record, out)
    return record


def run_batch(entries: list[dict], *, nproc: int, device: str, workdir: Path, threads: int = 1) -> None:
    """Several jobs of the same world size in one launch (starting processes is the slow part).

    ``entries``: dicts of ``job`` (a Job), ``out``, ``iterations`` and optionally ``dump_gradients``.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    batch = workdir / "batch.json"
    batch.write_text(json.dumps([{**e, "job": e["job"].model_dump(mode="json"),
                                  **{k: str(e[k]) for k in ("out", "dump_gradients") if e.get(k) is not None}}
                                 for e in entries]))
    launch(nproc, ["--batch", str(batch), "--device", device, "--threads", str(threads)], workdir / "batch.log",
           threads=threads, device=device)
