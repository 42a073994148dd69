"""Child processes that never outlive the command that started them.

``simulator calibrate`` measures in a child (``python -m calibration.measure``) and ``simulator
reference`` starts torchrun, which starts one worker per rank. ``run`` starts such a child in a
process group of its own and, however this process leaves the wait (Ctrl-C, SIGTERM, a timeout,
an exception), stops the whole group: first SIGTERM, then SIGKILL for what is still running. On
Linux the child is also asked to die with its parent, for when this process is killed outright.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Any, Callable

GRACE_S = 5.0  # how long a stopped group may take to exit before SIGKILL


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def stop_group(proc: subprocess.Popen) -> None:
    """Stop ``proc`` and every process of its group; return once ``proc`` has exited."""
    for sig, wait_s in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=wait_s)
            if sig == signal.SIGTERM:
                # the leader is gone; anything it left in the group gets SIGKILL too
                os.killpg(proc.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue
        except (ProcessLookupError, PermissionError):
            return


def run(cmd: list[str], *, timeout: float | None = None, on_line: Callable[[str], None] | None = None,
        **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True)`` whose whole process group is stopped
    when the wait ends early; ``subprocess.TimeoutExpired`` is raised after the group is stopped.
    ``on_line`` is given each line of the child's stdout as it comes (the whole output is still returned)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_die_with_parent, **kwargs)
    if on_line is None:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            stop_group(proc)
            proc.communicate()  # close the pipes
            raise
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    out_lines: list[str] = []
    err_parts: list[str] = []

    def pump_out() -> None:
        for line in proc.stdout:
            out_lines.append(line)
            on_line(line.rstrip("\n"))

    readers = [threading.Thread(target=pump_out, daemon=True),
               threading.Thread(target=lambda: err_parts.append(proc.stderr.read()), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=timeout)
    except BaseException:
        stop_group(proc)
        raise
    finally:
        for reader in readers:
            reader.join(timeout=GRACE_S)
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(out_lines), "".join(err_parts))
