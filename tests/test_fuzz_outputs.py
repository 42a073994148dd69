"""Property-based cases (hypothesis) for what an outside fuzz found the project's own fuzzer missed: every output
flag against every kind of path, and `sweep --ray-address` against every kind of Ray cluster.

Outputs: each flag that names a file or a folder (`plan --trace/--plots`, `search --trace/--pareto/--csv/--html/
--plots`, `plot --out`, `calibrate --out`, `sweep --out`), given a new file, a missing folder, an existing
file, a symlink, a character device, a FIFO nobody reads, a folder, a path the OS refuses, a name too long,
a file where a folder should be or the wrong suffix, now and then on a file system that is read-only or full.
Every case ends in exit code 0 with the output where it was asked (a device or symlink kept as it was) or
one sentence with exit code 2; never a traceback, and never a temporary file left behind.

Ray: `sweep --ray-address` with `local`, a HOST:PORT or a ray:// address, against a stand-in Ray that joins,
has a cluster already running, or raises what the real one raises (token authentication, another version,
nothing listening), or is not installed: the rows local processes give, or one sentence with exit code 2.

The run and its size follow tests/test_fuzz.py (SIMULATOR_FUZZ_CASES; `make fuzz` runs them with the rest).
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import stat
import sys
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import fuzz_tally
from tests.cli.test_ray_cli import FakeRay
from tests.measure.test_calibrate import _cpu_raw
from tests.test_fuzz import CASES, DEADLINE, RANDOM, WEIRD_TEXT, Workdir, invoke

SHARES = {"outputs": 0.03, "ray": 0.02}  # of SIMULATOR_FUZZ_CASES: 12 and 8 by default (a case runs a command)


def fuzz(name: str):
    return settings(max_examples=max(1, round(CASES * SHARES[name])), deadline=DEADLINE, derandomize=not RANDOM,
                    database=None, suppress_health_check=list(HealthCheck), print_blob=True)


CASE = itertools.count()  # each case's paths under a name of its own
PLAN = ["plan", "--model", "gpt3-125m", "--gbs", "4"]
SEARCH = ["search", "--model", "gpt3-125m", "--gpus", "2", "--gbs", "4"]
CAPACITY = ["capacity", "--model", "gpt3-125m", "--tokens", "1e9", "--gbs", "8", "--clusters", "dgx-h100",
            "--gpus", "8", "--workers", "1"]
SPEC = "models: [gpt3-125m]\ngpus: [8]\nglobal_batch_sizes: [8]\n"


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Workdir:
    w = Workdir(tmp_path_factory.mktemp("fuzz-outputs"))
    (w.root / "afile").write_text("x")
    (w.root / "raw.json").write_text(json.dumps(_cpu_raw()))
    (w.root / "spec.yaml").write_text(SPEC)
    return w


# flag -> (command line before it, suffix its file takes, whether it names a folder)
FLAGS = {
    "plan --trace": (PLAN + ["--trace"], ".json", False),
    "plan --plots": (PLAN + ["--plots"], "", True),
    "search --trace": (SEARCH + ["--trace"], ".json", False),
    "search --pareto": (SEARCH + ["--pareto"], ".png", False),
    "search --csv": (SEARCH + ["--csv"], ".csv", False),
    "search --html": (SEARCH + ["--html"], ".html", False),
    "search --plots": (SEARCH + ["--plots"], "", True),
    "plot --out": (["plot", "timeline", "--model", "gpt3-125m", "--gbs", "4", "--out"], ".png", False),
    "calibrate --out": (None, ".json", False),  # the raw points of the work folder, fitted
    "sweep --out": (None, "", True),
    "capacity --csv": (CAPACITY + ["--csv"], ".csv", False),
    "capacity --plot": (CAPACITY + ["--plot"], ".png", False),
    "capacity --html": (CAPACITY + ["--html"], ".html", False),
}
KINDS = ("new", "new", "folder", "existing", "symlink", "device", "fifo", "dir", "proc", "long", "notdir", "suffix")
SUFFIXED = {"search --pareto", "search --csv", "search --html",  # the flags whose suffix says the format
            "capacity --csv", "capacity --plot", "capacity --html"}


def expected(flag: str, kind: str, fault: int | None) -> set[int]:
    """The exit codes a case may end in."""
    folder = FLAGS[flag][2]
    if kind == "dir" and folder:  # a folder there already: the figures or tables go into it
        return {2} if fault else {0}
    if kind in ("fifo", "dir", "proc", "long", "notdir"):  # a FIFO nobody reads, a path no file can have
        return {2}
    if kind == "suffix":  # a format the flag does not write, or (plot, a trace, a profile) one it may
        return {2} if flag in SUFFIXED else {0, 2}
    if kind == "device":  # written through (no temporary file, no fsync to fail); never a folder
        return {2} if folder else {0}
    return {2} if fault else {0}


def _path(work: Workdir, kind: str, suffix: str, folder: bool, n: int) -> Path:
    root = work.root
    if kind == "new":
        return root / f"o{n}{suffix}"
    if kind == "folder":
        return root / f"new{n}" / "sub" / f"o{suffix}"
    if kind == "existing":
        (root / f"e{n}").mkdir() if folder else (root / f"e{n}{suffix}").write_text("old")
        return root / f"e{n}{suffix}"
    if kind == "symlink":
        real = root / f"real{n}"
        real.mkdir()
        target = real if folder else real / f"t{suffix}"
        if not folder:
            target.write_text("old")
        (root / f"l{n}{suffix}").symlink_to(target)
        return root / f"l{n}{suffix}"
    if kind == "device":
        path = root / f"d{n}{suffix}"
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except OSError:
            return Path("/dev/null")
        return path
    if kind == "fifo":
        os.mkfifo(root / f"p{n}{suffix}")
        return root / f"p{n}{suffix}"
    if kind == "dir":
        return root
    if kind == "proc":
        return Path(f"/proc/o{n}{suffix}")
    if kind == "long":
        return root / ("o" * 300 + suffix)
    if kind == "notdir":
        return root / "afile" / f"o{suffix}"
    return root / f"o{n}.txt"  # the wrong suffix


def _args(flag: str, work: Workdir, path: Path) -> list[str]:
    if flag == "calibrate --out":
        return ["calibrate", "--raw", str(work.root / "raw.json"), "--out", str(path)]
    if flag == "sweep --out":
        return ["sweep", str(work.root / "spec.yaml"), "--out", str(path), "--workers", "1"]
    return FLAGS[flag][0] + [str(path)]


def _leftovers(root: Path) -> list[Path]:
    """Temporary files a writer left: every writer's names end in .tmp (or .tmpPID, as the old ones did)."""
    return [p for p in root.rglob(".*") if ".tmp" in p.name]


