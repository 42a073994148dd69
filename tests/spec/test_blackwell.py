"""Blackwell hardware data: every number of the B200 and GB200 specs has a value, a range and a source."""

from __future__ import annotations

import pytest

from hardware_specs import SPEC_DIR
from simulator.spec.errors import ConfigError
from simulator.spec.hardware import GIB, GpuSpec, PeakTflops, load_gpu

BLACKWELL_GPUS = {"B200-SXM-180GB": 183_359, "GB200-186GB": 189_471}  # MiB the device exposes (nvidia-smi)


def _numbers(spec: GpuSpec) -> list[str]:
    """Every number of a GPU spec, peaks by their dotted name."""
    peaks = [f"peak_tflops.{k}" for k in PeakTflops.model_fields if getattr(spec.peak_tflops, k) is not None]
    plain = [k for k, f in GpuSpec.model_fields.items()
             if f.annotation in (int, float) and getattr(spec, k) is not None]
    return peaks + plain


@pytest.mark.parametrize("name", BLACKWELL_GPUS)
def test_every_blackwell_number_has_value_range_and_source(name):
    gpu = load_gpu(name)
    assert gpu.architecture == "blackwell"
    numbers = _numbers(gpu)
    assert {"peak_tflops.bf16", "peak_tflops.fp8", "peak_tflops.mxfp8", "hbm_capacity_gib", "hbm_bandwidth_gbps",
            "nvlink_bandwidth_gbps_per_direction", "tdp_w"} <= set(numbers)
    assert set(gpu.ranges) == set(numbers), "a Blackwell number without a range"
    for key in {n.split(".")[0] for n in numbers}:
        assert gpu.sources[key].strip(), key
    # MXFP8 runs on the FP8 tensor cores: the same peak, the same range
    assert gpu.peak_tflops.mxfp8 == gpu.peak_tflops.fp8
    assert gpu.ranges["peak_tflops.mxfp8"] == gpu.ranges["peak_tflops.fp8"]


@pytest.mark.parametrize("name,mib", BLACKWELL_GPUS.items())
def test_blackwell_memory_is_what_the_device_exposes(name, mib):
    assert load_gpu(name).hbm_capacity_gib == pytest.approx(mib / 1024, abs=0.01)
    assert load_gpu(name).memory_bytes == pytest.approx(mib * 2**20, rel=1e-4)
    assert load_gpu(name).memory_bytes > 160 * GIB


def test_gpus_before_blackwell_have_no_mxfp8():
    for name in ("A100-SXM4-80GB", "H100-SXM5-80GB", "H200-SXM-141GB"):
        assert load_gpu(name).peak_tflops.mxfp8 is None


def _edited(tmp_path, old: str, new: str) -> str:
    src = (SPEC_DIR / "gpus" / "b200-sxm-180gb.yaml").read_text()
    assert old in src
    path = tmp_path / "g.yaml"
    path.write_text(src.replace(old, new))
    return str(path)


def test_a_value_outside_its_declared_range_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"tdp_w=1000 lies outside its range \[700, 900\]"):
        load_gpu(_edited(tmp_path, "tdp_w: [700, 1000]", "tdp_w: [700, 900]"))


def test_a_range_must_name_a_number_of_the_spec(tmp_path):
    with pytest.raises(ConfigError, match="ranges names 'peak_tflops.fp4'"):
        load_gpu(_edited(tmp_path, "  tdp_w: [700, 1000]", "  tdp_w: [700, 1000]\n  peak_tflops.fp4: [1, 2]"))


# --- the published-data profiles ---------------------------------------------------------------------------------

def _job(cluster: str, **plan):
    from simulator.spec.catalog import load_model
    from simulator.spec.hardware import load_cluster
    from simulator.spec.plan import Job, ParallelPlan
    return Job(model=load_model("llama3-70b"), cluster=load_cluster(cluster),
               plan=ParallelPlan(**{"tensor_parallel_size": 8, "sequence_parallel": True, "global_batch_size": 8,
                                    "data_parallel_size": 8, **plan}))


