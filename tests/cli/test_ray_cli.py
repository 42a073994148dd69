"""`sweep --ray-address` and `python -m simulator.bench` against the Ray clusters a user has: a correct answer or
one sentence with exit code 2, never a traceback. Ray itself is replaced by a stand-in that runs each point
in this process and whose ``init`` raises what the real one raises, so no cluster is started here."""

from __future__ import annotations

import sys
import types

import pytest
from click.testing import CliRunner

from simulator import bench
from simulator.cli import cli
from simulator.spec.errors import ConfigError

SPEC = "models: [gpt3-125m]\ngpus: [8]\nglobal_batch_sizes: [8]\n"
# what Ray 2.60's ray.init raises: joining a cluster with token authentication without the token (after
# logging "Unauthenticated: ... InvalidAuthToken" for 20 s), and passing num_cpus to a cluster already running
AUTH_FAILURE = ConnectionError("Failed to connect to Ray cluster at 192.0.2.2:6391")
EXISTING = ValueError("When connecting to an existing cluster, num_cpus and num_gpus must not be provided.")


class FakeRay(types.ModuleType):
    """``ray`` as sweep uses it; ``running``: a cluster is already up on this machine (the real ``ray.init()``
    without an address joins it); ``refuse``: what joining an address raises."""

    def __init__(self, running: bool = False, refuse: BaseException | None = None):
        super().__init__("ray")
        self.running, self.refuse, self.inits, self.up = running, refuse, [], False

    def init(self, address=None, **kwargs):
        self.inits.append({"address": address, **kwargs})
        if address not in (None, "local") and self.refuse is not None:
            raise self.refuse
        if address is None and self.running and "num_cpus" in kwargs:
            raise EXISTING
        self.up = True

    def is_initialized(self):
        return self.up

    def shutdown(self):
        self.up = False

    def remote(self, fn):
        return types.SimpleNamespace(remote=lambda *args: fn(*args))

    def get(self, ref):
        return ref


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(SPEC)
    return path


def _sweep(spec, out, address, monkeypatch, ray, env=None):
    monkeypatch.setitem(sys.modules, "ray", ray)
    return CliRunner().invoke(cli, ["sweep", str(spec), "--out", str(out), "--ray-address", address, "--workers", "1"],
                              env=env)


def test_local_ray_starts_its_own_instance_beside_a_running_cluster(tmp_path, spec, monkeypatch):
    ray = FakeRay(running=True)
    res = _sweep(spec, tmp_path / "out", "local", monkeypatch, ray)
    assert res.exit_code == 0, res.output
    assert ray.inits == [{"address": "local", "num_cpus": 1, "include_dashboard": False, "log_to_driver": False}]
    assert "1 points, 1 with a plan" in res.output and not ray.up  # shut down after the sweep


@pytest.mark.parametrize("mode, hint", [(None, True), ("token", False)])
def test_a_cluster_that_cannot_be_joined_is_one_sentence(tmp_path, spec, monkeypatch, mode, hint):
    ray = FakeRay(refuse=AUTH_FAILURE)
    res = _sweep(spec, tmp_path / "out", "127.0.0.1:6391", monkeypatch, ray, env={"RAY_AUTH_MODE": mode})
    assert res.exit_code == 2 and "Traceback" not in res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: could not connect to the Ray cluster at '127.0.0.1:6391' "
                                                   "(ConnectionError: Failed to connect"), lines
    assert ("RAY_AUTH_MODE=token" in lines[0]) is hint and "drop --ray-address" in lines[0]
    assert not (tmp_path / "out" / "results.csv").exists()


@pytest.mark.parametrize("error", [RuntimeError("Version mismatch: the cluster runs Ray 2.41.0 and Python 3.10"),
                                   TimeoutError("timed out waiting for the GCS"), OSError(111, "Connection refused")])
def test_other_failures_to_join_are_one_sentence_too(tmp_path, spec, monkeypatch, error):
    res = _sweep(spec, tmp_path / "out", "head:6379", monkeypatch, FakeRay(refuse=error))
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
    assert f"({type(error).__name__}: " in res.stderr


def test_bench_ends_in_one_sentence_on_bad_input(monkeypatch, capsys):
    def refuse(argv):
        raise ConfigError("could not start a local Ray instance (ValueError: no room); or drop --ray-address")

    monkeypatch.setattr(bench, "main", refuse)
    assert bench.run(["sweep"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: could not start a local Ray instance") and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("address", ["", "  "])
def test_an_empty_ray_address_is_refused_not_taken_for_local_processes(tmp_path, spec, monkeypatch, address):
    res = _sweep(spec, tmp_path / "out", address, monkeypatch, FakeRay())
    assert res.exit_code == 2 and res.stderr.startswith("error: --ray-address is empty"), res.output
    assert not (tmp_path / "out" / "results.csv").exists()