# the default run leaves out the --plots flags (each draws six figures: seconds, half a minute the first time);
# `make fuzz` draws them with the others
DRAWN = sorted(FLAGS) if RANDOM else sorted(f for f in FLAGS if not f.endswith("--plots"))


@pytest.mark.fuzz
@fuzz("outputs")
@given(flag=st.sampled_from(DRAWN), kind=st.sampled_from(KINDS),
       fault=st.sampled_from([None, None, None, errno.EROFS, errno.ENOSPC]))
def test_every_output_flag_writes_or_refuses_every_kind_of_path(work, flag, kind, fault):
    _, suffix, folder = FLAGS[flag]
    if flag in ("search --html", "capacity --html"):
        pytest.importorskip("plotly")
    if kind == "suffix" and not suffix:
        kind = "new"
    path = _path(work, kind, suffix, folder, next(CASE))
    before = (stat.S_IFMT(os.lstat(path).st_mode), path.is_symlink()) if os.path.lexists(path) else None

    def refuse(*args, **kwargs):
        raise OSError(fault, os.strerror(fault))

    # a read-only file system refuses the temporary file; a full one, the bytes (at fsync)
    patches = [mock.patch("tempfile.mkstemp" if fault == errno.EROFS else "os.fsync", refuse)] if fault else []
    for p in patches:
        p.start()
    try:
        result = invoke(_args(flag, work, path))
    finally:
        for p in patches:
            p.stop()
    fuzz_tally.count("outputs", f"{kind} exit {result.exit_code}")
    assert not _leftovers(work.root), _leftovers(work.root)
    assert result.exit_code in expected(flag, kind, fault), (flag, kind, fault, result.output)
    if result.exit_code:
        return
    if kind == "device":
        assert stat.S_ISCHR(os.lstat(path).st_mode)
    elif kind == "symlink":
        assert path.is_symlink() and before == (stat.S_IFLNK, True)
    elif folder:
        assert path.is_dir() and any(path.iterdir())
    else:
        assert path.is_file() and path.stat().st_size > 0
        assert kind != "existing" or path.read_bytes() != b"old"


