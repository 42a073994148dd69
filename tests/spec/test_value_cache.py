"""Caches of results built from specs: keyed by plain values, least recently used dropped first, and a
copy of a profile with one number changed never answers for the original."""

from simulator.cost.profile import default_profile
from simulator.spec.value_cache import ValueCache


def test_a_result_is_built_once_and_the_least_recently_used_goes_first():
    built = []
    cache = ValueCache(maxsize=2)

    def get(key):
        return cache.get(key, lambda: built.append(key) or key.upper())

    assert [get("a"), get("b"), get("a")] == ["A", "B", "A"]
    assert built == ["a", "b"]
    get("c")  # "b" was used least recently
    assert len(cache) == 2
    get("a"), get("b")
    assert built == ["a", "b", "c", "b"]
    cache.cache_clear()
    assert len(cache) == 0


def test_a_changed_copy_of_a_profile_has_its_own_key_and_an_equal_one_the_same():
    profile = default_profile("A100-SXM4-80GB")
    path, value, low, high = profile.unpinned()[0]
    changed = profile.with_value(path, high if value != high else low)
    assert profile.value_key() != changed.value_key()
    assert hash(profile) != hash(changed) or profile != changed
    renamed = profile.model_copy(update={"name": profile.name + "-copy"})
    assert renamed.value_key() != profile.value_key()
    assert profile.model_copy().value_key() == profile.value_key()


def test_a_profile_used_still_equals_an_unused_copy_of_itself():
    """Equality and hash agree for as long as a profile lives (caches keyed by profiles rely on it): looking
    up a measured GEMM leaves the profile equal to a fresh load of the same file."""
    from simulator.measure.validate import _load_profile
    from simulator.outputs.figure_data import CPU_VALIDATION

    path = str(CPU_VALIDATION / "cpu-profile.json")
    used, fresh = _load_profile(path), _load_profile(path)
    m, n, k, batch, dtype_bytes, _ = used.gemm.measured[0]
    assert used.gemm.measured_time_s(m, n, k, batch, dtype_bytes) is not None
    assert used == fresh and hash(used) == hash(fresh)


def test_every_spec_an_estimate_uses_still_equals_a_fresh_load_of_itself():
    """Whatever an estimate caches on the way, the model, cluster, plan and profile it read compare and hash as
    fresh loads do: caches keyed by specs need equality and hash to agree for as long as the specs live."""
    from simulator.bench import gpt3_job
    from simulator.cost.profile import load_profile
    from simulator.estimator.prediction import estimate

    used, fresh = gpt3_job(), gpt3_job()
    profile, fresh_profile = load_profile("a100-sxm4-80gb-published"), load_profile("a100-sxm4-80gb-published")
    estimate(used, profile)
    for a, b in ((used.model, fresh.model), (used.cluster, fresh.cluster), (used.plan, fresh.plan),
                 (profile, fresh_profile)):
        assert a == b and hash(a) == hash(b), type(a).__name__
