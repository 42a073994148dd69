"""Collective timings through torch.distributed: all-reduce, all-gather, reduce-scatter, send/recv.

Several processes on one machine (torch.multiprocessing, spawn): NCCL with one GPU per rank, gloo
on the CPU. Sizes are the full buffer, as ``simulator.graph.layers.CollectiveOp`` counts them (all-reduce
size, all-gather output, reduce-scatter input; send/recv what each rank sends). Bus bandwidth
follows nccl-tests (PERFORMANCE.md): all-reduce algbw x 2(n-1)/n, all-gather and reduce-scatter
algbw x (n-1)/n, send/recv algbw.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from calibration.microbench.shapes import LayerDims

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")


def bus_factor(kind: str, n: int) -> float:
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


def collective_sizes(quick: bool, device: str) -> list[int]:
    """Buffer sizes in bytes, from latency-bound to bandwidth-bound."""
    if device == "cpu":
        exps = [10, 14, 18, 21, 24] if quick else [10, 12, 14, 16, 18, 20, 22, 24]
    else:
        exps = [12, 16, 20, 24, 28] if quick else [10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30]
    return [2**e for e in exps]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _op(kind: str, n: int, rank: int, numel: int, dtype: torch.dtype, device: torch.device):
    """A closure running one collective on preallocated random buffers."""
    gen = torch.Generator(device=device).manual_seed(rank + 7)
    full = torch.randn(numel, generator=gen, device=device, dtype=torch.float32).to(dtype)
    shard = torch.empty(numel // n, dtype=dtype, device=device)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(full)
    if kind == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        src = full[: numel // n].clone()
        return lambda: gather(full, src)
    if kind == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(shard, full)
    if kind == "send_recv":
        recv = torch.empty_like(full)
        # a ring like nccl-tests' sendrecv: every rank sends to the next and receives from the previous
        ops = [dist.P2POp(dist.isend, full, (rank + 1) % n), dist.P2POp(dist.irecv, recv, (rank - 1) % n)]
        return lambda: [w.wait() for w in dist.batch_isend_irecv(ops)]
    raise ValueError(f"unknown collective {kind!r}; use one of {', '.join(KINDS)}")


LAYER_DROPOUT = 0.1  # Megatron's default attention and hidden dropout


def _layer_blocks(layer: LayerDims, gemms: list, dtype: torch.dtype, device: torch.device, gen: torch.Generator):
    """The two stretches of one layer's forward that a tensor-parallel rank runs between its collectives, as
    closures taking ``mark`` (called around the MLP block's first GEMM): the MLP's dropout-add, the next
    layer's norm and unfused attention up to its output projection; the attention's dropout-add, the norm,
    fc1, GeLU and fc2. ``gemms``: the (A, B, C) buffers of ``layer``'s fc1 and fc2, whose B and C are used."""
    s, b, h = layer.seq_length, layer.micro_batch_size, layer.hidden_size
    a, d, p = layer.local_heads, layer.head_dim, LAYER_DROPOUT

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    x, residual = rand(s * b, h), rand(s * b, h)
    w_qkv, w_proj = rand(h, 3 * a * d), rand(a * d, h)
    causal = torch.ones((s, s), dtype=torch.bool, device=device).triu(1)
    (_, fc1_w, fc1_out), (_, fc2_w, fc2_out) = gemms

    def attention(mark) -> None:
        y = torch.nn.functional.layer_norm(residual + torch.native_dropout(x, p, True)[0], (h,))
        q, k, v = (y @ w_qkv).view(s, b * a, 3 * d).transpose(0, 1).split(d, dim=-1)
        scores = torch.baddbmm(torch.empty(b * a, s, s, dtype=dtype, device=device), q, k.transpose(1, 2),
                               beta=0.0, alpha=d ** -0.5)
        probs = torch.native_dropout(torch.softmax(scores.masked_fill_(causal, -10000.0), dim=-1), p, True)[0]
        torch.bmm(probs, v).transpose(0, 1).reshape(s * b, a * d) @ w_proj

    def mlp(mark) -> None:
        y = torch.nn.functional.layer_norm(residual + torch.native_dropout(x, p, True)[0], (h,))
        mark()
        torch.mm(y, fc1_w, out=fc1_out)
        mark()
        torch.mm(torch.nn.functional.gelu(fc1_out), fc2_w, out=fc2_out)

    return attention, mlp


NOISY_SPREAD = 0.5  # (max - min) / median past which a point is measured again, as the other benchmarks do
MAX_TRIES = 3
MODES = ("isolated", "in_loop")
IN_LOOP_KINDS = ("all_reduce", "all_gather", "reduce_scatter")
IN_LOOP_REPEATS = 3


SHARED_ROUNDS, SHARED_PASSES = 48, 8  # rounds of (one rank alone, every rank at once), layer blocks timed in each
MIN_SHARED_ROUNDS = 2  # the spread between ranks needs two rounds; fewer and the profile takes 0 and says so


def _shared_compute(blocks, rank: int, n: int, device: torch.device, fits) -> dict | None:
    """The layer's blocks timed on one rank alone and on every rank at once, by turns (each round's rank alone
    in turn, the others waiting in a barrier, which does not spin), so that a slow drift of the machine's
    speed falls on both alike: how much ranks sharing a machine (its cores' caches, memory bandwidth, power)
    slow each other's compute, and how much one rank's time varies apart from the others' (the spread that makes
    a pipeline stage wait). Per round, per pass of the blocks: the lone rank's time, each rank's shared time and
    their mean. ``fits(seconds)``: whether that much more time fits the budget, the same answer on every rank;
    rounds stop when the next would not fit (None when not even ``MIN_SHARED_ROUNDS`` do)."""
    def passes() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for j in range(SHARED_PASSES):
            blocks[j % 2](lambda: None)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - t0) / SHARED_PASSES

    t0 = time.perf_counter()
    one = passes()  # warm-up, and what a round costs: a pass of SHARED_PASSES alone and one together
    round_s = max(2 * SHARED_PASSES * one, time.perf_counter() - t0)
    if not fits(MIN_SHARED_ROUNDS * round_s):
        return None
    alone = torch.zeros(SHARED_ROUNDS, dtype=torch.float64, device=device)  # on the device: NCCL reduces there
    together = torch.zeros(SHARED_ROUNDS, dtype=torch.float64, device=device)
    rounds = 0
    while rounds < SHARED_ROUNDS and (rounds < MIN_SHARED_ROUNDS or fits(round_s)):
        t0 = time.perf_counter()
        dist.barrier()
        if rank == rounds % n:
            alone[rounds] = passes()
        dist.barrier()
        together[rounds] = passes()
        round_s = time.perf_counter() - t0
        rounds += 1
    alone, together = alone[:rounds].contiguous(), together[:rounds].contiguous()
    dist.all_reduce(alone)  # one rank wrote each round's
    by_rank = [torch.zeros_like(together) for _ in range(n)]
    dist.all_gather(by_rank, together)
    return {"ranks": n, "passes": SHARED_PASSES, "alone_s": alone.tolist(), "together_s": (sum(by_rank) / n).tolist(),
            "together_by_rank_s": [t.tolist() for t in by_rank]}  # tolist() copies to the host


