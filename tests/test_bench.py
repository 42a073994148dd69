"""`python -m simulator.bench`'s helpers: its cold runs must start from empty caches wherever modules live."""

from simulator.bench import clear_caches
from simulator.schedule.stage_work import stage_kinds


def test_clear_caches_empties_the_memoised_functions_of_every_subpackage():
    stage_kinds(((1,), (1,)))
    assert stage_kinds.cache_info().currsize >= 1
    clear_caches()
    assert stage_kinds.cache_info().currsize == 0
