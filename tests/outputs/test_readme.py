"""The README's first screen says what `search` does: the order its plans come in is the order the search's
default ranks by, and every column of days the search prints is explained there."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from simulator.cli import cli
from simulator.cli.search_cmd import search_command

README = Path(__file__).resolve().parents[2] / "README.md"
# what the first screen must say for each ranking the search can default to
RANK_WORDS = {"upper": "ranked by the slow\nend of their band", "point": "ranked by the predicted time",
              "expected-days": "ranked by the expected days"}


def _first_screen() -> str:
    text = README.read_text(encoding="utf-8")
    return text[:text.index("## Quick start")]


def test_the_first_screen_says_the_order_the_search_ranks_by():
    default = next(p.default for p in search_command.params if p.name == "rank_by")
    screen = _first_screen()
    assert " ".join(RANK_WORDS[default].split()) in " ".join(screen.split())
    if default != "point":
        assert "fastest first" not in screen, "the search does not rank by time alone"


def test_every_column_of_days_the_search_prints_is_explained():
    result = CliRunner().invoke(cli, ["search", "--model", "gpt3-1.3b", "--gpus", "8", "--gbs", "16", "--tokens", "1e9",
                                      "--top", "1"])
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if line.lstrip().startswith("#  plan"))
    columns = header.split("peak GiB", 1)[1].split()
    assert columns == ["days", "expected"], header
    screen = _first_screen()
    for column in columns:
        assert f"- **{column}**" in screen, f"the README's first screen does not explain the {column!r} column"
