"""Stands in for ``calibration.measure``: writes the raw points of $SIMULATOR_TEST_RAW to --out, saying so
section by section as the real one does, and keeps its arguments in $SIMULATOR_TEST_ARGV when that is set."""

import argparse
import json
import os
import shutil
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--device")
parser.add_argument("--out")
parser.add_argument("--quick", action="store_true")
args, _ = parser.parse_known_args()
if os.environ.get("SIMULATOR_TEST_ARGV"):
    with open(os.environ["SIMULATOR_TEST_ARGV"], "w") as f:
        json.dump(sys.argv[1:], f)
print(f"measuring test device ({args.device})", flush=True)
for section in ("gemm", "collectives"):
    print(f"[{section}] measuring, 10 s allowed", flush=True)
    print(f"[{section}] done: 3 points in 0.1 s of 10 s", flush=True)
shutil.copyfile(os.environ["SIMULATOR_TEST_RAW"], args.out)
print(f"wrote {args.out} in 0.2 s", flush=True)
