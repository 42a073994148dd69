"""The report's steps and their cache: a step reruns only when something that produces it changed.

A step's key hashes its name, its parameters, the keys of the steps it reads, and everything the
numbers come from: the package's code (but the figure drawing), the hardware specs, the published
profiles and tables, the reference runs, and the versions of the numerical libraries. A figure's
key hashes the data it draws, the drawing code and matplotlib's version. A cached step is stored as
JSON and a fresh one goes through the same JSON round trip before anything reads it, so a rerun
from the cache writes the same bytes as the run that filled it.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from simulator.spec._io import write_output

PACKAGE = Path(__file__).resolve().parent.parent
REPO = PACKAGE.parent
# keyed with the figures, not with the numbers
DRAWING = ("outputs/plots_base.py", "outputs/plots.py", "outputs/plots_goodput.py", "outputs/plots_capacity.py")
DATA = ("hardware_specs/**/*.yaml", "calibration/profiles/*.json", "calibration/published/**/*",
        "calibration/reference/*.yaml", "reports/cpu-validation/*.json")
LIBRARIES = ("numpy", "scipy", "simpy", "networkx", "pydantic")


def _hash_files(paths: list[Path], h) -> None:
    for path in sorted(paths):
        h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")


def _versions(names: tuple[str, ...]) -> str:
    out = [platform.python_version()]
    for name in names:
        try:
            out.append(f"{name}={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(f"{name}=absent")
    return ";".join(out)


@lru_cache(maxsize=1)
def inputs_digest() -> str:
    """What every step's numbers come from: code, data and library versions."""
    h = hashlib.sha256(_versions(LIBRARIES).encode())
    code = [p for p in PACKAGE.rglob("*.py")
            if str(p.relative_to(PACKAGE)) not in DRAWING and "cli" not in p.relative_to(PACKAGE).parts]
    _hash_files(code, h)
    _hash_files([p for pattern in DATA for p in REPO.glob(pattern) if p.is_file()], h)
    return h.hexdigest()


@lru_cache(maxsize=1)
def drawing_digest() -> str:
    h = hashlib.sha256(_versions(("matplotlib",)).encode())
    _hash_files([PACKAGE / name for name in DRAWING], h)
    return h.hexdigest()


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    """A temporary file beside ``path`` renamed over it: a full disk leaves the old entry whole, not a cut-off
    one, and is one sentence (``OutputError``)."""
    write_output(path, data, "the report's cache entry")


@dataclass(frozen=True)
class Step:
    """One part of the report: ``compute`` gets the data of the steps named in ``deps``."""

    name: str
    compute: Callable[[dict[str, Any]], dict[str, Any]]
    deps: tuple[str, ...] = ()
    params: Any = None


@dataclass
class ReportCache:
    """Runs steps and draws figures, reusing what ``folder`` holds (no folder: no cache)."""

    folder: Path | None
    hits: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)

    def _load(self, path: Path, key: str) -> Any:
        if self.folder is None or not path.exists():
            return None
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            return None  # a damaged entry is recomputed
        return entry.get("value") if isinstance(entry, dict) and entry.get("key") == key else None

    def run(self, steps: list[Step], progress: Callable[[str, bool, int, int], None] | None = None) -> dict[str, Any]:
        """Every step's data, by name, computing only those whose key changed."""
        results: dict[str, Any] = {}
        keys: dict[str, str] = {}
        for i, step in enumerate(steps, 1):
            key = keys[step.name] = _key(step.name, step.params, inputs_digest(), [keys[d] for d in step.deps])
            path = self.folder / f"{step.name}.json" if self.folder is not None else None
            data = self._load(path, key) if path is not None else None
            cached = data is not None
            if progress is not None:
                progress(step.name, cached, i, len(steps))
            if not cached:
                text = json.dumps(step.compute({d: results[d] for d in step.deps}))  # keeps the order of keys
                data = json.loads(text)
                if path is not None:
                    _write_atomic(path, f'{{"key": "{key}", "value": {text}}}'.encode())
            (self.hits if cached else self.misses).append(step.name)
            results[step.name] = data
        return results

    def _figure_entry(self, name: str, kind: str, data: dict[str, Any]) -> tuple[str, Path | None, Any]:
        key = _key(kind, data, drawing_digest())
        png = self.folder / "figures" / f"{name}.png" if self.folder is not None else None
        summary = self._load(png.with_suffix(".json"), key) if png is not None and png.exists() else None
        return key, png, summary

    def has_figure(self, name: str, kind: str, data: dict[str, Any]) -> bool:
        return self._figure_entry(name, kind, data)[2] is not None

    def figure(self, name: str, kind: str, data: dict[str, Any], path: Path) -> dict[str, Any]:
        """Draw figure ``kind`` of ``data`` into ``path`` (a copy of the cached PNG if it is the same);
        return what it shows."""
        key, png, summary = self._figure_entry(name, kind, data)
        if summary is not None:
            try:
                cached = png.read_bytes()
            except OSError:
                cached = None  # an unreadable entry is redrawn
            if cached is not None:
                # written as a fresh figure is: a full disk leaves no cut-off PNG under the final name
                write_output(path, cached, "figure")
                self.hits.append(f"figure {name}")
                return summary
        from simulator.outputs.figures import draw

        summary = json.loads(json.dumps(draw(kind, data, path)))
        if png is not None:
            _write_atomic(png, path.read_bytes())
            _write_atomic(png.with_suffix(".json"), json.dumps({"key": key, "value": summary}, sort_keys=True).encode())
        self.misses.append(f"figure {name}")
        return summary
