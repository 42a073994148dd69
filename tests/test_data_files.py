"""Every data file the repository ships is read by the reader of its kind, as strictly as a user's file.

A file no reader below claims fails ``test_every_data_file_has_a_reader``: a new kind of file needs its
reader named here, so a rule the readers gain (strict types, bounds) is checked on every shipped file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from calibration.build_published_profiles import _host
from calibration.published_data import measured_rows
from simulator.cost.profile import load_profile
from simulator.measure.calibrate import read_raw
from simulator.measure.datasets import REGISTRY, _vtrain_rows, vtrain_job
from simulator.measure.run_record import load_run_record
from simulator.spec._io import parse_json, read_text
from simulator.spec.catalog import load_model
from simulator.spec.economics import load_economics
from simulator.spec.hardware import cluster_names, gpu_names, load_cluster, load_gpu
from simulator.spec.reliability import load_reliability

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("hardware_specs", "calibration/profiles", "calibration/published", "calibration/reference", "examples",
           "reports/cpu-validation")
DATA_SUFFIXES = {".yaml", ".yml", ".json", ".csv"}


def _data_set(key: str) -> Callable[[Path], Any]:
    """The file read as the data set that holds it (its runs, each a validated job)."""
    def read(_: Path) -> Any:
        runs = next(d for d in REGISTRY if d.key == key).runs()
        assert runs, f"{key} has no runs"
        return runs
    return read


# (glob under the repository, reader); each file is read by the first reader whose glob matches it
READERS: list[tuple[str, Callable[[Path], Any]]] = [
    ("hardware_specs/gpus/*.yaml", lambda p: load_gpu(str(p))),
    ("hardware_specs/clusters/*.yaml", lambda p: load_cluster(str(p))),
    ("hardware_specs/reliability/*.yaml", lambda p: load_reliability(str(p))),
    ("hardware_specs/economics/*.yaml", lambda p: load_economics(str(p))),
    ("calibration/profiles/*.json", load_profile),
    ("calibration/reference/*.yaml", lambda p: load_model(str(p))),
    ("calibration/published/hardware.json", lambda p: measured_rows()),
    ("calibration/published/host_overhead_fit.json", lambda p: _host()),
    ("calibration/published/korthikanti2022.json", _data_set("korthikanti2022")),
    # building the jobs of all 1,440 rows takes seconds: every row, and the jobs of the first few
    ("calibration/published/vtrain-single-node/*.csv", lambda p: [vtrain_job(*row[:10]) for row in _vtrain_rows()[:3]]),
    ("calibration/published/vtrain-multi-node-dev/*.csv", _data_set("vtrain-multi-node-dev")),
    ("calibration/published/vtrain-nccl-a100/*.csv", lambda p: _nccl_table(p)),
    ("calibration/published/xla-matmul-h100/*.csv", lambda p: _xla_table(p)),
    ("calibration/published/model_error_band.json", lambda p: _band_file()),
    ("calibration/published/host_overhead_loso.json", lambda p: _host_left_out(p)),
    ("calibration/published/residuals.json", lambda p: _residuals(p)),
    ("calibration/published/from_runs_protocol.json", lambda p: _from_runs_protocol(p)),
    ("reports/cpu-validation/run-*.json", lambda p: (load_run_record(p), _data_set("cpu-reference-loop")(p))),
    ("reports/cpu-validation/*-raw.json", read_raw),
    ("reports/cpu-validation/cpu-profile*.json", load_profile),
    ("reports/cpu-validation/summary.json", lambda p: parse_json(read_text(p, "summary"), str(p))),
]


def _nccl_table(path: Path) -> Any:
    from calibration.published_links import vtrain_nccl_rows

    rows = vtrain_nccl_rows(path)
    assert rows and all(size > 0 and t > 0 for size, t in rows)
    return rows


def _xla_table(path: Path) -> Any:
    from calibration.build_published_profiles import xla_matmul_rows

    rows = xla_matmul_rows(path)
    assert len({row[:4] for row in rows}) == len(rows) == 375  # the full grid, each shape once
    return rows


def _band_file() -> Any:
    from simulator.estimator.regime import band_table

    table = band_table()
    assert table["gpus"] and all(0 < g["half_width"] < 1 for g in table["gpus"].values())
    return table


def _host_left_out(path: Path) -> Any:
    table = parse_json(read_text(path, "host fit table"), str(path))
    assert {row["left_out"] for row in table["rows"]} <= {d.key for d in REGISTRY}
    return table


def _from_runs_protocol(path: Path) -> Any:
    """Each row names a measured set, the three runs the fixed rule picked from it, and what they were judged on."""
    table = parse_json(read_text(path, "from-runs protocol table"), str(path))
    registry = {d.key: d for d in REGISTRY}
    for row in table["rows"]:
        runs = registry[row["set"]].runs()
        assert len(row["chosen"]) == 3 and set(row["chosen"]) <= {r.label for r in runs}
        assert row["judged_on"] == len(runs) - 3
    return table


def _residuals(path: Path) -> Any:
    table = parse_json(read_text(path, "residuals table"), str(path))
    assert set(table["sets"]) <= {d.key for d in REGISTRY}
    assert all(set(per_set) <= {d.key for d in REGISTRY} for per_set in table["what_if"].values())
    return table


def _data_files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (REPO / folder).rglob("*")
                  if p.is_file() and p.suffix in DATA_SUFFIXES)


def _reader(path: Path) -> Callable[[Path], Any] | None:
    rel = path.relative_to(REPO)
    return next((read for pattern, read in READERS if rel.match(pattern)), None)


def test_every_data_file_has_a_reader():
    files = _data_files()
    assert len(files) > 20
    assert [str(p.relative_to(REPO)) for p in files if _reader(p) is None] == []


@pytest.mark.parametrize("path", _data_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_data_file_reads(path):
    assert _reader(path)(path) is not None


def test_every_preset_loads_by_name():
    assert all(load_gpu(name).name == name for name in gpu_names())
    assert all(load_cluster(name).name for name in cluster_names())
