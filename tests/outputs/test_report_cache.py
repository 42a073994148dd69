"""The report's cache recomputes a step exactly when its key changes: its parameters, a step it reads,
or a damaged entry; figures likewise by their data."""

import json

from simulator.outputs.report_cache import ReportCache, Step


def _steps(calls, scale=1):
    def base(_):
        calls.append("base")
        return {"value": 2 * scale, "order": {"b": 1, "a": 2}}

    def derived(deps):
        calls.append("derived")
        return {"value": deps["base"]["value"] + 1}

    return [Step("base", base, params=[scale]), Step("derived", derived, deps=("base",))]


def test_unchanged_steps_are_read_back_as_computed(tmp_path):
    calls = []
    first = ReportCache(tmp_path).run(_steps(calls))
    again = ReportCache(tmp_path)
    second = again.run(_steps(calls))
    assert calls == ["base", "derived"] and again.misses == [] and second == first
    assert list(second["base"]["order"]) == ["b", "a"]  # the order of keys survives the round trip


def test_a_changed_parameter_recomputes_the_step_and_what_reads_it(tmp_path):
    calls = []
    ReportCache(tmp_path).run(_steps(calls))
    cache = ReportCache(tmp_path)
    result = cache.run(_steps(calls, scale=5))
    assert calls == ["base", "derived", "base", "derived"] and result["derived"]["value"] == 11
    assert cache.hits == []


def test_a_damaged_entry_is_recomputed_and_no_folder_means_no_cache(tmp_path):
    calls = []
    ReportCache(tmp_path).run(_steps(calls))
    (tmp_path / "base.json").write_text("{not json")
    cache = ReportCache(tmp_path)
    cache.run(_steps(calls))
    assert cache.misses == ["base"] and cache.hits == ["derived"]
    uncached = ReportCache(None)
    uncached.run(_steps(calls))
    uncached.run(_steps(calls))
    assert uncached.hits == []


def test_a_figure_is_redrawn_only_when_its_data_changes(tmp_path):
    data = {"kind": "stage-memory", "title": "t", "plan": "p", "parts": {"weights": [1.0, 2.0]},
            "peak_gib": [1.0, 2.0], "capacity_gib": 80.0}
    cache = ReportCache(tmp_path / "cache")
    first = cache.figure("s", "stage-memory", data, tmp_path / "a.png")
    second = cache.figure("s", "stage-memory", json.loads(json.dumps(data)), tmp_path / "b.png")
    assert cache.misses == ["figure s"] and cache.hits == ["figure s"] and first == second
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    cache.figure("s", "stage-memory", {**data, "capacity_gib": 40.0}, tmp_path / "c.png")
    assert cache.misses == ["figure s", "figure s"]


def _fill_midway(monkeypatch):
    """Every write of a file runs out of space halfway: the bytes before the failure reach the disk."""
    import errno
    import os

    def full(*_):
        return OSError(errno.ENOSPC, "No space left on device")

    real_fdopen, real_sendfile = os.fdopen, os.sendfile

    class HalfFile:
        def __init__(self, f):
            self._f = f

        def write(self, data):
            self._f.write(bytes(data)[: len(data) // 2])
            self._f.flush()
            raise full()

        def __getattr__(self, name):
            return getattr(self._f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()

    def fdopen(fd, mode="r", *args, **kwargs):
        f = real_fdopen(fd, mode, *args, **kwargs)
        return HalfFile(f) if "w" in mode else f

    def sendfile(out_fd, in_fd, offset, count):  # what shutil.copyfile writes with on Linux
        real_sendfile(out_fd, in_fd, offset, max(1, count // 2))
        raise full()

    monkeypatch.setattr(os, "fdopen", fdopen)
    monkeypatch.setattr(os, "sendfile", sendfile)


def test_a_cached_figure_copied_to_a_full_disk_leaves_no_cut_off_file(tmp_path, monkeypatch):
    import pytest

    from simulator.spec.errors import OutputError

    data = {"kind": "stage-memory", "title": "t", "plan": "p", "parts": {"weights": [1.0, 2.0]},
            "peak_gib": [1.0, 2.0], "capacity_gib": 80.0}
    cache = ReportCache(tmp_path / "cache")
    cache.figure("s", "stage-memory", data, tmp_path / "a.png")
    out = tmp_path / "out"
    out.mkdir()
    (out / "b.png").write_bytes(b"the figure of the last report")
    with monkeypatch.context() as m:
        _fill_midway(m)
        with pytest.raises(OutputError, match=r"b\.png.*No space left on device; free some space"):
            cache.figure("s", "stage-memory", data, out / "b.png")
    # the figure that was there stays whole, and no temporary file is left beside it
    assert [p.name for p in out.iterdir()] == ["b.png"]
    assert (out / "b.png").read_bytes() == b"the figure of the last report"
    cache.figure("s", "stage-memory", data, out / "b.png")
    assert (out / "b.png").read_bytes() == (tmp_path / "a.png").read_bytes()
