"""Stands in for ``calibration.measure``: writes the raw points of $SIMULATOR_TEST_RAW to --out."""

import argparse
import os
import shutil

parser = argparse.ArgumentParser()
parser.add_argument("--device")
parser.add_argument("--out")
parser.add_argument("--quick", action="store_true")
args, _ = parser.parse_known_args()
shutil.copyfile(os.environ["SIMULATOR_TEST_RAW"], args.out)
