"""Stands in for ``calibration.measure`` in the interruption test: starts a grandchild that would
outlive it, says where things are, and waits to be stopped (it never writes points)."""

import argparse
import json
import os
import subprocess
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--device")
parser.add_argument("--out")
parser.add_argument("--quick", action="store_true")
args, _ = parser.parse_known_args()
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
state = {"child": os.getpid(), "grandchild": grandchild.pid, "raw_dir": os.path.dirname(args.out)}
with open(os.environ["SIMULATOR_TEST_STATE"] + ".tmp", "w") as f:
    json.dump(state, f)
os.replace(os.environ["SIMULATOR_TEST_STATE"] + ".tmp", os.environ["SIMULATOR_TEST_STATE"])
time.sleep(600)
