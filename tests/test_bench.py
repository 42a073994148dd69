"""`python -m simulator.bench`'s helpers: its cold runs must start from empty caches wherever modules live."""

from simulator.bench import clear_caches
from simulator.schedule.stage_work import stage_kinds


def test_clear_caches_empties_the_memoised_functions_of_every_subpackage():
    stage_kinds(((1,), (1,)))
    assert stage_kinds.cache_info().currsize >= 1
    clear_caches()
    assert stage_kinds.cache_info().currsize == 0


def test_clear_caches_empties_the_value_keyed_caches_too():
    """The cost-model and network caches are keyed by the specs' values, not functools.lru_cache."""
    from simulator.bench import gpt3_job
    from simulator.cost.collectives import _NETWORKS
    from simulator.schedule.timing import _COST_MODELS, cost_model_for

    cost_model_for(gpt3_job(), None)
    assert len(_COST_MODELS) >= 1 and len(_NETWORKS) >= 1
    clear_caches()
    assert len(_COST_MODELS) == 0 and len(_NETWORKS) == 0


def test_an_unknown_benchmark_is_refused_in_one_sentence(capsys):
    """A misspelt name used to run nothing and exit 0; it now names the value and the ones it takes."""
    from simulator.bench import BENCHES, run

    for argv in (["serach"], ["log", "extra"]):
        assert run(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and all(name in err[0] for name in BENCHES)
