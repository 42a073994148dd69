"""Every file the CLI writes goes through one writer (``simulator.spec._io.write_output``): `search --csv` and
`--html` as `--trace`, `--plots` and `plot --out` always did. A FIFO or a character device is written through,
a symlink followed and kept, a full or read-only file system is one sentence with exit code 2 and no temporary
file left; and an output path that is the command's own standard output (which carries the answer) is refused
before any work."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from simulator.planner.sweep import write_results
from simulator.spec.errors import OutputError
from tests.cli.test_bad_input import ok, refused

REPO = Path(__file__).resolve().parents[2]
SEARCH = ["search", "--model", "gpt3-125m", "--gpus", "8", "--gbs", "8"]
PLAN = ["plan", "--model", "gpt3-125m", "--gbs", "4"]


def _device(path: Path, minor: int) -> Path:
    """A character device of the memory driver at ``path`` (3: null, 7: full); only root may make one."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    except (PermissionError, OSError):
        pytest.skip("making a device node needs root")
    return path


def test_search_csv_and_html_write_through_devices(tmp_path):
    pytest.importorskip("plotly")
    csv, page = _device(tmp_path / "t.csv", 3), _device(tmp_path / "p.html", 3)
    ok(*SEARCH, "--csv", str(csv), "--html", str(page))
    assert stat.S_ISCHR(os.lstat(csv).st_mode) and stat.S_ISCHR(os.lstat(page).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.html", "t.csv"]  # no temporary file beside them


def test_search_csv_and_html_write_through_fifos(tmp_path):
    pytest.importorskip("plotly")
    got: dict[str, bytes] = {}
    fifos = [tmp_path / "t.csv", tmp_path / "p.html"]
    readers = []
    for fifo in fifos:
        os.mkfifo(fifo)
        readers.append(threading.Thread(target=lambda f=fifo: got.__setitem__(f.name, f.read_bytes())))
        readers[-1].start()
    time.sleep(0.2)  # the readers open their FIFOs first
    ok(*SEARCH, "--csv", str(fifos[0]), "--html", str(fifos[1]))
    for reader in readers:
        reader.join(timeout=60)
    assert all(stat.S_ISFIFO(os.lstat(f).st_mode) for f in fifos)
    assert got["t.csv"].startswith(b"rank,") and b"<html" in got["p.html"]


def test_search_csv_and_html_follow_a_symlink_and_keep_it(tmp_path):
    pytest.importorskip("plotly")
    (tmp_path / "real").mkdir()
    links = {}
    for name in ("t.csv", "p.html"):
        real = tmp_path / "real" / name
        real.write_text("old")
        links[name] = tmp_path / name
        links[name].symlink_to(real)
    ok(*SEARCH, "--csv", str(links["t.csv"]), "--html", str(links["p.html"]))
    assert all(link.is_symlink() for link in links.values())
    assert (tmp_path / "real" / "t.csv").read_text().startswith("rank,")
    assert "<html" in (tmp_path / "real" / "p.html").read_text()


def test_a_csv_on_a_full_device_is_one_sentence(tmp_path):
    full = _device(tmp_path / "full.csv", 7)
    refused(*SEARCH, "--csv", str(full), needle="No space left on device")
    assert stat.S_ISCHR(os.lstat(full).st_mode)


@pytest.mark.parametrize("flag, name, what", [("--csv", "t.csv", "CSV table"), ("--html", "p.html", "HTML page")])
@pytest.mark.parametrize("err", [errno.EROFS, errno.ENOSPC])
def test_a_read_only_or_full_file_system_is_one_sentence_and_leaves_no_temporary_file(tmp_path, monkeypatch, flag,
                                                                                        name, what, err):
    if flag == "--html":
        pytest.importorskip("plotly")

    def refuse(*args, **kwargs):
        raise OSError(err, os.strerror(err))

    # a read-only file system refuses the temporary file; a full one, the bytes (at fsync)
    monkeypatch.setattr("tempfile.mkstemp" if err == errno.EROFS else "os.fsync", refuse)
    out = tmp_path / "out"
    line = refused(*SEARCH, flag, str(out / name), needle=os.strerror(err))
    assert f"cannot write {what}" in line
    assert not list(out.iterdir())


def test_the_sweeps_results_go_through_the_same_writer(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(OutputError, match="is a file, not a folder"):
        write_results(tmp_path / "afile" / "study", [])
    fifo = tmp_path / "study" / "results.csv"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="no process is reading"):  # not replaced by a regular file
        write_results(tmp_path / "study", [])
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_an_output_that_is_the_commands_standard_output_is_refused(tmp_path):
    """`plan --json --trace /dev/stdout > f` wrote the trace over f and lost the answer: every output flag refuses
    a path that is stdout (by any name), before any work, and stdout keeps nothing but the answer; /dev/null
    as both keeps nothing, so it is left alone."""
    answer = tmp_path / "answer.json"
    raw = tmp_path / "raw.json"
    raw.write_text("{}")
    outputs = [PLAN + ["--json", "--trace", "/dev/stdout"],
               PLAN + ["--trace", "/proc/self/fd/1"],
               PLAN + ["--json", "--trace", str(answer)],
               SEARCH + ["--trace", "/dev/stdout"], SEARCH + ["--csv", "/dev/stdout"],
               SEARCH + ["--html", "/dev/stdout"], SEARCH + ["--pareto", "/dev/stdout"],
               ["plot", "timeline", "--model", "gpt3-125m", "--gbs", "4", "--out", "/dev/stdout"],
               ["calibrate", "--raw", str(raw), "--out", "/dev/stdout"],
               ["calibrate", "--device", "cpu", "--keep-raw", "/dev/stdout", "--out", str(tmp_path / "p.json")],
               ["reference", "--model", "gpt3-125m", "--gbs", "1", "--out", "/dev/stdout"]]
    report = tmp_path / "report.json"
    with open(answer, "w") as stdout:
        proc = subprocess.run([sys.executable, str(REPO / "tests" / "cli" / "helpers" / "stdout_outputs.py"),
                               json.dumps(outputs), str(report)], cwd=tmp_path, stdout=stdout, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for r in json.loads(report.read_text()):
        lines = r["stderr"].strip().splitlines()
        assert r["code"] == 2 and len(lines) == 1, r
        assert "is this command's standard output, which carries its answer" in lines[0], r
    assert answer.read_text() == ""  # nothing written over it, nothing mixed into it
    with open(os.devnull, "w") as stdout:
        subprocess.run([sys.executable, "-m", "simulator", *PLAN, "--json", "--trace", os.devnull], cwd=tmp_path,
                       stdout=stdout, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300, check=True)
