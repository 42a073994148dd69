"""Each measured run's job, as the registry builds it, is the job the CLI builds from the flags that express
that run: a prediction the report makes for a measured set is the one `simulator plan` gives its user.

The flags are written here from each set's own description (its README, the paper's tables), not from the
registry's jobs, so a default the registry fills in differently from the CLI shows up as a difference.
"""

from __future__ import annotations

import csv
import json
from functools import lru_cache
from importlib import resources

import pytest

from simulator.cli import options
from simulator.cli.options import job_from_options
from simulator.measure import korthikanti
from simulator.measure.datasets import (
    CPU_REFERENCE,
    KORTHIKANTI,
    REGISTRY,
    VTRAIN_MULTI_NODE,
    VTRAIN_SINGLE_NODE,
)

GPT2_VOCAB = 50257


def _differences(registry_job, cli_job) -> dict:
    out = {}
    for part in ("model", "cluster", "plan"):
        a, b = getattr(registry_job, part).model_dump(), getattr(cli_job, part).model_dump()
        out.update({f"{part}.{k}": (a[k], b.get(k)) for k in a if a[k] != b.get(k)})
    return out


def _assert_same_jobs(runs, sources, flags_of) -> None:
    """``flags_of(source)``: the flags of the run measured as ``source`` describes it, in the set's order."""
    assert len(runs) == len(sources)
    mismatched = {}
    for run, source in zip(runs, sources):
        cli_job = job_from_options(**flags_of(source))
        if cli_job != run.job:
            mismatched[run.label] = _differences(run.job, cli_job)
    assert not mismatched, dict(list(mismatched.items())[:5])


# --- vTrain's sets: Megatron-DeepSpeed runs, read from the CSV columns by their names ------------------------


@pytest.fixture(autouse=True)
def clusters_read_once(monkeypatch):
    """The CLI reads its cluster's YAML on every call; read once here, 1,500 jobs take seconds, not a minute."""
    monkeypatch.setattr(options, "load_cluster", lru_cache(maxsize=None)(options.load_cluster))


def _vtrain_rows(directory: str, name: str) -> list[dict[str, str]]:
    path = resources.files("calibration") / "published" / directory / name
    with path.open(encoding="utf-8-sig") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    """One model file (`--model FILE`) per architecture, written on first use."""
    folder, written = tmp_path_factory.mktemp("models"), {}

    def model_file(hidden: int, heads: int, layers: int, seq: int, tp: int) -> str:
        key = (hidden, heads, layers, seq, tp)
        if key not in written:
            multiple = 128 * tp  # Megatron's --make-vocab-size-divisible-by 128, times TP
            path = folder / f"gpt-h{hidden}-l{layers}-s{seq}-tp{tp}.json"
            path.write_text(json.dumps({
                "name": f"gpt-h{hidden}-l{layers}", "num_layers": layers, "hidden_size": hidden,
                "num_attention_heads": heads, "seq_length": seq,  # FFN 4 x hidden: the field's default
                "vocab_size": -(-GPT2_VOCAB // multiple) * multiple}))
            written[key] = str(path)
        return written[key]

    return model_file


@pytest.mark.parametrize("data, directory, name", [
    (VTRAIN_SINGLE_NODE, "vtrain-single-node", "ground_truth_single.csv"),
    (VTRAIN_MULTI_NODE, "vtrain-multi-node-dev", "ground_truth_multi_dev.csv"),
])
def test_every_vtrain_run_is_the_job_its_flags_build(data, directory, name, model_files):
    rows = _vtrain_rows(directory, name)
    runs = data.runs()
    assert [r.measured_s for r in runs] == [float(row["iteration time (ms)"]) / 1e3 for row in rows]

    def flags_of(text_row):
        row = {k: int(v) for k, v in text_row.items() if k not in ("Parameters (billion)", "iteration time (ms)")}
        tp = row["tensor parallelism"]
        return dict(
            model=model_files(row["hidden size"], row["attention heads"], row["# layers"], row["sequence length"], tp),
            cluster="a100-80gb-4x-hdr", gpus=row["# GPUs"], tensor_parallel_size=tp,
            pipeline_parallel_size=row["pipeline parallelism"], data_parallel_size=row["data parallelism"],
            micro_batch_size=row["micro batch"], global_batch_size=row["global batch"], precision="fp16",
            recompute_granularity="full", attention_backend="unfused", allow_tp_across_nodes=tp > 8,
            # DeepSpeed's launcher leaves CUDA_DEVICE_MAX_CONNECTIONS unset: CUDA's default of 8 queues, where
            # Megatron's own launch (the CLI's default) sets 1 under TP
            cuda_device_max_connections=8)

    _assert_same_jobs(runs, rows, flags_of)


# --- Korthikanti et al. 2022: Table 3's configurations, Table 5's times, Section 6.3's 2,240 GPUs ------------


def test_every_korthikanti_run_is_the_job_its_flags_build():
    rows = korthikanti.table5_rows()
    point = korthikanti.DATA_PARALLEL_POINT
    wide = next(r for r in rows if r["model"]["params_b"] == point["model"] and r["parallel"]["sp"])
    configs = [(row, 1) for row in rows] + [(wide, point["data_parallel_size"])]

    def flags_of(config):
        row, dp = config
        par = row["parallel"]
        return dict(
            model=korthikanti.MODELS[row["model"]["params_b"]], cluster="dgx-a100-80gb",
            tensor_parallel_size=par["tp"], pipeline_parallel_size=par["pp"], data_parallel_size=dp,
            virtual_pipeline_stages=par["virtual_stages"] or 1, sequence_parallel=par["sp"],
            micro_batch_size=par["micro_batch"], global_batch_size=par["global_batch"] * dp,
            recompute_granularity=par["recompute"], attention_backend="unfused",
            # the paper's 2022 Megatron exchanged the interleaved schedule's activations blocking; the
            # --overlap-p2p-communication the CLI turns on with interleaving came to Megatron in 2023
            overlap_p2p_comm=False)

    _assert_same_jobs(KORTHIKANTI.runs(), configs, flags_of)


# --- the reference loop on this repository's CPU ---------------------------------------------------------------


def test_every_cpu_run_is_the_job_its_flags_build():
    from calibration import cpu_validation

    runs = CPU_REFERENCE.runs()
    if not runs:
        pytest.skip("the repository's reports/cpu-validation is absent")
    plans = {cpu_validation._slug(label): plan for label, plan in cpu_validation.PLANS.items()}

    def flags_of(label):
        return dict(model=str(cpu_validation.MODEL), cluster="local-cpu", precision="fp32",
                    allow_tp_across_nodes=True, attention_backend="unfused", **plans[label])

    _assert_same_jobs(runs, [run.label for run in runs], flags_of)


def test_every_measured_set_is_checked_here():
    assert {d.key for d in REGISTRY} == {d.key for d in (KORTHIKANTI, VTRAIN_SINGLE_NODE, VTRAIN_MULTI_NODE,
                                                         CPU_REFERENCE)}
