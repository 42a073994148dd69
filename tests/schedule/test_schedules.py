"""Schedules are pure data: check them directly (Narayanan et al. 2021; Megatron-LM's schedules.py)."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.schedule.schedules import (
    Phase,
    bubble_fraction,
    gpipe,
    interleaved_one_f_one_b,
    one_f_one_b,
    peak_in_flight,
    warmup_forwards,
)

pipelines = st.tuples(st.integers(1, 8), st.integers(1, 6), st.integers(1, 4)).map(
    lambda t: (t[0], t[0] * t[1], t[2] if t[0] > 1 else 1)
)


@given(pipelines)
@settings(max_examples=60, deadline=None)
def test_every_micro_batch_chunk_runs_forward_then_backward_once(pmv):
    p, m, v = pmv
    for steps in interleaved_one_f_one_b(p, m, v):
        counts = Counter((s.micro_batch, s.chunk, s.phase) for s in steps)
        assert set(counts.values()) == {1}
        assert len(counts) == 2 * m * v
        seen_forward = set()
        for s in steps:
            if s.phase is Phase.forward:
                seen_forward.add((s.micro_batch, s.chunk))
            else:
                assert (s.micro_batch, s.chunk) in seen_forward


@pytest.mark.parametrize("p,m", [(4, 8), (8, 8), (8, 3), (1, 4)])
def test_one_f_one_b_warmup_is_megatrons(p, m):
    for stage, steps in enumerate(one_f_one_b(p, m)):
        forwards_before_first_backward = next(i for i, s in enumerate(steps) if s.phase is Phase.backward)
        assert forwards_before_first_backward == min(p - stage, m)  # warm-up plus the first steady forward
        assert warmup_forwards(stage, p, m) == min(p - stage - 1, m)
        assert peak_in_flight(steps) == min(p - stage, m)


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (8, 64, 3), (2, 4, 4)])
def test_interleaved_first_stage_holds_the_paper_factor(p, m, v):
    """Korthikanti 4.2.3: the first stage holds L * (1 + (p-1)/(p*v)) layers of activations."""
    chunks = peak_in_flight(interleaved_one_f_one_b(p, m, v)[0])
    layers_per_chunk = 1  # in units of L/(p*v)
    assert chunks * layers_per_chunk == p * v + p - 1


def test_gpipe_holds_every_micro_batch():
    assert [peak_in_flight(s) for s in gpipe(4, 6)] == [6] * 4


def test_closed_form_bubble():
    assert bubble_fraction(8, 64, 3) == pytest.approx(7 / 192)
    assert bubble_fraction(1, 5) == 0
