"""`search` says when `--rank-by point` would put another plan first than its own ranking (by the band's slow
end), and MFU says everywhere it is printed that it counts attention's full s x s product."""

from __future__ import annotations

import json
from types import SimpleNamespace

from click.testing import CliRunner

from simulator.cli import cli
from simulator.cli.search_cmd import rank_by_point_pick
from simulator.planner.space import RankBy

# the band's slow end ranks the TP 1 plan first; a TP 2 plan is predicted faster (its band reaches further out)
FLIPPED = ["--model", "gpt3-1.3b", "--gpus", "32", "--gbs", "64", "--no-distributed-optimizer"]
# the plan predicted fastest (sharded over DP, outside every measured regime) is ranked beyond the three listed
FLIPPED_UNLISTED = ["--model", "gpt3-1.3b", "--gpus", "64", "--gbs", "512"]


def run(*args: str):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _plans(*times_s: float) -> list:
    return [SimpleNamespace(rank=i, estimate=SimpleNamespace(iteration_time_s=t)) for i, t in enumerate(times_s, 1)]


def test_the_pick_is_the_first_of_the_fastest_and_none_where_the_first_plan_is_fastest():
    upper = SimpleNamespace(rank_by=RankBy.upper)
    assert rank_by_point_pick(_plans(1.0, 0.9, 0.9, 1.1), upper).rank == 2
    assert rank_by_point_pick(_plans(1.0, 1.0, 1.2), upper) is None  # a tie keeps the ranking's first
    assert rank_by_point_pick(_plans(1.0, 0.9), SimpleNamespace(rank_by=RankBy.point)) is None
    assert rank_by_point_pick(_plans(1.0, 0.9), SimpleNamespace(rank_by=RankBy.expected_days)).rank == 2


def test_search_names_the_plan_rank_by_point_would_pick_and_it_is_the_plan_rank_by_point_picks():
    doc = json.loads(run("search", *FLIPPED, "--json"))
    pick = doc["rank_by_point_pick"]
    assert pick is not None, "the two rankings agree on this search; choose one where they differ"
    first = doc["plans"][0]
    assert pick["rank"] > 1 and pick["listed"] and pick["iteration_time_s"] < first["iteration_time_s"]
    assert pick["rank_key_s"] >= first["rank_key_s"]
    point = json.loads(run("search", *FLIPPED, "--rank-by", "point", "--json"))
    assert point["plans"][0]["plan"] == pick["plan"] and point["rank_by_point_pick"] is None
    text = run("search", *FLIPPED)
    line = next(line for line in text.splitlines() if line.startswith("--rank-by point would pick"))
    assert f"{pick['plan_name']} (#{pick['rank']})" in line and "band's slow end" in line


def test_a_pick_beyond_the_plans_listed_is_named_as_such():
    doc = json.loads(run("search", *FLIPPED_UNLISTED, "--json", "--top", "3"))
    pick = doc["rank_by_point_pick"]
    assert pick is not None and pick["rank"] > 3 and not pick["listed"] and len(doc["plans"]) == 3
    point = json.loads(run("search", *FLIPPED_UNLISTED, "--rank-by", "point", "--json", "--top", "1"))
    assert point["plans"][0]["plan"] == pick["plan"]
    assert "not among the 3 listed" in run("search", *FLIPPED_UNLISTED, "--top", "3")


def test_where_mfu_is_printed_it_says_attention_counts_the_full_s_x_s_product():
    plan = ["plan", "--model", "gpt3-1.3b"]
    assert "attention counted full s x s, as Megatron reports MFU" in run(*plan)
    assert json.loads(run(*plan, "--json"))["mfu_attention_count"] == "full s x s"
    search = ["search", "--model", "gpt3-1.3b", "--gpus", "8", "--gbs", "64", "--top", "2"]
    assert "MFU counts attention full s x s, as Megatron reports it" in run(*search)
    doc = json.loads(run(*search, "--json"))
    assert doc["mfu_attention_count"] == "full s x s"
    assert {p["mfu_attention_count"] for p in doc["plans"]} == {"full s x s"}
