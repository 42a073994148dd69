"""The reference training loop: ``torchrun --nproc-per-node TPxCPxPPxDP calibration/reference/train.py --job JSON``.

``simulator reference`` starts it for you. Each rank (one torch thread, set and checked)
builds its model chunks, plays the simulator's pipeline schedule over synthetic tokens (under
context parallelism its two chunks of every sequence), accumulates gradients into an fp32 buffer,
reduces them as Megatron-Core does (data-parallel buckets over DP x CP, sequence-parallel
parameters over TP in one call, the tied embedding over the first and last stage) and steps Adam,
under Megatron's named timers. Rank 0 writes the run record at the end, so a run that crashes
leaves none.

fp32 on CPU (gloo); bf16 or fp16 on CUDA (NCCL) with fp32 master weights and Adam state, as
Megatron keeps them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script by torchrun: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.distributed as dist

from calibration.reference.attention import context_parallel_positions
from calibration.reference.grads import CLIP_GRAD, ChunkGradients, all_reduce_coalesced, clip_grad_norm_
from calibration.reference.launch import check_supported
from calibration.reference.meter import Clock, LayerProbe
from calibration.reference.model import (
    GPTChunk,
    chunk_layer_ids,
    recomputed_layer,
    schedule_kind,
)
from calibration.reference.parallel import ParallelGroups, all_reduce, build_groups
from calibration.reference.pipeline import run_schedule
from calibration.reference.timers import TIMER_NAMES, Timers
from simulator.measure.run_record import LayerRecord, RunRecord, write_run_record
from simulator.schedule.schedules import build_schedule
from simulator.spec.errors import SimulatorError
from simulator.spec.layout import RankLayout
from simulator.spec.plan import Job, Precision

DTYPES = {Precision.fp32: torch.float32, Precision.bf16: torch.bfloat16, Precision.fp16: torch.float16}


def synthetic_batch(job: Job, iteration: int, seed: int) -> torch.Tensor:
    """The global batch of one iteration, (B, s + 1) token ids, the same on every rank."""
    gen = torch.Generator().manual_seed(seed * 7919 + iteration)
    shape = (job.plan.global_batch_size, job.model.seq_length + 1)
    return torch.randint(0, job.model.vocab_size, shape, generator=gen)


class MixedPrecisionAdam:
    """Adam on fp32 master copies of low-precision weights (plain Adam when the model is fp32), stepping on
    the fp32 ``main_grad`` of each parameter after clipping them by their global norm (Megatron's
    ``Float16OptimizerWithFloat16Params``, or ``FP32Optimizer``, with ``--clip-grad 1.0``). The step is
    torch's fused multi-tensor Adam, as Megatron's is apex's or Transformer Engine's, where the build has
    it for the device."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float, groups: ParallelGroups, device: torch.device,
                 tied: set[int] = frozenset()) -> None:
        self.params, self.groups, self.device, self.tied = params, groups, device, tied
        self.fp32 = all(p.dtype == torch.float32 for p in params)
        self.master = params if self.fp32 else [p.detach().float().clone().requires_grad_(True) for p in params]
        try:
            self.adam = torch.optim.Adam(self.master, lr=lr, fused=True)
        except (RuntimeError, ValueError):  # a build without the fused kernel for this device
            self.adam = torch.optim.Adam(self.master, lr=lr)

    def step(self) -> None:
        clip_grad_norm_(self.params, self.groups, CLIP_GRAD, self.device, self.tied)
        for p, m in zip(self.params, self.master):
            m.grad = p.main_grad  # a view of the fp32 buffer, no copy
        self.adam.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.master):
                if not self.fp32:
                    p.copy_(m)
                m.grad = None


def ties_embedding_across_stages(job: Job) -> bool:
    """The first and last stage each hold a copy of the word embedding (with one stage the output layer uses
    the embedding's own weight)."""
    return job.plan.pipeline_parallel_size > 1 and not job.model.untie_embeddings_and_output_weights


def tied_word_embeddings(chunks: list[GPTChunk], job: Job) -> list[torch.nn.Parameter]:
    """This rank's copies of the word embedding that the first and last stage share (none on the other stages,
    and none at all unless ``ties_embedding_across_stages``)."""
    if not ties_embedding_across_stages(job):
        return []
    return [c.embedding.word.weight if c.embedding is not None else c.output_word.weight
            for c in chunks if c.embedding is not None or (c.post_process and c.output_word is not None)]


