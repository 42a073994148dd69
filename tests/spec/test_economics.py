"""Price, power, PUE and carbon as hardware data: every figure has a value, a range that holds it and a source; the
list prices derive from the instance prices their sources quote; the derived figures are the products they claim."""

from __future__ import annotations

import re

import pytest

from simulator.spec.economics import economics_for, economics_names, load_economics, pinned
from simulator.spec.errors import ConfigError
from simulator.spec.hardware import cluster_names, load_cluster, load_gpu

H100_TO_H200 = 5.408 / 4.916  # EC2 Capacity Block rates per accelerator-hour, as the data's derivation quotes
B200_TO_GB200 = (42.00 / 4) / (68.80 / 8)  # CoreWeave on-demand per GPU-hour: a GB200 NVL72 tray over an HGX B200 node
DERIVED = {"H200-SXM-141GB": ("H100-SXM5-80GB", H100_TO_H200),  # kind: (the kind it scales, by how much)
           "GB200-186GB": ("B200-SXM-180GB", B200_TO_GB200)}


def _instance_price(source: str) -> float:
    found = re.findall(r"\$([\d.]+) per instance-hour for (\d+) GPUs", source)
    assert found, source
    price, gpus = found[0]
    return float(price) / int(gpus)


def test_each_high_price_is_its_instance_list_price_over_its_gpus():
    data = load_economics()
    for name, gpu in data.gpus.items():
        p = gpu.price_per_gpu_hour_usd
        if name in DERIVED:  # another kind's prices scaled by the ratio the source names
            base_name, ratio = DERIVED[name]
            base = data.gpus[base_name].price_per_gpu_hour_usd
            for end in ("low", "value", "high"):
                assert p.at(end) == pytest.approx(base.at(end) * ratio, abs=0.005), (name, end)
            assert _instance_price(p.source) * ratio == pytest.approx(p.high, abs=0.005), name
            continue
        assert _instance_price(p.source) == pytest.approx(p.high, abs=0.005), name
    assert _instance_price(data.gpus["B200-SXM-180GB"].price_per_gpu_hour_usd.source) == pytest.approx(113.9328 / 8)


def test_a_gpu_draws_at_most_its_datasheet_tdp_and_a_node_at_most_its_maximum():
    data = load_economics()
    for name, gpu in data.gpus.items():
        assert gpu.gpu_power_w.high <= load_gpu(name).tdp_w, name
        kw = float(re.findall(r"([\d.]+) kW max system power", gpu.node_power_w.source)[0])
        assert gpu.node_power_w.high == pytest.approx(kw * 1000), name


def test_every_cluster_preset_is_priced_or_refused_naming_the_fix():
    data = load_economics()
    for name in ("dgx-a100-40gb", "dgx-a100-80gb", "a100-80gb-4x-hdr", "dgx-h100", "dgx-h200", "dgx-b200",
                 "gb200-nvl72"):
        assert economics_for(load_cluster(name), data).price_per_gpu_hour_usd.value > 0, name
    for name in cluster_names():
        cluster = load_cluster(name)
        if cluster.gpu.name in data.gpus:
            assert economics_for(cluster, data).power_w_per_gpu.value > 0, name
        else:  # a kind without public prices yet: one sentence that says how to give them
            with pytest.raises(ConfigError, match=f"no price or power for GPU {cluster.gpu.name!r}.*--economics"):
                economics_for(cluster, data)
    assert "default" in economics_names()


def test_the_derived_figures_recompute_from_the_data():
    data = load_economics()
    gpu, site = data.gpus["H100-SXM5-80GB"], data.site
    e = economics_for(load_cluster("dgx-h100"), data)
    gpu_hours = 1024 * 24 * 30.0  # 1,024 GPUs for 30 days
    for end in ("low", "value", "high"):
        kwh = gpu_hours * gpu.node_power_w.at(end) / gpu.node_gpus / 1000 * site.pue.at(end)
        assert e.cost_usd(gpu_hours, end) == pytest.approx(gpu_hours * gpu.price_per_gpu_hour_usd.at(end))
        assert e.energy_mwh(gpu_hours, end) == pytest.approx(kwh / 1000)
        assert e.tco2e(gpu_hours, end) == pytest.approx(kwh * site.grid_kg_co2e_per_kwh.at(end) / 1000)
    # the ends of the ranges bound the value
    assert e.cost_usd(gpu_hours, "low") < e.cost_usd(gpu_hours) < e.cost_usd(gpu_hours, "high")
    assert e.tco2e(gpu_hours, "low") < e.tco2e(gpu_hours) < e.tco2e(gpu_hours, "high")


