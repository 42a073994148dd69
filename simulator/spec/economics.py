"""What a run costs beside its days: price per GPU-hour, power, PUE and grid carbon, as hardware data.

Like every constant no measurement pins, each is declared with its value, range and source (``Declared``), read
from ``hardware_specs/economics/*.yaml``: per GPU kind its price per GPU-hour and the power of one GPU and of a
whole node under a training load; per site its PUE and the grid's carbon intensity. A cluster's figures
(``ClusterEconomics``) are its GPU kind's, with any of them replaced by a flag, which pins it to the given value.

The derived figures are plain products: cost = GPU-hours x price; energy = GPU-hours x the node's power over its
GPUs x PUE (the node's draw counts its CPUs, NICs and fans beside the GPUs; PUE the facility's cooling and
conversion); emissions = energy x carbon intensity (kg CO2e per kWh is t CO2e per MWh).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hardware_specs import SPEC_DIR
from simulator.spec import limits
from simulator.spec._io import build, exists, read_mapping
from simulator.spec.errors import ConfigError
from simulator.spec.hardware import ClusterSpec
from simulator.spec.reliability import Declared

DEFAULT_ECONOMICS = "default"
ENDS = ("low", "value", "high")


def pinned(value: float, source: str = "given by a flag") -> Declared:
    """A value a user gave: its range is the value itself."""
    return Declared(value=value, low=value, high=value, source=source)


class GpuEconomics(BaseModel):
    """Price and power of one GPU kind."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    price_per_gpu_hour_usd: Declared = Field(description="What one GPU-hour is billed, US dollars.")
    gpu_power_w: Declared = Field(description="One GPU's draw under a training load, W.")
    node_power_w: Declared = Field(description="A whole node's draw under a training load (its GPUs, CPUs, NICs and "
                                               "fans), W.")
    node_gpus: int = Field(gt=0, le=limits.MAX_GPUS_PER_NODE, description="GPUs of the node node_power_w is for.")

    @model_validator(mode="after")
    def _node_draws_at_least_its_gpus(self) -> "GpuEconomics":
        for end in ENDS:
            gpus_w = self.node_gpus * self.gpu_power_w.at(end)
            if gpus_w > self.node_power_w.at(end):
                raise ValueError(f"node_power_w at its {end} end ({self.node_power_w.at(end):g} W) is less than its "
                                 f"{self.node_gpus} GPUs draw there ({gpus_w:g} W); raise node_power_w or lower "
                                 "gpu_power_w")
        return self

    @property
    def power_w_per_gpu(self) -> Declared:
        """A GPU's share of its node's draw: what a GPU-hour of the job costs the site in power."""
        n = self.node_gpus
        p = self.node_power_w
        return Declared(value=p.value / n, low=p.low / n, high=p.high / n,
                        source=f"node_power_w over its {n} GPUs ({p.source})")


class SiteEconomics(BaseModel):
    """The facility and the grid it draws from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pue: Declared = Field(description="Power usage effectiveness: the facility's draw over its IT equipment's.")
    grid_kg_co2e_per_kwh: Declared = Field(description="Carbon intensity of the electricity, kg CO2e per kWh.")

    @model_validator(mode="after")
    def _pue_is_at_least_one(self) -> "SiteEconomics":
        if self.pue.low < 1:
            raise ValueError(f"pue spans {self.pue.low:g} to {self.pue.high:g}; a facility draws at least what its "
                             "IT equipment does, so its PUE is at least 1")
        return self


class Economics(BaseModel):
    """Prices and power per GPU kind, and the site's PUE and carbon intensity, each declared with a range."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    derivation: str = Field(description="How the defaults derive from the published figures.")
    currency: Literal["USD"]
    gpus: dict[str, GpuEconomics] = Field(min_length=1, description="GPU kind (a GPU spec's name) -> its figures.")
    site: SiteEconomics


class ClusterEconomics(BaseModel):
    """One cluster's figures, after the flags: what its GPU-hours cost in money, energy and emissions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: str
    price_per_gpu_hour_usd: Declared
    power_w_per_gpu: Declared = Field(description="A GPU's share of its node's draw under a training load, W.")
    pue: Declared
    grid_kg_co2e_per_kwh: Declared

    def cost_usd(self, gpu_hours: float, end: str = "value") -> float:
        return gpu_hours * self.price_per_gpu_hour_usd.at(end)

    def energy_mwh(self, gpu_hours: float, end: str = "value") -> float:
        return gpu_hours * self.power_w_per_gpu.at(end) * self.pue.at(end) / 1e6

    def tco2e(self, gpu_hours: float, end: str = "value") -> float:
        """t CO2e: MWh x kg per kWh (the same ratio as t per MWh)."""
        return self.energy_mwh(gpu_hours, end) * self.grid_kg_co2e_per_kwh.at(end)


def economics_for(cluster: ClusterSpec, data: Economics, price_per_gpu_hour_usd: float | None = None,
                  pue: float | None = None, grid_kg_co2e_per_kwh: float | None = None) -> ClusterEconomics:
    """``cluster``'s figures from ``data`` by its GPU kind; a figure given (a flag) replaces the declared one."""
    gpu = data.gpus.get(cluster.gpu.name)
    if gpu is None:
        raise ConfigError(f"economics data {data.name!r} has no price or power for GPU {cluster.gpu.name!r} (cluster "
                          f"{cluster.name!r}); give an --economics file with an entry for it, or use a cluster of "
                          f"{', '.join(sorted(data.gpus))}")
    return ClusterEconomics(
        cluster=cluster.name,
        price_per_gpu_hour_usd=(gpu.price_per_gpu_hour_usd if price_per_gpu_hour_usd is None
                                else pinned(price_per_gpu_hour_usd)),
        power_w_per_gpu=gpu.power_w_per_gpu,
        pue=data.site.pue if pue is None else pinned(pue),
        grid_kg_co2e_per_kwh=(data.site.grid_kg_co2e_per_kwh if grid_kg_co2e_per_kwh is None
                              else pinned(grid_kg_co2e_per_kwh)))


def _files() -> dict[str, Path]:
    return {p.stem: p for p in sorted((SPEC_DIR / "economics").glob("*.yaml"))}


def economics_names() -> list[str]:
    return list(_files())


@lru_cache(maxsize=None)
def _preset(path: Path) -> Economics:
    return build(Economics, read_mapping(path, "economics data"), f"economics data {str(path)!r}", strict=True)


def load_economics(name_or_path: str = DEFAULT_ECONOMICS) -> Economics:
    """An economics preset (``default``) or a YAML file of ``Economics`` fields."""
    path = _files().get(name_or_path)
    if path is not None:
        return _preset(path)
    path = Path(name_or_path)
    if not exists(path, "economics data"):
        raise ConfigError(f"unknown economics data {name_or_path!r}; use one of {', '.join(economics_names())} or a "
                          "YAML file")
    return build(Economics, read_mapping(path, "economics data"), f"economics data {str(path)!r}", strict=True)
