"""HardwareProfile files: shipped profiles load, round-trip, and every way a file can be wrong is one ProfileError."""

import json

import pytest

from calibration.build_published_profiles import build_profile
from calibration.published_data import GPUS
from simulator.cost.profile import HardwareProfile, default_profile, load_profile, profile_names, save_profile
from simulator.spec.errors import ProfileError
from simulator.spec.hardware import load_gpu
from tests.close import assert_close


@pytest.fixture(scope="module")
def a100() -> HardwareProfile:
    return load_profile("a100-sxm4-80gb-published")


def test_every_published_gpu_has_a_profile_naming_its_gpu():
    for gpu in GPUS:
        profile = default_profile(gpu)
        assert profile.source == "published"
        assert load_gpu(profile.gpu).name == gpu
        assert profile.name in profile_names()


def test_shipped_profiles_are_what_the_build_script_fits():
    # A stale JSON (the data or the fit changed, the files were not rebuilt) fails here. The fits stop where
    # least squares stops improving, and a threaded BLAS sums in another order from run to run: refits agree
    # to about 1e-8 of each value, so they are compared to 1e-6, far below any change of the data or the model.
    for gpu in GPUS:
        assert_close(build_profile(gpu), default_profile(gpu), rel=1e-6,
                     hint="rebuild with python -m calibration.build_published_profiles")


def test_round_trip(tmp_path, a100):
    path = save_profile(a100, tmp_path / "sub" / "copy.json")
    assert load_profile(path) == a100
    assert load_profile(str(path)) == a100
    assert not list(path.parent.glob(".*.tmp")), "the temp file must be gone after the atomic replace"


def test_profiles_hash_so_cost_models_can_be_cached(a100):
    assert hash(a100) == hash(load_profile("a100-sxm4-80gb-published"))


def test_fitted_blocks_keep_points_and_residuals(a100):
    fit = a100.collectives.nvlink.fits[0]
    assert len(fit.points) == 20 and len(fit.residuals) == 20
    assert all(name in a100.gemm.sources for name in ("max_efficiency", "k_half", "tile_m"))


def test_corrupt_json_is_a_profile_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile(bad)


def _load_changed(tmp_path, profile, change):
    """Load ``profile`` written back after ``change`` edited its JSON data."""
    data = json.loads(profile.model_dump_json())
    change(data)
    path = tmp_path / "changed.json"
    path.write_text(json.dumps(data))
    return load_profile(path)


def test_wrong_schema_version_is_a_profile_error(tmp_path, a100):
    with pytest.raises(ProfileError, match="schema_version=2"):
        _load_changed(tmp_path, a100, lambda d: d.update(schema_version=2))


def test_missing_field_is_a_profile_error(tmp_path, a100):
    with pytest.raises(ProfileError, match="max_efficiency"):
        _load_changed(tmp_path, a100, lambda d: d["gemm"].pop("max_efficiency"))


def test_parameter_without_source_is_rejected(tmp_path, a100):
    with pytest.raises(ProfileError, match="sources"):
        _load_changed(tmp_path, a100, lambda d: d["elementwise"]["sources"].pop("achieved_fraction"))


def test_a_ramp_curve_out_of_order_is_a_profile_error(tmp_path, a100):
    with pytest.raises(ProfileError, match="ramp_curve sizes must increase"):
        _load_changed(tmp_path, a100, lambda d: d["collectives"]["nvlink"]["ramp_curve"].reverse())


@pytest.mark.parametrize("change, phrase", [
    (lambda d: d["collectives"]["nvlink"]["all_reduce_curves"]["8"].reverse(), "all_reduce_curves\\[8\\] sizes must"),
    (lambda d: d["collectives"]["nvlink"]["all_reduce_curves"].update({"1": [[1, 1e-5], [2, 2e-5]]}), "for 1 ranks"),
    (lambda d: d["collectives"]["nvlink"]["all_reduce_curves"]["2"][0].__setitem__(1, -1.0), "times from 0"),
])
def test_a_measured_all_reduce_curve_that_is_not_one_is_a_profile_error(tmp_path, a100, change, phrase):
    with pytest.raises(ProfileError, match=phrase):
        _load_changed(tmp_path, a100, change)


def _set(path: str, value):
    def change(data):
        *parents, last = path.split(".")
        node = data
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[int(last) if isinstance(node, list) else last] = value
    return change


@pytest.mark.parametrize("path, value, phrase", [
    # a range reaches past what its value may be: the band would move the value there
    ("host.ranges.collective_s", [0.0, 1e308], "host.ranges.collective_s reaches 1e+308"),
    ("host.ranges.op_s", [-1.0, 6e-5], "host.ranges.op_s reaches -1"),
    ("gemm.ranges.k_half", [64.0, 1e20], "gemm.ranges.k_half reaches 1e+20"),
    ("attention.ranges.seq_half", [-5.0, 274.0], "attention.ranges.seq_half reaches -5"),
    ("ranges.overlap_compute_slowdown", [0.07, 1.5], "ranges.overlap_compute_slowdown reaches 1.5"),
    ("collectives.nvlink.ranges.p2p_bandwidth_gbps", [0.0, 264.0], "p2p_bandwidth_gbps reaches 0"),
    # a range that leaves its value out
    ("gemm.ranges.k_half", [200.0, 256.0], "lies outside its range [200.0, 256.0]"),
    # a value the range no longer limits is bounded itself
    ("host.collective_s", 1e308, "host.collective_s"),
    # a fit point is a measurement: finite, a bandwidth or a time positive
    ("elementwise.fits.0.points.0.0", -3000.0, "achieved_gbps=-3000"),
    ("collectives.nvlink.fits.0.points.0.0", 1e308, "size_bytes=1e+308"),
    ("collectives.nvlink.fits.0.points.0.1", 0.0, "time_s=0"),
    ("attention.fits.0.points.0.5", -1e-3, "time_s=-0.001"),
    ("gemm.fits.0.points.0.0", -1024.0, "m=-1024"),
])
def test_a_profiles_ranges_and_fit_points_are_checked_like_its_values(tmp_path, a100, path, value, phrase):
    with pytest.raises(ProfileError) as refused:
        _load_changed(tmp_path, a100, _set(path, value))
    message = str(refused.value)
    assert phrase in message and "\n" not in message, message


def test_unknown_name_is_a_profile_error():
    with pytest.raises(ProfileError, match="unknown profile 'v100-published'"):
        load_profile("v100-published")
    with pytest.raises(ProfileError, match="no published profile"):
        default_profile("V100-SXM2-32GB")
