"""How Megatron splits a model's transformer layers over pipeline stages and their virtual chunks.

Even by default; with ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``
the first and last stages take the layers given and the others share the rest evenly; with
``--account-for-embedding-in-pipeline-split`` (``...-loss-...``) the input embedding (the loss) counts
as one layer of the first (last) chunk, which then builds one transformer layer fewer
(``get_num_layers_to_build`` in Megatron-Core). Interleaving splits each stage's layers evenly over its
chunks. Every rule Megatron asserts raises a ``ValueError`` whose message names the values and the fix.
"""

from __future__ import annotations


def _divisors(n: int) -> str:
    d = [x for x in range(1, n + 1) if n % x == 0]
    return ", ".join(map(str, d[:-1])) + f" or {d[-1]}" if len(d) > 1 else str(d[0])


def chunk_layers(num_layers: int, p: int, v: int = 1, *, first: int | None = None, last: int | None = None,
                 account_for_embedding: bool = False, account_for_loss: bool = False,
                 explicit: tuple[int, ...] | None = None) -> tuple[tuple[int, ...], ...]:
    """Transformer layers of chunk c of stage s, as ``result[s][c]`` (chunk c of stage s is model chunk c p + s)."""
    L = num_layers
    uneven = first is not None or last is not None
    accounted = account_for_embedding or account_for_loss
    if explicit is not None:
        if uneven or accounted:
            raise ValueError("pipeline_layer_split cannot be combined with the first/last-stage layer counts or the "
                             "embedding/loss accounting; use one way of stating the split")
        if len(explicit) != p or sum(explicit) != L or min(explicit) < 1:
            raise ValueError(f"pipeline_layer_split={list(explicit)} must give {p} stages of at least one layer "
                             f"summing to num_layers={L}")
        per_stage = list(explicit)
    elif uneven:
        if accounted:
            raise ValueError("the first/last-stage layer counts cannot be combined with accounting for the embedding "
                             "or the loss in the split (Megatron's rule); use one or the other")
        if p == 1:
            raise ValueError("first/last pipeline stage layer counts need pipeline_parallel_size > 1; drop them or "
                             "add pipeline stages")
        rest, others = L, p
        for n in (first, last):
            if n is not None:
                rest, others = rest - n, others - 1
        if rest < 0 or (others == 0 and rest != 0) or (others > 0 and (rest % others or rest // others < 1)):
            raise ValueError(
                f"with {first if first is not None else 'no'} layers on the first stage and "
                f"{last if last is not None else 'no'} on the last, the other {others} stages cannot share the "
                f"remaining {rest} of num_layers={L} evenly; change the first/last counts")
        middle = rest // others if others else 0
        per_stage = [middle] * p
        if first is not None:
            per_stage[0] = first
        if last is not None:
            per_stage[-1] = last
        if min(per_stage) < 1:
            raise ValueError(f"every pipeline stage needs at least one layer (got {per_stage}); change the "
                             "first/last-stage layer counts")
    else:
        total = L + account_for_embedding + account_for_loss
        if total % (p * v):
            what = f"pipeline_parallel_size={p}" + (f" x virtual_pipeline_stages={v} = {p * v}" if v > 1 else "")
            counted = " (with the embedding and loss counted as layers)" if accounted else ""
            raise ValueError(f"{what} does not divide num_layers={L}{counted}; use a divisor of {total} "
                             f"({_divisors(total)}), state first/last-stage layer counts, or account for the "
                             "embedding and loss in the split")
        per_chunk = total // (p * v)
        chunks = [[per_chunk] * v for _ in range(p)]
        if account_for_embedding:
            chunks[0][0] -= 1
        if account_for_loss:
            chunks[-1][-1] -= 1
        if any(n < 1 for stage in chunks for n in stage):
            raise ValueError(f"a model chunk would hold no transformer layer ({chunks}); use fewer pipeline stages or "
                             "virtual stages")
        return tuple(tuple(stage) for stage in chunks)
    if v > 1 and any(n % v for n in per_stage):
        raise ValueError(f"virtual_pipeline_stages={v} must divide every stage's layers {per_stage}; change the split "
                         "or the virtual stages")
    return tuple((n // v,) * v for n in per_stage)
