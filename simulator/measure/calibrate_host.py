"""The host block of a measured profile, from the tiny-op loops of ``calibration.microbench.host``."""

from __future__ import annotations

from simulator.cost.profile import HardwareProfile, HostParams


def _host_rows(raw: dict) -> dict[tuple[str, bool], float]:
    return {(r["what"], bool(r.get("synchronize"))): float(r["time_s"]) for r in raw.get("host", [])}


def fit_host(raw: dict, base: HardwareProfile | None) -> tuple[HostParams | None, list[str]]:
    """The host block from the tiny-op loops of ``calibration.microbench.host``.

    On a synchronous device (a CPU) the kernel benchmarks time each op through the same call, so
    their fitted launch overhead already holds the bare dispatch: the host terms are what a training
    step adds to it (autograd recording, the autograd engine), and a collective's or an exchange's
    host time is inside its measured time. On CUDA the host runs ahead, so each term is the whole
    time to issue, timed without a synchronize.
    """
    rows = _host_rows(raw)
    needed = ("bare_op", "forward_op", "backward_op", "micro_batch", "optimizer_step_12_tensors")
    if any((w, False) not in rows for w in needed):
        if base is not None and base.host is not None:
            return base.host, [f"host costs not measured: taken from profile {base.name!r}"]
        return None, ["host costs not measured: the profile has no host block (the device never waits for the host)"]
    cpu = raw["device"]["kind"] == "cpu"
    bare, fwd, bwd = rows[("bare_op", False)], rows[("forward_op", False)], rows[("backward_op", False)]
    loop = "a loop of 64-element ops"
    adam = rows[("optimizer_step_12_tensors", False)]
    iteration_src = (f"torch.optim.Adam's step over one GPT layer's 12 small tensors ({adam * 1e6:.0f} us), timed in a "
                     "loop; a model has more tensors, hence the range up to 10x")
    if cpu:
        values = dict(op_s=max(fwd - bare, 0.0), backward_op_s=max(bwd - bare, 0.0), collective_s=0.0,
                      pipeline_exchange_s=0.0, micro_batch_s=rows[("micro_batch", False)], iteration_s=adam)
        sources = {
            "op_s": f"{loop} with autograd recording ({fwd * 1e6:.1f} us) less the bare op ({bare * 1e6:.1f} us), which "
                    "the kernels' fitted launch overhead already holds on a synchronous device",
            "backward_op_s": f"the autograd engine replaying {loop} ({bwd * 1e6:.1f} us per op) less the bare op",
            "collective_s": "0: on a synchronous device the call's host time is inside the measured collective times",
            "pipeline_exchange_s": "0: on a synchronous device the exchange's host time is inside the measured "
                                   "send/recv times",
            "micro_batch_s": "a micro-batch's data as the reference loop takes it (slice, split, transpose, receive "
                             "buffer), timed in a loop",
            "iteration_s": iteration_src,
        }
    else:
        coll = raw.get("collective_host") or {}
        base_host = base.host if base is not None else None
        collective = coll.get("collective_issue_s")
        values = dict(op_s=fwd, backward_op_s=bwd,
                      collective_s=collective if collective is not None else (base_host.collective_s if base_host else 0.0),
                      pipeline_exchange_s=base_host.pipeline_exchange_s if base_host else 0.0,
                      micro_batch_s=rows[("micro_batch", False)], iteration_s=adam)
        sources = {
            "op_s": f"{loop} with autograd recording, issued without a synchronize "
                    f"(with one after each op: {rows.get(('forward_op', True), float('nan')) * 1e6:.1f} us)",
            "backward_op_s": f"the autograd engine replaying {loop}, per op",
            "collective_s": (f"a 64-element NCCL all-reduce over {coll.get('group_size', 'the')} GPU(s) issued in a "
                             "loop without a synchronize "
                             f"(with one after each: {coll['collective_synchronized_s'] * 1e6:.1f} us)")
            if collective is not None else (f"not measured (one GPU): from {base.name!r}" if base_host else
                                            "not measured (one GPU) and no published value: 0"),
            "pipeline_exchange_s": f"not measured: from {base.name!r}" if base_host else "not measured: 0",
            "micro_batch_s": "a micro-batch's data as the reference loop takes it, issued in a loop",
            "iteration_s": iteration_src,
        }
    return HostParams(**values, sources=sources, ranges={"iteration_s": (adam, 10 * adam)}), []
