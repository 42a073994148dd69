"""`simulator plot KIND`, `--plots DIR`, `search --all/--csv`, and outputs that say what they simulated."""

import csv
import json

import pytest
from click.testing import CliRunner

from simulator.cli import cli
from simulator.outputs.figures import KINDS, PLAN_KINDS, SEARCH_KINDS

SMALL_PLAN = ["--model", "gpt3-1.3b", "--gpus", "16", "--tp", "2", "--pp", "4", "--sp", "--gbs", "16"]
SMALL_SEARCH = ["--model", "gpt3-1.3b", "--gpus", "16", "--gbs", "32"]
MISTRAL = {"architectures": ["MistralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
           "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
           "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "sliding_window": 4096,
           "vocab_size": 32000}


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_plot_timeline_zoomed_writes_the_png_and_says_what_it_drew(tmp_path):
    out = tmp_path / "t.png"
    result = run("plot", "timeline", *SMALL_PLAN, "--steps", "0:6", "--out", out, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["kind"] == "timeline" and doc["path"] == str(out) and out.stat().st_size > 10_000
    assert doc["seq_length"] == 2048 and doc["precision"] == "bf16" and doc["attention_backend"] == "auto"
    assert "steps 0-5 of each stage" in doc["figure"]["axes"][0]["title"]
    assert doc["data"]["window"][2:] == [0, 6] and "intervals" not in doc["data"]


def test_plot_search_figures_pin_the_dimensions_given(tmp_path):
    result = run("plot", "pareto", *SMALL_SEARCH, "--tp", "2", "--out", tmp_path / "p.png", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["data"]["plans"] and all(p[4].startswith("TP2 ") for p in doc["data"]["plans"])
    text = run("plot", "time-breakdown", *SMALL_SEARCH, "--top", "3", "--out", tmp_path / "tb.png")
    assert text.exit_code == 0 and text.output.startswith("time-breakdown written to")


@pytest.mark.parametrize("args,needle", [
    (["plot", "timeline", "--steps", "5"], "--steps"),
    (["plot", "timeline", "--steps", "4:2"], "--steps"),
    (["plot", "timeline", "--model", "gpt3-1.3b", "--steps", "0:999"], "outside the"),
    (["plot", "pareto", "--model", "gpt3-1.3b"], "--gpus"),
    (["plot", "days-vs-gpus", "--gpus", "8", "--gbs", "8"], "--tokens"),
    (["plot", "mfu-vs-gpus", "--gpus", "8", "--gbs", "8", "--gpu-counts", "8,x"], "--gpu-counts"),
    (["plot", "sankey"], "sankey"),
])
def test_bad_plot_input_is_one_line_and_exit_2(args, needle):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.slow  # draws every figure of a plan (about 20 s)
def test_plan_plots_writes_every_figure_of_the_plan(tmp_path):
    result = run("plan", *SMALL_PLAN, "--plots", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    plots = json.loads(result.output)["plots"]
    assert set(plots) == set(PLAN_KINDS) | {"parity"}
    for path in plots.values():
        assert (tmp_path / path.rsplit("/", 1)[-1]).stat().st_size > 10_000


def test_search_plots_writes_every_figure(tmp_path):
    result = run("search", *SMALL_SEARCH, "--tokens", "10e9", "--plots", tmp_path)
    assert result.exit_code == 0, result.output
    assert sorted(p.stem for p in tmp_path.glob("*.png")) == sorted(set(KINDS) - {"moe-ep"})  # a dense model
    assert set(SEARCH_KINDS) <= set(KINDS)


def test_search_all_exports_every_screened_plan_as_json_and_csv(tmp_path):
    path = tmp_path / "plans.csv"
    result = run("search", *SMALL_SEARCH, "--json", "--all", "--csv", path)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    rows = doc["screened_plans"]
    assert len(rows) == doc["screened"] > doc["simulated"]
    times = [r["screen_time_s"] for r in rows]
    assert times == sorted(times) and [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    simulated = {p["iteration_time_s"] for p in doc["plans"]}
    assert simulated <= {r["simulated_iteration_time_s"] for r in rows}
    with path.open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows)
    assert [float(r["screen_time_s"]) for r in table] == times
    assert table[0]["layout"] == rows[0]["layout"]


def test_every_header_and_json_states_sequence_precision_and_attention():
    for command in ("plan", "memory"):
        text = run(command, "--model", "gpt3-1.3b", "--seq-length", "1024", "--attention-backend", "flash").output
        assert "sequence 1,024" in text and "flash attention" in text
        doc = json.loads(run(command, "--model", "gpt3-1.3b", "--precision", "fp16", "--attention-backend", "unfused",
                             "--json").output)
        assert (doc["seq_length"], doc["precision"], doc["attention_backend"]) == (2048, "fp16", "unfused")
    text = run("search", *SMALL_SEARCH, "--top", "1").output
    assert "sequence 2,048, bf16, auto attention" in text.splitlines()[0]
    doc = json.loads(run("search", *SMALL_SEARCH, "--top", "1", "--json").output)
    assert (doc["seq_length"], doc["precision"], doc["attention_backend"]) == (2048, "bf16", "auto")
    assert doc["plans"][0]["seq_length"] == 2048


def test_hugging_face_approximations_are_printed(tmp_path):
    config = tmp_path / "Mistral-7B" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(MISTRAL))
    args = ["--model", config, "--cluster", "dgx-h100", "--tp", "8", "--gpus", "8", "--use-flash-attn"]
    text = run("plan", *args).output
    assert "note: Mistral-7B: sequence length 32,768 taken from the declared maximum positions" in text
    assert "sliding-window attention (window 4,096 tokens) is in the launch (--window-size) but not in the time" in text
    doc = json.loads(run("plan", *args, "--seq-length", "4096", "--json").output)
    assert doc["seq_length"] == 4096 and doc["notes"] == []  # the chosen length, and a window as long as it
    doc = json.loads(run("memory", *args, "--json").output)
    assert any("32,768" in n for n in doc["notes"])
