"""Failure data as hardware data: every rate derives from its published count, every number has a source and a
range that holds it, and a cluster file may name or give its own."""

from __future__ import annotations

import re

import pytest

from hardware_specs import SPEC_DIR
from simulator.spec.errors import ConfigError
from simulator.spec.hardware import cluster_names, load_cluster
from simulator.spec.reliability import Declared, load_reliability, reliability_names

LLAMA3_GPU_HOURS = 16_384 * 54 * 24  # the 54-day window on 16,384 H100 (Llama 3, section 3.3.4)


def test_each_rate_is_its_count_over_the_llama3_window():
    data = load_reliability("llama3-h100")
    for name, c in data.components.items():
        counts = [int(x) for x in re.findall(r"(\d+) of 419", c.per_million_gpu_hours.source)]
        if c.planned:
            assert c.per_million_gpu_hours.value == pytest.approx(47 / LLAMA3_GPU_HOURS * 1e6, rel=1e-4)
            continue
        if name == "nvlink":  # the declared quarter of the faulty-GPU count
            assert c.per_million_gpu_hours.value == pytest.approx(37 / LLAMA3_GPU_HOURS * 1e6, rel=1e-4)
            continue
        assert counts, name
        assert c.per_million_gpu_hours.value == pytest.approx(counts[-1] / LLAMA3_GPU_HOURS * 1e6, rel=1e-4), name
    # the unexpected ones add up to the 419 of the paper
    assert data.rate_per_gpu_hour() * LLAMA3_GPU_HOURS == pytest.approx(419, rel=1e-4)


def test_every_cluster_has_reliability_and_storage_data():
    for name in cluster_names():
        c = load_cluster(name)
        assert c.reliability.components and c.storage.write_gbps.value > 0
    assert "llama3-h100" in reliability_names()


def test_a_declared_range_must_hold_its_value():
    with pytest.raises(ValueError, match="outside its range"):
        Declared(value=5, low=6, high=7, source="x")


def test_mtbf_override_keeps_the_mix():
    data = load_reliability()
    scaled = data.with_mtbf_gpu_hours(25_000)
    assert 1 / scaled.rate_per_gpu_hour() == pytest.approx(25_000)
    assert scaled.rate_per_gpu_hour(planned=True) == data.rate_per_gpu_hour(planned=True)
    share = {n: c.per_million_gpu_hours.value / data.rate_per_gpu_hour() for n, c in data.components.items()
             if not c.planned}
    for n, c in scaled.components.items():
        if not c.planned:
            assert c.per_million_gpu_hours.value / scaled.rate_per_gpu_hour() == pytest.approx(share[n])


def test_a_cluster_file_names_its_own_reliability_and_storage(tmp_path):
    path = tmp_path / "c.yaml"
    base = (SPEC_DIR / "clusters" / "dgx-h100.yaml").read_text()
    path.write_text(base + "reliability: llama3-h100\nstorage:\n  write_gbps: {value: 100, low: 50, high: 200, "
                           "source: \"our file system\"}\n")
    c = load_cluster(str(path))
    assert c.storage.write_gbps.value == 100
    path.write_text(base + "reliability: no-such-data\n")
    with pytest.raises(ConfigError, match="unknown reliability data"):
        load_cluster(str(path))
    path.write_text(base + "storage:\n  write_gbps: {value: 0, low: 0, high: 1, source: \"x\"}\n")
    with pytest.raises(ConfigError, match="write_gbps"):
        load_cluster(str(path))
    path.write_text(base + "storage:\n  write_gbps: {value: 1, low: 1, high: 2e6, source: \"x\"}\n")
    with pytest.raises(ConfigError, match="write_gbps"):  # past the flag's bound
        load_cluster(str(path))


# --- a cluster file's own reliability and storage blocks: every refusal names the file and the field --------

def _declared_fields() -> list[str]:
    from simulator.spec.reliability import Component, RestartCosts, StorageSpec

    return ([f"storage.{name}" for name in StorageSpec.model_fields]
            + [f"reliability.restart.{name}" for name in RestartCosts.model_fields]
            + [f"reliability.components.gpu.{name}" for name, f in Component.model_fields.items()
               if f.annotation is Declared])


def _write_cluster(tmp_path, field: str, edit) -> str:
    import yaml

    from simulator.spec.reliability import StorageSpec

    data = yaml.safe_load((SPEC_DIR / "clusters" / "dgx-h100.yaml").read_text())
    data["reliability"] = load_reliability().model_dump(mode="json")
    data["storage"] = StorageSpec().model_dump(mode="json")
    *parents, last = field.split(".")
    block = data
    for name in parents:
        block = block[name]
    edit(block, last)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("field", _declared_fields())
def test_a_declared_number_out_of_range_names_the_file_and_the_field(tmp_path, field):
    def negative(block, last):
        block[last].update(value=-1.0, low=-1.0)

    def outside(block, last):
        block[last].update(value=2.0, low=3.0, high=4.0)

    def no_source(block, last):
        block[last]["source"] = ""

    def not_finite(block, last):
        block[last]["high"] = float("inf")

    for edit in (negative, outside, no_source, not_finite):
        path = _write_cluster(tmp_path, field, edit)
        with pytest.raises(ConfigError) as exc:
            load_cluster(path)
        message = str(exc.value)
        assert path in message and f"'{field}" in message, (edit.__name__, message)


@pytest.mark.parametrize("field,value", [
    ("reliability.components.gpu.planned", "yes"),
    ("reliability.components.gpu.replaces_node", 1),
    ("reliability.components", {}),
    ("reliability.name", 5),
    ("storage", "fast"),
    ("reliability", 5),
])
def test_a_malformed_reliability_or_storage_field_names_the_file_and_the_field(tmp_path, field, value):
    path = _write_cluster(tmp_path, field, lambda block, last: block.__setitem__(last, value))
    with pytest.raises(ConfigError) as exc:
        load_cluster(path)
    assert path in str(exc.value) and f"'{field}" in str(exc.value), str(exc.value)


def test_a_bandwidth_range_past_the_flags_names_the_file_and_the_field(tmp_path):
    path = _write_cluster(tmp_path, "storage.read_gbps",
                          lambda block, last: block[last].update(value=1e-4, low=1e-4, high=1.0))
    with pytest.raises(ConfigError, match=r"cluster\.yaml' field 'storage\.read_gbps': read_gbps spans"):
        load_cluster(path)


def test_reliability_data_a_cluster_file_names_is_refused_naming_both(tmp_path):
    bad = tmp_path / "rates.yaml"
    bad.write_text("name: x\nderivation: y\ncomponents: {}\nrestart: {}\n")
    path = tmp_path / "c.yaml"
    path.write_text((SPEC_DIR / "clusters" / "dgx-h100.yaml").read_text() + f"reliability: {bad}\n")
    with pytest.raises(ConfigError) as exc:
        load_cluster(str(path))
    assert str(path) in str(exc.value) and str(bad) in str(exc.value) and "'components'" in str(exc.value)