@pytest.mark.parametrize("cluster,gpu", [("dgx-b200", "B200-SXM-180GB"), ("gb200-nvl72", "GB200-186GB")])
def test_a_blackwell_plan_lies_outside_every_measured_regime_with_the_widened_band(cluster, gpu):
    from simulator.estimator.regime import OUTSIDE_WIDENING, band_table, regime_of
    regime = regime_of(_job(cluster), mfu=0.3)
    widest = max(g["half_width"] for g in band_table()["gpus"].values())
    assert regime.name is None and regime.outside == (f"no measured run on {gpu}",)
    assert regime.half_width == pytest.approx(widest * OUTSIDE_WIDENING)


@pytest.mark.parametrize("gpu", BLACKWELL_GPUS)
def test_each_blackwell_gpu_has_a_published_profile_from_blackwell_microbenchmarks(gpu):
    from simulator.cost.profile import load_profile
    p = load_profile(f"{gpu.lower()}-published")
    assert p.gpu == gpu and p.source == "published"
    assert "B200" in p.gemm.sources["ceiling_efficiency"] and "B200" in p.gemm_fp8.sources["ceiling_efficiency"]
    assert "8x B200" in p.collectives.nvlink.sources["max_busbw_gbps"]
    assert "FA4 on B200" in p.attention.sources["forward_efficiency"]
    # NVLink 5's measured ring is faster than any Hopper's: the profile reads Blackwell's own sweep
    hopper = load_profile("h200-sxm-141gb-published").collectives.nvlink
    assert p.collectives.nvlink.max_busbw_gbps > hopper.max_busbw_gbps
    # the one Blackwell inter-node measurement (EFA) widens the network's range, never moves its value
    low, high = p.collectives.network.ranges["max_busbw_gbps"]
    assert low < p.collectives.network.max_busbw_gbps == high


def test_the_gb200_takes_the_b200s_fraction_of_peak_with_a_range_down_to_the_b200s_throughput():
    from simulator.cost.profile import load_profile
    b200, gb200 = load_profile("b200-sxm-180gb-published"), load_profile("gb200-186gb-published")
    assert gb200.gemm.ceiling_efficiency == pytest.approx(b200.gemm.ceiling_efficiency)
    ratio = load_gpu("B200-SXM-180GB").peak_tflops.bf16 / load_gpu("GB200-186GB").peak_tflops.bf16
    low, high = gb200.gemm.ranges["max_efficiency"]
    assert (low, high) == pytest.approx((gb200.gemm.max_efficiency * ratio, gb200.gemm.max_efficiency))
    assert gb200.attention.forward_efficiency == pytest.approx(b200.attention.forward_efficiency)
    assert gb200.attention.ranges["forward_efficiency"][0] == pytest.approx(b200.attention.forward_efficiency * ratio)


def test_simulator_clusters_lists_the_blackwell_presets_with_their_nvlink_domains():
    import json

    from click.testing import CliRunner

    from simulator.cli import cli
    out = CliRunner().invoke(cli, ["clusters", "--json"])
    assert out.exit_code == 0, out.output
    rows = {r["name"]: r for r in json.loads(out.output)}
    assert rows["dgx-b200"]["published_profile"] == "b200-sxm-180gb-published"
    assert rows["gb200-nvl72"]["published_profile"] == "gb200-186gb-published"
    assert (rows["gb200-nvl72"]["gpus_per_node"], rows["gb200-nvl72"]["nvlink_domain_gpus"],
            rows["gb200-nvl72"]["ranks_per_nvlink_domain"]) == (4, 72, 64)
    assert (rows["dgx-h100"]["nvlink_domain_gpus"], rows["dgx-h100"]["ranks_per_nvlink_domain"]) == (8, 8)
    assert rows["gb200-nvl72"]["peak_tflops"]["mxfp8"] == 5000
