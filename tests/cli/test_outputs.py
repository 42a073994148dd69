"""Where outputs go: a regular file is replaced atomically through a unique temporary name; a device,
FIFO or symlink is written through, never replaced; a missing folder is created; every path that
cannot be written is one sentence and exit code 2. Child processes and temporary folders do not
outlive an interrupted `calibrate`."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from simulator.cli import cli
from simulator.spec._io import write_output
from simulator.spec.errors import OutputError
from tests.cli.test_bad_input import ok, refused
from tests.measure.test_calibrate import _synthetic_raw

REPO = Path(__file__).resolve().parents[2]
PLAN = ["plan", "--model", "gpt3-125m", "--gbs", "4"]


def _char_device(tmp_path: Path, name: str, minor: int) -> Path:
    """A character device of the memory driver: our own node (root), else the system's (which a
    non-root user cannot replace, so a test through it can fail but not damage the machine)."""
    path = tmp_path / name
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    except (PermissionError, OSError):
        return Path("/dev") / name
    return path


@pytest.fixture
def null(tmp_path) -> Path:
    return _char_device(tmp_path, "null", 3)


@pytest.fixture
def full(tmp_path) -> Path:
    return _char_device(tmp_path, "full", 7)


def _is_device(path: Path) -> bool:
    return stat.S_ISCHR(os.lstat(path).st_mode)


# --- devices, FIFOs, symlinks ---------------------------------------------------------------------

def test_trace_to_a_device_writes_through_it(null):
    ok(*PLAN, "--trace", str(null))
    assert _is_device(null)
    assert not list(null.parent.glob(f".{null.name}*"))


def test_search_pareto_and_trace_to_a_device(null):
    ok("search", "--model", "gpt3-125m", "--gpus", "8", "--gbs", "8", "--trace", str(null))
    assert _is_device(null)


def test_calibrate_out_to_a_device(tmp_path, null):
    (tmp_path / "raw.json").write_text(json.dumps(_synthetic_raw()))
    ok("calibrate", "--raw", str(tmp_path / "raw.json"), "--out", str(null))
    assert _is_device(null)


def test_a_crashing_reference_run_leaves_a_device_alone(tmp_path, null, monkeypatch):
    pytest.importorskip("torch")
    from calibration.reference import launch

    crash = tmp_path / "crash.py"
    crash.write_text("raise RuntimeError('out of cheese on rank 0')\n")
    monkeypatch.setattr(launch, "TRAIN_SCRIPT", crash)
    tiny = tmp_path / "tiny.json"
    tiny.write_text(json.dumps({"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "vocab_size": 128,
                                "seq_length": 16}))
    refused("reference", "--model", str(tiny), "--gbs", "1", "--iterations", "1", "--out", str(null),
            needle="reference run failed")
    assert _is_device(null)  # a stale record is removed only when it is a regular file


def test_a_full_device_is_one_sentence(full):
    refused(*PLAN, "--trace", str(full), needle="No space left on device")
    assert _is_device(full)


def test_a_fifo_is_written_through(tmp_path):
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    time.sleep(0.2)  # the reader opens the FIFO first
    ok(*PLAN, "--trace", str(fifo))
    reader.join(timeout=30)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert json.loads(got[0])["traceEvents"]


def test_a_fifo_nobody_reads_is_refused_not_a_hang(tmp_path):
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    refused(*PLAN, "--trace", str(fifo), needle="no process is reading")


def test_a_symlink_is_followed_and_kept(tmp_path):
    real = tmp_path / "real" / "trace.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    ok(*PLAN, "--trace", str(link))
    assert link.is_symlink() and json.loads(real.read_text())["traceEvents"]


# --- folders and paths --------------------------------------------------------------------------

def test_a_missing_folder_is_created(tmp_path):
    for flag, name in (("--trace", "t.json"), ("--pareto", "p.png")):
        target = tmp_path / "new" / flag.strip("-") / name
        args = ["search", "--model", "gpt3-125m", "--gpus", "8", "--gbs", "8", flag, str(target)]
        ok(*args)
        assert target.stat().st_size > 0
    (tmp_path / "raw.json").write_text(json.dumps(_synthetic_raw()))
    ok("calibrate", "--raw", str(tmp_path / "raw.json"), "--out", str(tmp_path / "new" / "out" / "p.json"))
    assert json.loads((tmp_path / "new" / "out" / "p.json").read_text())["source"] == "measured"


@pytest.mark.parametrize("target,needle", [
    (".", "is a folder"),
    ("/proc", "is a folder"),
    ("/proc/simulator-trace.json", "cannot write trace"),
    ("/proc/version", "cannot write trace"),
    ("a" * 300 + ".json", "more than the 255"),
])
def test_paths_that_cannot_be_written(target, needle):
    refused(*PLAN, "--trace", target, needle=needle)


def test_a_file_where_a_folder_should_be(tmp_path):
    (tmp_path / "afile").write_text("x")
    refused(*PLAN, "--trace", str(tmp_path / "afile" / "t.json"), needle="cannot write trace")


def test_report_into_a_folder_that_cannot_be_made_is_refused_at_once(tmp_path, monkeypatch):
    # refused before the minutes the report takes, not after: a report that fails if computed proves it
    from simulator.outputs import report

    def computed(*args, **kwargs):
        raise AssertionError("the report was computed before its folder was checked")

    monkeypatch.setattr(report, "generate", computed)
    (tmp_path / "afile").write_text("x")
    refused("report", "--out", str(tmp_path / "afile" / "reports"), needle="cannot create the folder")
    refused("report", "--out", "/proc/simulator-reports", needle="cannot create the folder")


def test_pareto_refuses_a_format_it_cannot_draw(tmp_path):
    refused("search", "--model", "gpt3-125m", "--gpus", "8", "--gbs", "8", "--pareto", str(tmp_path / "x.json"),
            needle="PNG, SVG or PDF")
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_pareto_formats_by_suffix(tmp_path, suffix):
    path = tmp_path / f"pareto{suffix}"
    ok("search", "--model", "gpt3-125m", "--gpus", "8", "--gbs", "8", "--pareto", str(path))
    assert path.read_bytes()[:4] in (b"\x89PNG", b"<?xm", b"%PDF")


@pytest.mark.parametrize("err", [errno.EACCES, errno.EROFS, errno.ENOSPC, errno.EDQUOT])
def test_os_refusals_while_writing_are_one_sentence(tmp_path, monkeypatch, err):
    # root writes into read-only folders, so the refusal is made where the OS would make it
    real_write = os.write if err in (errno.ENOSPC, errno.EDQUOT) else None

    def refuse(*args, **kwargs):
        raise OSError(err, os.strerror(err))

    if real_write is None:
        monkeypatch.setattr("tempfile.mkstemp", refuse)
    else:
        monkeypatch.setattr("os.fsync", refuse)  # the bytes reach the disk at fsync; a full disk says so there
    line = refused(*PLAN, "--trace", str(tmp_path / "t.json"), needle=os.strerror(err))
    assert "cannot write trace" in line
    assert not list(tmp_path.iterdir())  # no temporary file left behind


def test_a_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        result = CliRunner().invoke(cli, [*PLAN, "--trace", str(folder / "t.json")])
        if os.geteuid() == 0:  # root may write anyway
            assert result.exit_code == 0
        else:
            assert result.exit_code == 2 and "Permission denied" in result.stderr
    finally:
        folder.chmod(0o755)


# --- atomic replacement -------------------------------------------------------------------------

def test_two_concurrent_writers_leave_one_complete_file(tmp_path):
    target = tmp_path / "same.json"
    docs = [json.dumps({"writer": i, "pad": "x" * 2_000_000}) for i in range(8)]
    errors: list[BaseException] = []

    def write(doc: str) -> None:
        try:
            write_output(target, doc, "test output")
        except BaseException as exc:  # noqa: BLE001 - any failure fails the test
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(d,)) for d in docs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert target.read_text() in docs
    assert [p.name for p in tmp_path.iterdir()] == ["same.json"]


def test_two_concurrent_cli_processes_write_one_complete_trace(tmp_path):
    target = tmp_path / "same.json"
    cmd = [sys.executable, "-m", "simulator", *PLAN, "--trace", str(target)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert json.loads(target.read_text())["traceEvents"]
    assert [p.name for p in tmp_path.iterdir()] == ["same.json"]


def test_a_replaced_file_keeps_its_mode(tmp_path):
    target = tmp_path / "t.json"
    target.write_text("old")
    target.chmod(0o640)
    write_output(target, "new", "test output")
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640


def test_write_output_refuses_a_folder(tmp_path):
    with pytest.raises(OutputError, match="is a folder"):
        write_output(tmp_path, "x", "test output")


# --- calibrate: child processes, temporary folders, --keep-raw ----------------------------------

def _default_sigint() -> None:  # runs in the child between fork and exec
    # A command a shell runs in the foreground gets Ctrl-C; one started in the background (a CI step, `cmd &`)
    # inherits SIGINT ignored, and Python then keeps ignoring it. The test stands for the first.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run_cli(measure_module: str, *args: str, cwd: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(REPO / "tests" / "cli" / "helpers" / "run_cli.py"), measure_module,
                             *args], cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie has exited: only its parent has not read its status yet
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_calibrate_leaves_no_child_and_no_temporary_folder(tmp_path, sig):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    state = tmp_path / "state.json"
    proc = _run_cli("tests.cli.helpers.sleepy_measure", "calibrate", "--device", "cpu", "--quick",
                    "--out", str(tmp_path / "p.json"), cwd=tmp_path,
                    env={"TMPDIR": str(tmpdir), "SIMULATOR_TEST_STATE": str(state)})
    deadline = time.monotonic() + 60
    while not state.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    seen = json.loads(state.read_text())
    try:
        assert Path(seen["raw_dir"]).parent == tmpdir and Path(seen["raw_dir"]).is_dir()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and err.strip() == "error: interrupted; nothing more was written", err
        deadline = time.monotonic() + 10
        while (_alive(seen["child"]) or _alive(seen["grandchild"])) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(seen["child"]) and not _alive(seen["grandchild"])
        assert not list(tmpdir.iterdir())
        assert not (tmp_path / "p.json").exists()
    finally:  # a failure here must not leave the sleepers behind
        for pid in (seen["child"], seen["grandchild"]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_relative_keep_raw_lands_in_the_current_folder(tmp_path):
    raw = tmp_path / "points.json"
    raw.write_text(json.dumps({**_synthetic_raw(), "device": {**_synthetic_raw()["device"]}}))
    work = tmp_path / "work"
    work.mkdir()
    proc = _run_cli("tests.cli.helpers.copy_measure", "calibrate", "--device", "cuda", "--out", "p.json",
                    "--keep-raw", "kept/raw.json", cwd=work, env={"SIMULATOR_TEST_RAW": str(raw)})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads((work / "kept" / "raw.json").read_text()) == json.loads(raw.read_text())
    assert (work / "p.json").is_file()
    assert not (REPO / "kept").exists()