def test_a_node_is_the_gpus_whose_power_it_shares():
    """A node's draw is shared by the GPUs of the system the datasheet is for: a DGX's 8, a GB200 NVL72 rack's 72 (its
    power shelves feed the trays and the NVLink switch trays together), not the preset's 4-GPU tray."""
    data = load_economics()
    for name in ("dgx-a100-80gb", "dgx-h100", "dgx-h200", "dgx-b200", "gb200-nvl72"):
        cluster = load_cluster(name)
        assert data.gpus[cluster.gpu.name].node_gpus == (cluster.nvlink_domain_gpus or cluster.gpus_per_node), name
    rack = data.gpus["GB200-186GB"]
    assert rack.node_gpus == 72 and rack.node_power_w.high == 132_000
    nvl72 = load_cluster("gb200-nvl72")
    e = economics_for(nvl72, data)
    for end in ("low", "value", "high"):  # each GPU carries 1/72 of its rack, 1.3-1.8 kW
        assert e.power_w_per_gpu.at(end) == pytest.approx(rack.node_power_w.at(end) / 72)
        assert 1_300 < e.power_w_per_gpu.at(end) < 1_850
    # a job of the preset takes 64 GPUs (16 trays) of each rack: for one hour of one rack it carries 64/72 of the draw
    used = nvl72.ranks_per_nvlink_domain
    assert used == 64
    assert e.energy_mwh(used, "high") == pytest.approx(132 / 1000 * 64 / 72 * e.pue.high)
    # a DGX B200's GPU carries an eighth of 14.3 kW
    assert economics_for(load_cluster("dgx-b200"), data).power_w_per_gpu.high == pytest.approx(14_300 / 8)


def test_a_flag_pins_its_figure():
    e = economics_for(load_cluster("dgx-a100-80gb"), load_economics(), price_per_gpu_hour_usd=1.5, pue=1.05,
                      grid_kg_co2e_per_kwh=0.02)
    assert (e.price_per_gpu_hour_usd.low, e.price_per_gpu_hour_usd.high) == (1.5, 1.5)
    assert e.cost_usd(100, "low") == e.cost_usd(100, "high") == 150
    assert e.pue.value == 1.05 and e.grid_kg_co2e_per_kwh.value == 0.02
    assert pinned(2.0).source == "given by a flag"


def test_a_gpu_without_data_is_one_sentence_naming_the_fix():
    with pytest.raises(ConfigError, match="no price or power for GPU 'CPU'.*--economics"):
        economics_for(load_cluster("local-cpu"), load_economics())


def test_a_node_that_draws_less_than_its_gpus_is_refused(tmp_path):
    path = tmp_path / "economics.yaml"
    path.write_text("""
name: mine
derivation: test
currency: USD
gpus:
  H100-SXM5-80GB:
    price_per_gpu_hour_usd: {value: 2, low: 2, high: 2, source: s}
    gpu_power_w: {value: 700, low: 700, high: 700, source: s}
    node_power_w: {value: 5000, low: 5000, high: 5000, source: s}
    node_gpus: 8
site:
  pue: {value: 1.2, low: 1.1, high: 1.6, source: s}
  grid_kg_co2e_per_kwh: {value: 0.4, low: 0.05, high: 0.7, source: s}
""")
    with pytest.raises(ConfigError, match="node_power_w at its low end .* less than its 8 GPUs draw"):
        load_economics(str(path))
    path.write_text(path.read_text().replace("node_power_w: {value: 5000, low: 5000, high: 5000",
                                             "node_power_w: {value: 9000, low: 9000, high: 9000")
                    .replace("pue: {value: 1.2, low: 1.1", "pue: {value: 1.2, low: 0.9"))
    with pytest.raises(ConfigError, match="PUE is at least 1"):
        load_economics(str(path))
    with pytest.raises(ConfigError, match="unknown economics data 'nope'"):
        load_economics("nope")
