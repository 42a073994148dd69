"""``simulator`` as its console script runs, with the measuring module replaced: the interruption
and --keep-raw tests start this in a process of its own (argv: MEASURE_MODULE, then the CLI args)."""

import sys

import simulator.measure.calibrate
from simulator.cli import main

simulator.measure.calibrate.MEASURE_MODULE = sys.argv[1]
sys.argv = ["simulator", *sys.argv[2:]]
main()
