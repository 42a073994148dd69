"""Runs each command line of the JSON list in argv[1] in this process, whose stdout the test has redirected to a
file, and writes to argv[2] what each ended in: its exit code and its stderr. The refusals checked happen
before any work, so the whole list takes one interpreter start."""

import contextlib
import io
import json
import sys

from simulator.cli import cli

results = []
for args in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            cli.main(args, prog_name="simulator")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    results.append({"args": args, "code": code, "stderr": err.getvalue()})
with open(sys.argv[2], "w") as f:
    json.dump(results, f)