def finish_gradients(chunks: list[GPTChunk], grads: list[ChunkGradients], groups: ParallelGroups,
                     timers: Timers, job: Job) -> None:
    """The reductions after the last backward, in Megatron's order (``finalize_model_grads``): the data-parallel
    (and expert-data-parallel) buckets, sequence parallelism's replicated parameters over TP, the experts' fc2
    biases over ETP, the tied embedding between the stages. Each timer starts after a barrier of every rank
    (Megatron's ``--barrier-with-L1-time``, on by default), so it holds the reduction and not the wait for
    the slowest rank; a timer is entered on every rank whenever the job has its reduction at all."""
    with timers("grads-all-reduce", barrier=True):
        for buffer in grads:
            buffer.reduce()
    params = [p for c in chunks for p in c.parameters()]
    plan = job.plan
    if (plan.sequence_parallel and plan.tensor_parallel_size > 1) or groups.etp_size > 1:
        with timers("layernorm-grads-all-reduce", barrier=True):
            sequence_parallel = [p.main_grad for p in params if getattr(p, "sequence_parallel", False)]
            if sequence_parallel and groups.tp_size > 1:
                all_reduce_coalesced(sequence_parallel, groups.tp)
            expert_partial = [p.main_grad for p in params if getattr(p, "expert_tensor_parallel_partial", False)]
            if expert_partial:
                all_reduce_coalesced(expert_partial, groups.etp)
    if ties_embedding_across_stages(job):
        with timers("embedding-grads-all-reduce", barrier=True):
            for word in tied_word_embeddings(chunks, job):
                all_reduce(word.main_grad, groups.embedding)


def dump_gradients(chunks: list[GPTChunk], groups: ParallelGroups, directory: Path, grad_norm: float) -> None:
    """Each rank's gradient shards by global name (with the slice of the full tensor each is), for tests that
    reassemble and compare them, and the global norm the optimizer clips by; for MoE layers, the copies this
    rank's experts took in the metered micro-batch and the smallest gap between a chosen and an unchosen router
    logit over the run."""
    directory.mkdir(parents=True, exist_ok=True)
    grads = {p.global_name: (p.main_grad.detach().float().cpu().clone(), p.partition_dim,
                             getattr(p, "shard_rank", 0))
             for c in chunks for p in c.parameters()}
    moe = [layer for c in chunks for layer in c.layers if layer.moe is not None]
    torch.save({"tp_rank": groups.tp_rank, "tp_size": groups.tp_size, "dp_rank": groups.dp_rank,
                "cp_rank": groups.cp_rank, "ep_rank": groups.ep_rank, "etp_rank": groups.etp_rank, "grads": grads,
                "grad_norm": grad_norm,
                "expert_tokens": {layer.index: layer.moe.first_expert_tokens for layer in moe},
                "router_margin": min((layer.moe.smallest_margin for layer in moe), default=None)},
               directory / f"rank{groups.rank}.pt")


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"cpu ({torch.get_num_threads()} threads per rank)"


def load_average() -> tuple[float, float, float] | None:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        return None


def plan_as_run(plan):
    """The plan the loop runs: its pipeline sends are non-blocking and the receive of the next input is posted
    before each step's compute, which is Megatron's --overlap-p2p-communication whatever the plan asked, so
    the record says that and a validation plays the transfers as they ran."""
    if plan.pipeline_parallel_size > 1 and not plan.overlap_p2p_comm:
        return plan.model_copy(update={"overlap_p2p_comm": True})
    return plan