RAY_BEHAVIOURS = {
    "joins": lambda: FakeRay(),
    "cluster running here": lambda: FakeRay(running=True),
    "token authentication": lambda: FakeRay(refuse=ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")),
    "another version": lambda: FakeRay(refuse=RuntimeError("Version mismatch: the cluster was started with Ray 2.41.0")),
    "timeout": lambda: FakeRay(refuse=TimeoutError("timed out")),
    "bad address": lambda: FakeRay(refuse=ValueError("Invalid address format")),
    "nothing listening": lambda: FakeRay(refuse=OSError(errno.ECONNREFUSED, "Connection refused")),
    "not installed": lambda: None,
}


@pytest.mark.fuzz
@fuzz("ray")
@given(address=st.sampled_from(["local", "local", "127.0.0.1:6379", "head:6380", "ray://head:10001"]) | WEIRD_TEXT,
       behaviour=st.sampled_from(sorted(RAY_BEHAVIOURS)), workers=st.sampled_from([1, 2]),
       auth=st.sampled_from([None, "token"]))
def test_sweep_on_ray_answers_or_refuses(work, address, behaviour, workers, auth):
    ray = RAY_BEHAVIOURS[behaviour]()
    out = work.root / f"sweep{next(CASE)}"
    with mock.patch.dict(sys.modules, {"ray": ray}):
        result = invoke(["sweep", str(work.root / "spec.yaml"), "--out", str(out), "--ray-address", address,
                         "--workers", str(workers)], env={"RAY_AUTH_MODE": auth})
    fuzz_tally.count("ray", f"{behaviour} exit {result.exit_code}")
    # Ray missing, no address at all, or one the stand-in cluster refuses: one sentence, nothing written
    if ray is None or not address.strip() or (address != "local" and ray.refuse is not None):
        assert result.exit_code == 2 and not (out / "results.csv").exists(), result.output
        return
    assert result.exit_code == 0, result.output
    assert ray.inits[0]["address"] == address and not ray.up
    if address == "local":
        assert ray.inits[0]["num_cpus"] == workers
    rows = json.loads((out / "results.json").read_text())
    assert [r["status"] for r in rows] == ["ok"]


def test_the_fuzzed_outputs_are_every_output_flag_the_cli_has():
    """A new output flag joins FLAGS: every option of type OutputFile or a folder path the commands declare."""
    import click

    from simulator.cli import COMMANDS, cli
    from simulator.cli.options import OutputFile

    declared = set()
    for name in COMMANDS:
        command = cli.get_command(click.Context(cli), name)
        for p in command.params:
            writes = isinstance(p.type, OutputFile) or (isinstance(p.type, click.Path) and not p.type.file_okay)
            if isinstance(p, click.Option) and writes and name not in ("report", "reference"):
                declared.add(f"{name} {max(p.opts, key=len)}")
    declared.discard("calibrate --keep-raw")  # written only by a measurement: tests/cli/test_calibrate_cli.py
    assert declared <= set(FLAGS), declared - set(FLAGS)
