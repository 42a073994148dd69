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


def _shared_compute(blocks, rank: int, n: int, device: torch.device) -> dict:
    """The layer's blocks timed on one rank alone and on every rank at once, by turns (each round's rank alone
    in turn, the others waiting in a barrier, which does not spin), so that a slow drift of the machine's
    speed falls on both alike: how much ranks sharing a machine (its cores' caches, memory bandwidth, power)
    slow each other's compute, and how much one rank's time varies apart from the others' (the spread that makes
    a pipeline stage wait). Per round, per pass of the blocks: the lone rank's time, each rank's shared time and
    their mean."""
    def passes() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for j in range(SHARED_PASSES):
            blocks[j % 2](lambda: None)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - t0) / SHARED_PASSES

    passes()  # warm-up
    alone = torch.zeros(SHARED_ROUNDS, dtype=torch.float64, device=device)  # on the device: NCCL reduces there
    together = torch.zeros(SHARED_ROUNDS, dtype=torch.float64, device=device)
    for r in range(SHARED_ROUNDS):
        dist.barrier()
        if rank == r % n:
            alone[r] = passes()
        dist.barrier()
        together[r] = passes()
    dist.all_reduce(alone)  # one rank wrote each round's
    by_rank = [torch.zeros_like(together) for _ in range(n)]
    dist.all_gather(by_rank, together)
    return {"ranks": n, "passes": SHARED_PASSES, "alone_s": alone.tolist(), "together_s": (sum(by_rank) / n).tolist(),
            "together_by_rank_s": [t.tolist() for t in by_rank]}  # tolist() copies to the host


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

    shared = _shared_compute(blocks, rank, n, device) if blocks is not None else None
    points, skipped = [], []
    floor_s, best_bw = 0.0, 0.0  # time ~ floor + bytes / bandwidth, rank 0's estimate
    # size by size, the kinds by turns: a slow spell of the machine then falls on every kind at the sizes it
    # lasts, and the kinds' factors over the all-reduce (ratios) keep it out; kind by kind, one spell made a
    # reduce-scatter 4-5x its neighbours at four sizes in a row, which no neighbour median takes out
    for mode in modes:
        for nbytes in sizes:
            for kind in kinds:
                if mode == "in_loop" and kind not in IN_LOOP_KINDS:
                    continue
                numel = max(n, nbytes // esize // n * n)
                # rank 0 decides whether the point fits the budget, so that every rank agrees
                if rank == 0:
                    per_rep = floor_s + (numel * esize / best_bw if best_bw else 0.0)
                    reps = repeats * (IN_LOOP_REPEATS if mode == "in_loop" else 1)
                    flag.fill_(1.0 if time.time() + 0.2 + 2 * (warmup + reps) * per_rep < deadline else 0.0)
                dist.broadcast(flag, 0)
                if flag.item() == 0.0:
                    skipped.append(f"{kind} {mode} {numel * esize} bytes")
                    continue
                run = _op(kind, n, rank, numel, dtype, device)
                for _ in range(warmup):
                    run()
                timer = isolated if mode == "isolated" else in_loop
                compute_times: list[float] = []
                samples, tries = timer(run), 1
                # every rank holds the same reduced samples, so every rank takes the same decision
                while _spread(samples) > NOISY_SPREAD and tries < MAX_TRIES:
                    samples += timer(run)
                    tries += 1
                # Isolated calls report the typical call (median). In the loop, a call's time sums into the
                # step's: the mean, tail included (a waiting rank is sometimes woken a scheduler tick late).
                t = statistics.median(samples) if mode == "isolated" else statistics.fmean(samples)
                size = numel * esize
                algbw = size / t / 1e9
                points.append({"kind": kind, "mode": mode, "bytes": size, "group_size": n, "backend": backend,
                               "dtype": dtype_name, "time_s": t, "algbw_gbps": algbw,
                               "busbw_gbps": algbw * bus_factor(kind, n), "repeats": repeats, "tries": tries,
                               "spread": _spread(samples), "median_s": statistics.median(samples),
                               **({"compute_shape": list(compute_shapes[0]),
                                   "compute_shapes": [list(c) for c in compute_shapes],
                                   "compute_s": statistics.median(compute_times)} if mode == "in_loop" else {})})
                if rank == 0 and mode == "isolated":
                    floor_s = t if not floor_s else min(floor_s, t)
                    best_bw = max(best_bw, size / t)
    host = _issue_cost(device, dtype) if device.type == "cuda" else None
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps({"points": points, "skipped": skipped, "host": host,
                                         "shared_compute": shared}))


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
    communicator must not eat the rest of a calibration session).
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
        while not ctx.join(timeout=1.0):
            if time.monotonic() - start > budget_s + grace_s:
                for p in ctx.processes:
                    if p.is_alive():
                        p.terminate()
                raise TimeoutError(f"{backend} collectives still running {budget_s + grace_s:.0f} s after start; ranks killed")
        result = json.loads(Path(out).read_text())
    result["elapsed_s"] = time.monotonic() - start
    return result
