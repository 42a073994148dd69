"""The layer timeline's bookkeeping: what it adds up must be what the streams did."""

from hypothesis import given
from hypothesis import strategies as st

from simulator.graph.ops import Stream
from simulator.schedule.timing import OpInterval, _overlap_s

_gaps = st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.0, 5.0)), max_size=12)


def _stream(stream: Stream, gaps_and_lengths) -> list[OpInterval]:
    """Intervals one after another on one stream, as play lays them: each starts when (or after) the last ends."""
    out, t = [], 0.0
    for i, (gap, length) in enumerate(gaps_and_lengths):
        start = t + gap
        t = start + length
        out.append(OpInterval(f"{stream.value}{i}", stream, start, t))
    return out


@given(_gaps, _gaps)
def test_overlap_is_every_pair_of_intervals_both_streams_ran_at_once(compute, comm):
    """The single pass adds the same pairs, in the same order, as the double loop over both streams."""
    intervals = sorted(_stream(Stream.compute, compute) + _stream(Stream.tp_comm, comm), key=lambda iv: iv.start_s)
    expected = 0.0
    for a in (iv for iv in intervals if iv.stream is Stream.tp_comm):
        for b in (iv for iv in intervals if iv.stream is Stream.compute):
            if b.start_s < a.end_s and a.start_s < b.end_s:
                expected += min(a.end_s, b.end_s) - max(a.start_s, b.start_s)
    assert _overlap_s(intervals) == expected
