"""Microbenchmarks that time what a GPT layer runs: GEMMs, attention, memory-bound kernels, collectives.

Everything here imports only torch, numpy and the standard library, so that it runs on a bare GPU
machine where the simulator's own dependencies (pydantic, simpy) are not installed.
"""

RAW_FORMAT = "simulator-calibration-raw"  # the "format" field of the raw points file
RAW_VERSION = 1