def point_order(modes, sizes: list[int], kinds) -> list[tuple[str, int, str]]:
    """(mode, size, kind) in the order they are measured: first the three sizes a link fit needs (the smallest,
    the middle and the largest) in every mode, then the other sizes, so that a budget cut short by a busy
    machine skips points between measured ones, never the whole in-loop sweep. At each size the kinds take
    turns, so that a slow spell of the machine falls on every kind at the sizes it lasts, and the kinds'
    factors over the all-reduce (ratios) keep it out; kind by kind, one spell made a reduce-scatter 4-5x its
    neighbours at four sizes in a row, which no neighbour median takes out."""
    core = sorted({sizes[0], sizes[len(sizes) // 2], sizes[-1]}) if sizes else []
    rest = [x for x in sizes if x not in core]
    return [(mode, nbytes, kind) for group in (core, rest) for mode in modes for nbytes in group for kind in kinds
            if mode != "in_loop" or kind in IN_LOOP_KINDS]


def _spread(samples: list[float]) -> float:
    med = statistics.median(samples)
    return (max(samples) - min(samples)) / med if med > 0 else 0.0


def _worker(rank: int, n: int, backend: str, init: str, out: str, kinds: list[str], sizes: list[int],
            dtype_name: str, warmup: int, repeats: int, deadline: float, modes: list[str] = ("isolated",),
            compute_shapes: tuple[tuple[int, int, int], ...] = ((256, 1024, 256),), threads: int = 1,
            block: LayerDims | None = None) -> None:
    torch.set_num_threads(threads)  # the ranks share the machine's cores, one thread each as the loop's ranks
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=n)
    dtype = getattr(torch, dtype_name)
    esize = torch.empty((), dtype=dtype).element_size()
    flag = torch.zeros(1, device=device)
    sync_buf = torch.zeros(1, device=device)
    # the layer GEMMs the training step runs between two of its collectives (in-loop mode)
    gen = torch.Generator(device=device).manual_seed(rank + 11)
    gemms = [(torch.randn(rows, inner, generator=gen, device=device).to(dtype),
              torch.randn(inner, cols, generator=gen, device=device).to(dtype),
              torch.empty(rows, cols, dtype=dtype, device=device)) for rows, cols, inner in compute_shapes]
    blocks = _layer_blocks(block, gemms, dtype, device, gen) if block else None

    def sync() -> None:
        dist.all_reduce(sync_buf)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def isolated(run) -> list[float]:
        """Each call alone: every rank enters together (a barrier-like all-reduce first), the slowest rank counts."""
        samples = torch.zeros(repeats, dtype=torch.float64, device=device)
        for i in range(repeats):
            sync()
            t0 = time.perf_counter()
            run()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            samples[i] = time.perf_counter() - t0
        dist.all_reduce(samples, op=dist.ReduceOp.MAX)  # a collective is as slow as its slowest rank
        return samples.tolist()

    def in_loop(run) -> list[float]:
        """As the training step issues it: right after layer compute, no barrier. The time from the call to its
        return holds the wait for the other ranks' compute and for the waiting rank to be woken; the mean over
        ranks is what the collective adds to a step beside the mean compute time. With ``block`` the compute
        is the layer's own, the attention block and the MLP block by turns (each ends where a TP rank issues
        its all-reduce), whose kernels' jitter from rank to rank sets how long the earlier rank waits; else
        the GEMMs of ``compute_shapes``. ``compute`` is the first GEMM's time beside the other ranks'. A mean
        over a tail needs more samples than a median: IN_LOOP_REPEATS times the isolated count."""
        reps = IN_LOOP_REPEATS * repeats
        samples = torch.zeros(reps, dtype=torch.float64, device=device)
        compute = torch.full((reps,), float("nan"), dtype=torch.float64, device=device)
        cuda = device.type == "cuda"
        stamps: list[list] = []  # per repetition: [first GEMM start, its end] (when timed), call start, call end

        def mark(row: list) -> None:
            if cuda:
                event = torch.cuda.Event(enable_timing=True)
                event.record()
                row.append(event)
            else:
                row.append(time.perf_counter())

        for i in range(reps):
            first: list = []
            if blocks is not None:
                blocks[i % 2](lambda: mark(first))
            else:
                for j, (a, b, c) in enumerate(gemms):
                    if j == 0:
                        mark(first)
                    torch.mm(a, b, out=c)
                    if j == 0:
                        mark(first)
            call: list = []
            mark(call)
            run()
            mark(call)
            stamps.append([first, call])
        if cuda:
            torch.cuda.synchronize(device)

        def seconds(a, b) -> float:
            return a.elapsed_time(b) / 1e3 if cuda else b - a

        for i, (first, call) in enumerate(stamps):
            samples[i] = seconds(*call)
            if len(first) == 2:
                compute[i] = seconds(*first)
        dist.all_reduce(samples)
        dist.all_reduce(compute)
        # the GEMM beside the other ranks' GEMMs (repetitions that timed one)
        compute_times.extend(x for x in (compute / n).tolist() if x == x)
        return (samples / n).tolist()

    def fits(seconds: float) -> bool:
        """Whether ``seconds`` more still end before the deadline: rank 0 decides, so that every rank agrees."""
        if rank == 0:
            flag.fill_(1.0 if time.time() + seconds < deadline else 0.0)
        dist.broadcast(flag, 0)
        return flag.item() == 1.0

    def save(shared: dict | None, partial: bool) -> None:
        """Rank 0 keeps the points so far in ``out`` after each one: ranks killed for overrunning the budget
        leave what they measured."""
        if rank == 0:
            tmp = f"{out}.tmp"
            Path(tmp).write_text(json.dumps({"points": points, "skipped": skipped, "host": None,
                                             "shared_compute": shared, "partial": partial}))
            os.replace(tmp, out)

    # What one repetition costs beyond the collective: nothing when isolated; in the loop, the compute before
    # the call (the layer's blocks by turns, or the GEMMs), timed once here. Without it a busy machine's
    # in-loop points were started that could not end in time, and the ranks were killed with every point.
    compute_s = 0.0
    if "in_loop" in modes:
        t0 = time.perf_counter()
        for j in range(2):
            if blocks is not None:
                blocks[j % 2](lambda: None)
            else:
                for a, b, c in gemms:
                    torch.mm(a, b, out=c)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        compute_s = (time.perf_counter() - t0) / 2
    points, skipped = [], []
    floor_s, best_bw = 0.0, 0.0  # time ~ floor + bytes / bandwidth, from the isolated points so far

    def try_s(mode: str, nbytes: int, extra_reps: int = 0) -> float:
        """What one try of a point is expected to take: twice the estimate, as a busy machine's time varies
        that much from try to try."""
        reps = repeats * (IN_LOOP_REPEATS if mode == "in_loop" else 1) + extra_reps
        per_rep = floor_s + (nbytes / best_bw if best_bw else 0.0) + (compute_s if mode == "in_loop" else 0.0)
        return 2 * reps * per_rep

    order = point_order(modes, sizes, kinds)
    # a round of the shared-compute timing is SHARED_PASSES passes alone and as many together, twice for safety
    shared_reserve_s = MIN_SHARED_ROUNDS * 2 * SHARED_PASSES * compute_s * 2 if blocks is not None else 0.0
    measured: list[tuple[str, str, int, list[float], list[float]]] = []  # mode, kind, numel, samples, compute times

    def measure_point(mode: str, kind: str, numel: int, samples: list[float], computed: list[float]) -> None:
        """One try of a point (its warm-up first), its samples added to those of the tries before."""
        run = _op(kind, n, rank, numel, dtype, device)
        for _ in range(warmup):
            run()
        compute_times.clear()
        samples += isolated(run) if mode == "isolated" else in_loop(run)
        computed += compute_times

    def point(mode: str, kind: str, numel: int, samples: list[float], computed: list[float], tries: int) -> dict:
        # Isolated calls report the typical call (median). In the loop, a call's time sums into the
        # step's: the mean, tail included (a waiting rank is sometimes woken a scheduler tick late).
        t = statistics.median(samples) if mode == "isolated" else statistics.fmean(samples)
        size = numel * esize
        algbw = size / t / 1e9
        return {"kind": kind, "mode": mode, "bytes": size, "group_size": n, "backend": backend,
                "dtype": dtype_name, "time_s": t, "algbw_gbps": algbw,
                "busbw_gbps": algbw * bus_factor(kind, n), "repeats": repeats, "tries": tries,
                "spread": _spread(samples), "median_s": statistics.median(samples),
                **({"compute_shape": list(compute_shapes[0]),
                    "compute_shapes": [list(c) for c in compute_shapes],
                    "compute_s": statistics.median(computed)} if mode == "in_loop" else {})}

    compute_times: list[float] = []  # the in-loop timer's GEMM beside the other ranks', per repetition
    # First every point once, in order; then the noisy ones again while time is left. Retrying each point at once
    # let the first sizes take the time of the later ones: on a busy machine every in-loop point is noisy.
    for mode, nbytes, kind in order:
        numel = max(n, nbytes // esize // n * n)
        if not fits(0.2 + try_s(mode, numel * esize, warmup)):
            skipped.append(f"{kind} {mode} {numel * esize} bytes")
            continue
        entry = (mode, kind, numel, [], [])
        measure_point(*entry)
        measured.append(entry)
        points.append(point(*entry, tries=1))
        if mode == "isolated":
            t = points[-1]["time_s"]
            floor_s = t if not floor_s else min(floor_s, t)
            best_bw = max(best_bw, numel * esize / t)
        save(None, partial=True)
    tries = [1] * len(measured)
    for _ in range(MAX_TRIES - 1):
        for i, entry in enumerate(measured):
            # every rank holds the same reduced samples, so every rank agrees on which points are noisy
            if _spread(entry[3]) > NOISY_SPREAD and fits(0.2 + try_s(entry[0], entry[2] * esize, warmup)
                                                         + shared_reserve_s):
                measure_point(*entry)
                tries[i] += 1
                points[i] = point(*entry, tries=tries[i])
                save(None, partial=True)
    # last, with what time is left: the fit takes 0 (and says so) for what this could not measure
    shared = _shared_compute(blocks, rank, n, device, fits) if blocks is not None else None
    host = _issue_cost(device, dtype) if device.type == "cuda" else None
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        tmp = f"{out}.tmp"
        Path(tmp).write_text(json.dumps({"points": points, "skipped": skipped, "host": host,
                                         "shared_compute": shared}))
        os.replace(tmp, out)


def _issue_cost(device: torch.device, dtype: torch.dtype, calls: int = 200) -> dict:
    """Host time to issue one small collective (NCCL enqueues and returns), without and with a synchronize."""
    x = torch.zeros(64, dtype=dtype, device=device)
    for _ in range(10):
        dist.all_reduce(x)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(x)
    issue = (time.perf_counter() - t0) / calls
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(x)
        torch.cuda.synchronize(device)
    return {"collective_issue_s": issue, "collective_synchronized_s": (time.perf_counter() - t0) / calls,
            "calls": calls}


def single_rank_issue_cost(device: torch.device, dtype: torch.dtype) -> dict:
    """``_issue_cost`` in an NCCL group of one rank (a one-GPU machine): the call still enqueues a kernel,
    so the host's share is the same as in a larger group."""
    import datetime

    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    try:
        return {**_issue_cost(device, dtype), "group_size": 1}
    finally:
        dist.destroy_process_group()


def run_collectives(*, backend: str, world_size: int, sizes: list[int], dtype: torch.dtype, warmup: int,
                    repeats: int, budget_s: float, kinds: tuple[str, ...] = KINDS,
                    modes: tuple[str, ...] = ("isolated",),
                    compute_shapes: tuple[tuple[int, int, int], ...] = ((256, 1024, 256),), threads: int = 1,
                    block: LayerDims | None = None) -> dict:
    """Spawn ``world_size`` ranks, time every (mode, kind, size) that fits ``budget_s``; returns points and skips.

    ``modes``: ``isolated`` (each call alone, ranks entering together) and ``in_loop`` (right after compute, as
    a training step issues its collectives: with ``block``, the layer as one TP rank holds it, its attention
    and MLP blocks by turns, ``compute_shapes`` = ((m, n, k), ...) being its fc1 and fc2; without, those
    GEMMs alone).

    The ranks are killed if they outlive the budget by more than a grace period (a hung NCCL
    communicator must not eat the rest of a calibration session); the points measured before are returned,
    with ``error`` saying why the rest are missing.
    """
    if world_size < 2:
        raise ValueError(f"world_size={world_size}: collectives need at least 2 ranks")
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "collectives.json")
        init = f"tcp://127.0.0.1:{_free_port()}"
        deadline = time.time() + budget_s
        ctx = mp.start_processes(
            _worker, nprocs=world_size, join=False, start_method="spawn",
            args=(world_size, backend, init, out, list(kinds), sizes, str(dtype).removeprefix("torch."),
                  warmup, repeats, deadline, list(modes), tuple(map(tuple, compute_shapes)), threads, block),
        )
        grace_s = 30.0
        error = None
        while not ctx.join(timeout=1.0):
            if time.monotonic() - start > budget_s + grace_s:
                for p in ctx.processes:
                    if p.is_alive():
                        p.terminate()
                for p in ctx.processes:
                    p.join(5.0)
                error = (f"{backend} collectives still running {time.monotonic() - start:.0f} s after start "
                         f"(budget {budget_s:.0f} s); ranks killed")
                break
        if error is not None and not os.path.exists(out):
            raise TimeoutError(error + " before any point was measured")
        result = json.loads(Path(out).read_text())
        if error is not None:
            result["error"] = error  # the points measured before are kept
    result["elapsed_s"] = time.monotonic() - start
    return result
