"""The answer to a capacity question and why it is that one: the frontier, the goal's answer, what binds at it,
and where each cluster's curve of days against GPUs bends.

Options are compared at the confidence: by their days there (``days``) and the cost of booking them for that
long (``cost_usd.value``). What binds is named as one of:

- ``deadline``: a cheaper option exists, but it finishes past the deadline;
- ``budget``: a faster option exists, but it costs more than the budget;
- ``memory``: fewer GPUs of the cluster hold no plan;
- ``global batch``: the global batch caps DP x micro-batch: the plan already runs as few micro-batches per
  pipeline as it has stages, so more GPUs add only bubble;
- ``failures``: more GPUs shorten the compute but not the run, since the failures grow with the job (its ETTR
  falls faster than the compute shrinks);
- ``scaling``: more GPUs are no faster: the per-GPU work has become too small;
- ``GPU range``: the option is at an end of the counts searched; widen --gpus-min or --gpus-max;
- ``none``: nothing stops a cheaper (or faster) option but the grid itself.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# where a cluster's curve bends: ideal GPU-hours that grow by more than this share from one count to the next
# mean the per-GPU work has become too small; an ETTR below FAILURES_ETTR means failures cost a tenth of the run
SCALING_LOSS = 0.2
FAILURES_ETTR = 0.9


class Bend(BaseModel):
    """A point where a cluster's days stop falling as the GPUs grow, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: str
    gpus: int
    kind: str
    note: str


def priced_ok(options: list) -> list:
    """The options with a plan, days and a cost at the confidence."""
    return [o for o in options if o.status == "ok" and o.days is not None and o.cost_usd is not None
            and o.cost_usd.value is not None]


def mark_frontier(options: list) -> list:
    """``options`` with ``on_frontier`` set: no other option is at once no slower, no dearer and better in one."""
    ok = priced_ok(options)
    front = set()
    best_cost = float("inf")
    for o in sorted(ok, key=lambda o: (o.days, o.cost_usd.value)):
        if o.cost_usd.value < best_cost:
            front.add(id(o))
            best_cost = o.cost_usd.value
    return [o.model_copy(update=dict(on_frontier=id(o) in front)) for o in options]


def _cost(o) -> float:
    return o.cost_usd.value


def _name(o) -> str:
    return f"{o.gpus:,} GPUs of {o.cluster}"


def _batch_caps(o) -> bool:
    return o.plan is not None and o.plan.num_micro_batches <= o.plan.pipeline_parallel_size


def _batch_words(p, global_batch_size: int) -> str:
    """Why the global batch caps DP x micro-batch for plan ``p`` (one whose pipelines run no more micro-batches
    than they have stages)."""
    dp, mbs, m, stages = p.data_parallel_size, p.micro_batch_size, p.num_micro_batches, p.pipeline_parallel_size
    if stages == 1:
        return (f"DP {dp:,} x micro-batch {mbs} is the whole global batch of {global_batch_size:,}: DP can grow only "
                "as the micro-batch shrinks, and the per-GPU work with it")
    return (f"DP {dp:,} x micro-batch {mbs} leaves {m} micro-batch{'es' if m != 1 else ''} per pipeline of {stages} "
            f"stages from the global batch of {global_batch_size:,}: the bubble, (stages - 1) / micro-batches, can "
            "only grow with more DP")


def floor_binding(option, options: list, bottoms: dict[str, int]) -> tuple[str, str]:
    """What keeps ``option`` from fewer GPUs of its cluster."""
    smaller = [o for o in options if o.cluster == option.cluster and o.gpus < option.gpus and o.status == "no plan"]
    if smaller:
        o = max(smaller, key=lambda o: o.gpus)
        return "memory", f"{_name(o)} hold no plan: {o.message}"
    if option.gpus <= bottoms.get(option.cluster, 0):
        return "GPU range", (f"{_name(option)} is the fewest searched; a smaller --gpus-min may find a cheaper "
                             "option")
    return "none", "nothing but the grid keeps it from fewer GPUs"


def ceiling_binding(option, options: list, tops: dict[str, int]) -> tuple[str, str]:
    """What keeps ``option``, the fastest of its cluster, from being faster with more GPUs of it."""
    larger = [o for o in options if o.cluster == option.cluster and o.gpus > option.gpus]
    ok = priced_ok(larger)
    nxt = min(ok, key=lambda o: o.gpus) if ok else None
    capped = next((o for o in (option, nxt) if o is not None and _batch_caps(o)), None)
    if capped is not None and (nxt is not None or option.gpus >= tops.get(option.cluster, 0) or larger):
        return "global batch", (f"the global batch caps DP x micro-batch on {_name(capped)}: "
                                f"{_batch_words(capped.plan, capped.plan.global_batch_size)}")
    if nxt is not None:
        if nxt.ideal_days is not None and option.ideal_days is not None and nxt.ideal_days < option.ideal_days:
            return "failures", (f"{_name(nxt)} compute in {nxt.ideal_days:.3g} days against "
                                f"{option.ideal_days:.3g}, but their ETTR is {nxt.ettr:.0%} against "
                                f"{option.ettr:.0%}: failures grow with the job, and the run takes {nxt.days:.3g} days "
                                f"against {option.days:.3g}")
        return "scaling", (f"{_name(nxt)} are no faster ({nxt.days:.3g} days): the per-GPU work has become too small "
                           f"(MFU {nxt.mfu:.0%} against {option.mfu:.0%})")
    if larger:
        o = min(larger, key=lambda o: o.gpus)
        return "scaling", f"{_name(o)} give no run: {o.message}"
    if option.gpus >= tops.get(option.cluster, 0):
        return "GPU range", f"{_name(option)} is the most searched; a larger --gpus-max may find a faster option"
    return "none", "nothing but the grid keeps it from more GPUs"


