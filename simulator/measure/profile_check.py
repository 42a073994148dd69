"""A measured profile against its own points: each point it was fitted to, given back through the cost
model (the same functions a plan is costed with, the link's cap included), must come back within
a factor of two, or ``simulator calibrate`` refuses to write the profile.

A fit's residuals alone can miss what the cost model adds on top of the fitted form (the link
cap of the cluster, the routing of a collective over its nodes, the latency split into steps),
which is how a profile with a 30,000 GB/s link once passed with a "16.8% rms" fit.
"""

from __future__ import annotations

from simulator.cost.profile import HardwareProfile
from simulator.spec.errors import ProfileError
from simulator.spec.hardware import GpuSpec

REFUSE_FACTOR = 2.0  # a profile whose model gives one of its own points back more than 2x off is not written


def _cluster_for(gpu: GpuSpec):
    """The cluster the profile's collectives are checked on: local-cpu for a CPU, else one whose GPU this is."""
    from simulator.spec.hardware import cluster_names, load_cluster

    for name in (["local-cpu"] if gpu.name == "CPU" else cluster_names()):
        cluster = load_cluster(name)
        if cluster.gpu.name.lower() == gpu.name.lower():
            return cluster
    return None


def check_profile(profile: HardwareProfile, raw: dict, gpu: GpuSpec) -> list[str]:
    """Give each point the profile was fitted to back through the cost model; raise ProfileError naming the
    block when one comes back more than ``REFUSE_FACTOR`` off. Returns notes on what was not checked."""
    from simulator.cost import CostModel, Group
    from simulator.graph.layers import CollectiveKind, GemmShape, Op, OpKind
    from simulator.measure.fitting import _dtype, _mode
    from simulator.spec.plan import Precision

    cluster = _cluster_for(gpu)
    if cluster is None:
        return [f"no cluster spec has GPU {gpu.name!r}, so the profile was not checked against its points"]
    dtype = _dtype(raw["gemm"][0]["dtype"])
    precision = {"fp32": Precision.fp32, "bf16": Precision.bf16, "fp16": Precision.fp16}.get(dtype)
    if precision is None:
        return [f"GEMMs measured in {dtype}, which no plan precision uses, so the profile was not checked"]
    cost = CostModel(cluster, profile, precision)
    checks: list[tuple[str, str, float, float]] = []  # (block, point, measured, predicted)
    for r in raw["gemm"]:
        op = Op("gemm", OpKind.batched_gemm if r["batch"] > 1 else OpKind.gemm,
                gemm=GemmShape(r["m"], r["n"], r["k"], r["batch"]))
        checks.append(("gemm", f"{r['m']} x {r['n']} x {r['k']} x {r['batch']} GEMM", r["time_s"], cost.op_time_s(op)))
    for r in raw["elementwise"]:
        op = Op(r["kernel"], OpKind.elementwise, bytes_moved=r["bytes_moved"], kernel=r["kernel"])
        checks.append(("elementwise", f"{r['kernel']} of {r['bytes_moved']:,} B", r["time_s"], cost.op_time_s(op)))
    cpu = raw["device"]["kind"] == "cpu"
    link = profile.collectives.network if cpu else profile.collectives.nvlink
    if link.fits and link.fits[0].note.split(" ", 1)[0] in ("gloo", "nccl"):  # measured here, not published
        rows = raw.get("collectives", [])
        block = "collectives.network" if cpu else "collectives.nvlink"
        mode = "in_loop" if sum(1 for r in rows if r["kind"] == "all_reduce" and _mode(r) == "in_loop") >= 3 \
            else "isolated"
        for r in rows:
            if r["kind"] == "all_reduce" and _mode(r) == mode:
                t = cost.collective_time_s(CollectiveKind.all_reduce, r["bytes"], Group(int(r["group_size"]), 1))
                checks.append((block, f"{r['bytes']:,} B all-reduce", r["time_s"], t))
            elif r["kind"] == "send_recv":
                t = cost.p2p_time_s(r["bytes"], inter_node=cpu)
                checks.append((block, f"{r['bytes']:,} B send/recv", r["time_s"], t))
    worst = max(checks, key=lambda c: max(c[3] / c[2], c[2] / c[3]), default=None)
    if worst is not None:
        block, what, measured, predicted = worst
        factor = max(predicted / measured, measured / predicted)
        if factor > REFUSE_FACTOR:
            raise ProfileError(
                f"profile block {block} gives the measured {what} back {factor:.1f}x off through the cost model "
                f"({predicted * 1e3:.3g} ms predicted, {measured * 1e3:.3g} ms measured), so the profile was not "
                f"written; measure again on a quiet machine{_load(raw)}"
                + (", or with more repetitions (drop --quick)" if raw.get("settings", {}).get("quick") else ""))
    return []


def _load(raw: dict) -> str:
    load, cores = raw["device"].get("load_average"), raw["device"].get("cpu_cores")
    return f" (the load average was {load[0]:.2f}" + (f" on {cores} cores" if cores else "") + " while measuring)" \
        if load else ""