def train(job: Job, device: torch.device, iterations: int, seed: int, lr: float,
          dump_dir: Path | None = None, threads: int | None = None) -> RunRecord | None:
    """Run ``iterations`` steps; rank 0 returns the record, the other ranks None."""
    plan, model = job.plan, job.model
    p, v, t = plan.pipeline_parallel_size, plan.virtual_pipeline_stages, plan.tensor_parallel_size
    load = load_average()
    groups = build_groups(RankLayout.of(job), experts=model.is_moe)
    dtype = DTYPES[plan.precision]
    # TP ranks share a seed: dropouts on replicated activations must agree across them
    torch.manual_seed(seed + 100 * groups.pp_rank)
    layer_ids = chunk_layer_ids(job)
    chunks = [
        GPTChunk(job=job, groups=groups, layer_ids=layer_ids[(groups.pp_rank, c)],
                 pre_process=groups.pp_rank == 0 and c == 0, post_process=groups.pp_rank == p - 1 and c == v - 1,
                 seed=seed, dtype=dtype, device=device)
        for c in range(v)
    ]
    if dump_dir is not None:
        for c in chunks:
            for layer in c.layers:
                if layer.moe is not None:
                    layer.moe.track_margin = True
    # every rank of DP x CP holds the same parameters: Megatron reduces (and averages) gradients over them;
    # the experts' over the ranks holding the same experts (EDP)
    grads = [ChunkGradients(list(c.parameters()), dp_group=groups.dp_cp, expert_dp_group=groups.edp,
                            dp_size=plan.gradient_group_size, expert_dp_size=groups.edp_size,
                            bucket_params=plan.ddp_bucket_size, overlap=plan.overlap_grad_reduce, device=device)
             for c in chunks]
    tied = {id(w) for w in tied_word_embeddings(chunks, job)}
    optimizer = MixedPrecisionAdam([q for c in chunks for q in c.parameters()], lr, groups, device, tied)
    m = plan.num_micro_batches
    schedule = build_schedule(p, m, v, schedule_kind(plan))
    s_local = model.seq_length // plan.context_parallel_size  # this rank's two chunks of each sequence
    cp_positions = context_parallel_positions(model.seq_length, groups.cp_size, groups.cp_rank).to(device)
    activation_shape = (s_local // t if plan.sequence_parallel else s_local, plan.micro_batch_size, model.hidden_size)
    probe = LayerProbe(Clock(device))
    timers = Timers(device)
    measures = groups.tp_rank == 0 and groups.cp_rank == 0 and groups.dp_rank == 0
    warmup = 1 if iterations > 1 else 0
    times, losses = [], []
    per_replica = plan.global_batch_size // plan.data_parallel_size
    for it in range(iterations):
        batch = synthetic_batch(job, it, seed)[groups.dp_rank * per_replica:(groups.dp_rank + 1) * per_replica]
        batch = batch.to(device)
        b = plan.micro_batch_size

        def micro_batch(i: int, batch=batch) -> tuple[torch.Tensor, torch.Tensor]:
            """This rank's tokens and targets of micro-batch i, (b, s/cp) each."""
            rows = batch[i * b:(i + 1) * b]
            return rows[:, :-1][:, cp_positions], rows[:, 1:][:, cp_positions]

        probe.timing = measures and it >= warmup
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()
        start = time.perf_counter()
        loss = run_schedule(chunks=chunks, schedule=schedule, groups=groups, micro_batch=micro_batch,
                            num_micro_batches=m, activation_shape=activation_shape, dtype=dtype, device=device,
                            probe=probe if measures else None, measure_first_micro_batch=it == 0, timers=timers,
                            grads=grads)
        finish_gradients(chunks, grads, groups, timers, job)
        if dump_dir is not None and it == iterations - 1:
            norm = clip_grad_norm_(optimizer.params, groups, float("inf"), device, tied)  # measures, clips nothing
            dump_gradients(chunks, groups, dump_dir, norm)
        with timers("optimizer", barrier=True):
            optimizer.step()
            for buffer in grads:
                buffer.zero()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        timers.end_iteration()
        slowest = torch.tensor([elapsed], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        # each DP x CP rank of the last stage has the mean over as many tokens: their mean is the batch's
        is_loss_rank = groups.pp_rank == p - 1 and groups.tp_rank == 0
        total = (loss.double() if is_loss_rank else torch.zeros((), dtype=torch.float64, device=device)).reshape(1)
        dist.all_reduce(total)
        times.append(slowest.item())
        losses.append(total.item() / plan.gradient_group_size)
        timers.iterations[-1]["iteration"] = elapsed
        if measures:
            probe.resolve()
    return _record(job, groups, probe if measures else None, timers, device, seed, warmup, times, losses,
                   threads, load)


def _record(job: Job, groups: ParallelGroups, probe: LayerProbe | None, timers: Timers, device: torch.device,
            seed: int, warmup: int, times: list[float], losses: list[float], threads: int | None,
            load: tuple[float, float, float] | None) -> RunRecord | None:
    mine = {"stage": groups.pp_rank, "layers": probe.summary() if probe is not None else {},
            "timers": timers.iterations}
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (mine, peak))
    if groups.rank != 0:
        return None
    where = {i: (s, c) for (s, c), ids in chunk_layer_ids(job).items() for i in ids}
    position = {i: ids.index(i) for ids in chunk_layer_ids(job).values() for i in ids}
    layers = []
    for entry, _ in gathered:
        for index, measured in entry["layers"].items():
            stage, chunk = entry["stage"], where[index][1]  # the stage of the rank that ran the layer
            assert where[index][0] == stage, (index, where[index], stage)
            layers.append(LayerRecord(index=index, stage=stage, chunk=chunk,
                                      recompute_granularity=recomputed_layer(job.plan, position[index]), **measured))
    peaks = None
    if device.type == "cuda":
        p = job.plan.pipeline_parallel_size
        per_rank = [peak for _, peak in gathered]
        stage_of = [groups.layout.coords(r)["pp"] for r in range(len(per_rank))]
        peaks = [max(x for x, s in zip(per_rank, stage_of) if s == stage) for stage in range(p)]
    names = [*TIMER_NAMES, "iteration"]
    per_timer = {name: [[entry["timers"][i][name] for entry, _ in gathered] for i in range(len(times))]
                 for name in names}
    return RunRecord(
        model=job.model, plan=plan_as_run(job.plan), cluster=job.cluster.name, device=describe_device(device),
        world_size=dist.get_world_size(), torch_version=torch.__version__, seed=seed, warmup_iterations=warmup,
        iteration_times_s=times, losses=losses, layers=sorted(layers, key=lambda r: r.index),
        peak_allocated_bytes_per_stage=peaks, threads_per_rank=threads, load_average=load, timers=per_timer,
    )


def _jobs(args: argparse.Namespace) -> list[dict]:
    """One job from --job, or several from --batch (a JSON list of {job, out, iterations, dump_gradients})."""
    if args.batch is not None:
        entries = json.loads(args.batch.read_text())
    else:
        entries = [{"job": json.loads(args.job), "out": args.out, "iterations": args.iterations,
                    "dump_gradients": args.dump_gradients}]
    for entry in entries:
        entry["job"] = Job.model_validate(entry["job"])
        check_supported(entry["job"])
        entry.setdefault("iterations", args.iterations)
        if entry["iterations"] < 1:
            raise SimulatorError(f"iterations={entry['iterations']} must be at least 1")
    return entries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--job", help="The Job (model, cluster, plan) as JSON.")
    source.add_argument("--batch", type=Path,
                        help="A JSON list of {job, out, iterations, dump_gradients} run one after another in one launch.")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--out", type=Path, help="Where rank 0 writes the run record.")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--dump-gradients", type=Path, help="Directory for each rank's last gradients (tests).")
    parser.add_argument("--threads", type=int, default=1,
                        help="Torch threads per rank (Megatron's one; a CPU profile must have been measured with as many).")
    args = parser.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        if args.threads < 1:
            raise SimulatorError(f"--threads {args.threads} must be at least 1")
        torch.set_num_threads(args.threads)
        if torch.get_num_threads() != args.threads:
            raise SimulatorError(f"torch runs {torch.get_num_threads()} threads per rank although {args.threads} were "
                                 "asked for; check OMP_NUM_THREADS and MKL_NUM_THREADS")
        entries = _jobs(args)
        for entry in entries:
            job = entry["job"]
            if job.num_gpus != world:
                raise SimulatorError(
                    f"Invalid parallel dims: tp({job.plan.tensor_parallel_size}) * cp({job.plan.context_parallel_size})"
                    f" * pp({job.plan.pipeline_parallel_size}) * dp({job.plan.data_parallel_size}) != "
                    f"world_size({world}); start {job.num_gpus} processes")
    except (SimulatorError, ValueError, OSError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    try:
        for entry in entries:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            dump = entry.get("dump_gradients")
            record = train(entry["job"], device, entry["iterations"], args.seed, args.lr,
                           Path(dump) if dump else None, threads=args.threads)
            if record is not None and entry.get("out"):
                write_run_record(record, entry["out"])
        dist.barrier()  # no rank tears its process group down while a peer still talks to it
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