def deadline_answer(options: list, deadline_days: float, confidence: str, bottoms: dict[str, int],
                    tops: dict[str, int]):
    """(answer, binding, note): the cheapest option that finishes by the deadline at the confidence; with none,
    no answer, and what keeps the fastest option from the deadline."""
    ok = priced_ok(options)
    meeting = [o for o in ok if o.days <= deadline_days]
    if not meeting:
        if not ok:
            return None, "memory", _no_option(options)
        fastest = min(ok, key=lambda o: (o.days, _cost(o)))
        binding, why = ceiling_binding(fastest, options, tops)
        return None, binding, (f"no option finishes by {deadline_days:g} days at {confidence}: the fastest, "
                               f"{_name(fastest)}, takes {fastest.days:.1f} days; {why}")
    answer = min(meeting, key=lambda o: (_cost(o), o.days))
    cheaper = [o for o in ok if _cost(o) < _cost(answer) and o.days > deadline_days]
    if cheaper:
        o = max(cheaper, key=_cost)
        return answer, "deadline", (f"the next cheaper option, {_name(o)} at ${_cost(o):,.0f}, takes {o.days:.1f} "
                                    f"days at {confidence}, past the {deadline_days:g}-day deadline")
    binding, why = floor_binding(answer, options, bottoms)
    return answer, binding, f"no option is cheaper: {why}"


def budget_answer(options: list, budget_usd: float, confidence: str, bottoms: dict[str, int], tops: dict[str, int]):
    """(answer, binding, note): the fastest option that costs at most the budget at the confidence."""
    ok = priced_ok(options)
    within = [o for o in ok if _cost(o) <= budget_usd]
    if not within:
        if not ok:
            return None, "memory", _no_option(options)
        cheapest = min(ok, key=lambda o: (_cost(o), o.days))
        binding, why = floor_binding(cheapest, options, bottoms)
        return None, "budget", (f"no option costs at most ${budget_usd:,.0f} at {confidence}: the cheapest, "
                                f"{_name(cheapest)}, costs ${_cost(cheapest):,.0f}; {why}")
    answer = min(within, key=lambda o: (o.days, _cost(o)))
    faster = [o for o in ok if o.days < answer.days and _cost(o) > budget_usd]
    if faster:
        o = max(faster, key=lambda o: o.days)
        return answer, "budget", (f"the next faster option, {_name(o)} in {o.days:.1f} days, costs ${_cost(o):,.0f} "
                                  f"at {confidence}, over the ${budget_usd:,.0f} budget")
    binding, why = ceiling_binding(answer, options, tops)
    return answer, binding, f"no option is faster: {why}"


def frontier_binding(options: list, tops: dict[str, int]) -> tuple[str, str]:
    ok = priced_ok(options)
    if not ok:
        return "memory", _no_option(options)
    fastest = min(ok, key=lambda o: (o.days, _cost(o)))
    binding, why = ceiling_binding(fastest, options, tops)
    return binding, f"the fastest option, {_name(fastest)}, takes {fastest.days:.1f} days; {why}"


def _no_option(options: list) -> str:
    o = options[0] if options else None
    why = f" ({_name(o)}: {o.message})" if o is not None and o.message else ""
    return f"no count searched gives a plan with expected days{why}; widen the GPU range or change the batch"


def bends(options: list, global_batch_size: int) -> list[Bend]:
    """Per cluster, the first count where the global batch caps DP, where the per-GPU work becomes too small
    (the failure-free GPU-hours grow by more than SCALING_LOSS over the count before), and where failures cost
    more than a tenth of the run."""
    out: list[Bend] = []
    clusters = list(dict.fromkeys(o.cluster for o in options))
    for cluster in clusters:
        curve = sorted((o for o in options if o.cluster == cluster and o.status == "ok" and o.ideal_days),
                       key=lambda o: o.gpus)
        found: dict[str, Bend] = {}
        for before, o in zip([None] + curve, curve):
            if "global batch" not in found and _batch_caps(o):
                found["global batch"] = Bend(cluster=cluster, gpus=o.gpus, kind="global batch",
                                             note=_batch_words(o.plan, global_batch_size))
            if before is not None and "per-GPU work" not in found:
                growth = o.gpus * o.ideal_days / (before.gpus * before.ideal_days) - 1
                if growth > SCALING_LOSS:
                    found["per-GPU work"] = Bend(cluster=cluster, gpus=o.gpus, kind="per-GPU work", note=(
                        f"from {before.gpus:,} to {o.gpus:,} GPUs the failure-free GPU-hours grow {growth:.0%} "
                        f"(MFU {before.mfu:.0%} to {o.mfu:.0%}): the per-GPU work becomes too small"))
            if "failures" not in found and o.ettr is not None and o.ettr < FAILURES_ETTR:
                found["failures"] = Bend(cluster=cluster, gpus=o.gpus, kind="failures", note=(
                    f"ETTR {o.ettr:.0%}: failures, checkpoints and restarts cost more than a tenth of the run"))
        out += sorted(found.values(), key=lambda b: b.gpus)
    return out
