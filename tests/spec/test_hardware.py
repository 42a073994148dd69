"""GPU and cluster specs: every preset loads, numbers carry sources, files ship with the package."""

from __future__ import annotations

import configparser
import fnmatch
from pathlib import Path

import pytest

from hardware_specs import SPEC_DIR
from simulator.spec.errors import ConfigError
from simulator.spec.hardware import GIB, cluster_names, gpu_names, load_cluster, load_gpu

REPO = Path(__file__).resolve().parents[2]
CLUSTERS = ["dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "dgx-h200"]
GPUS = {"A100-SXM4-40GB": 40, "A100-SXM4-80GB": 80, "H100-SXM5-80GB": 80, "H200-SXM-141GB": 140.4}  # GiB the device exposes


def test_the_presets_exist():
    assert set(CLUSTERS) <= set(cluster_names())
    assert set(GPUS) <= set(gpu_names())


@pytest.mark.parametrize("name,gib", GPUS.items())
def test_gpu_memory(name, gib):
    gpu = load_gpu(name)
    assert gpu.memory_bytes == int(gib * GIB)
    assert load_gpu(name.lower()) == gpu


@pytest.mark.parametrize("name", CLUSTERS)
def test_clusters_are_dgx_nodes_with_sources(name):
    c = load_cluster(name)
    assert c.gpus_per_node == 8 and c.nvswitch
    assert c.nics_per_node == 8
    assert set(c.sources) >= {"gpus_per_node", "nvlink_bandwidth_gbps_per_direction", "nic_line_rate_gbit_s"}
    # one NIC per GPU: each GPU gets one NIC's line rate, in bytes
    assert c.nic_bandwidth_gbps_per_gpu == pytest.approx(c.nic_line_rate_gbit_s / 8)


def test_a100_80gb_numbers():
    c = load_cluster("dgx-a100-80gb")
    assert (c.gpu.peak_tflops.bf16, c.nvlink_bandwidth_gbps_per_direction, c.nic_line_rate_gbit_s) == (312, 300, 200)


def test_unknown_names_and_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="unknown cluster 'dgx-z'.*dgx-a100-80gb"):
        load_cluster("dgx-z")
    with pytest.raises(ConfigError, match="unknown GPU 'B300'"):
        load_gpu("B300")
    path = tmp_path / "c.yaml"
    path.write_text("name: x\ngpu: A100-SXM4-80GB\ngpus_per_node: 0\n")
    with pytest.raises(ConfigError, match="gpus_per_node"):
        load_cluster(str(path))
    path.write_text("gpu: [A100\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_cluster(str(path))


def test_a_number_without_a_source_is_rejected(tmp_path):
    src = (SPEC_DIR / "gpus" / "a100-sxm4-80gb.yaml").read_text()
    path = tmp_path / "g.yaml"
    path.write_text(src.replace("  tdp_w:", "  no_longer_tdp_w:"))
    with pytest.raises(ConfigError, match="tdp_w"):
        load_gpu(str(path))


def _package_data() -> dict[str, list[str]]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    section = cfg["options.package_data"]
    return {pkg: [p.strip() for p in value.replace("\n", ",").split(",") if p.strip()] for pkg, value in section.items()}


def _declared(path: Path, data: dict[str, list[str]]) -> bool:
    for pkg, patterns in data.items():
        root = REPO / pkg.replace(".", "/")
        if root in path.parents:
            rel = path.relative_to(root).as_posix()
            if any(fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(rel, pat.replace("**/", "")) for pat in patterns):
                return True
    return False


def test_spec_files_and_published_data_are_declared_package_data():
    """An installed wheel must find the YAML specs and the reference data, not only a checkout."""
    data = _package_data()
    shipped = sorted(SPEC_DIR.rglob("*.yaml")) + sorted((REPO / "calibration" / "published").iterdir())
    assert shipped
    missing = [str(p.relative_to(REPO)) for p in shipped if not _declared(p, data)]
    assert not missing, f"not declared in setup.cfg [options.package_data]: {missing}"
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    assert "simulator = simulator.cli:main" in cfg["options.entry_points"]["console_scripts"]
    include = cfg["options.packages.find"]["include"].split()
    assert {"simulator", "hardware_specs", "calibration"} <= set(include)
    assert (REPO / "calibration" / "__init__.py").is_file()
