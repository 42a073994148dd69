"""Property-based tests (hypothesis) over random valid and invalid models, clusters, profiles, files
and plans, through the library and through the command line.

Every case ends in an answer or a refusal: a ``SimulatorError`` from the library; exit code 0, 2
(or 3 for --require-fit) with one sentence on stderr from the CLI; never a traceback or a hang.
Every answer holds the invariants: finite positive times; 0 < MFU <= HFU <= 1; tokens/s = global
batch x sequence / time; `fits` agrees with the peak against the capacity; more recompute or
sequence parallelism never holds more activation memory; strict JSON; and the search's plans fit
by `memory`, and `plan` on their flags gives the search's time.

`make test` runs a few hundred cases, the same ones on every machine (derandomised); `make fuzz`
runs SIMULATOR_FUZZ_CASES=20000 random ones and prints what they ended in.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import stat
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cli import cli
from simulator.cost.profile import _parse
from simulator.estimator.memory import memory_plan
from simulator.estimator.prediction import simulate_job
from simulator.spec import limits
from simulator.spec._io import build
from simulator.spec.catalog import PRESETS
from simulator.spec.errors import SimulatorError
from simulator.spec.hardware import ClusterSpec, cluster_names, load_cluster
from simulator.spec.model import ModelSpec
from simulator.spec.plan import Job, ParallelPlan
from tests import fuzz_tally
from tests.close import assert_close

REPO = Path(__file__).resolve().parent.parent
CASES = int(os.environ.get("SIMULATOR_FUZZ_CASES", "400"))
RANDOM = "SIMULATOR_FUZZ_CASES" in os.environ  # `make fuzz`: new cases each run
SHARES = {"library": 0.45, "cli": 0.3, "files": 0.2, "search": 0.05}
# A case past this is a hang (work that grows without bound runs for hours). The slowest cases take about 25 s
# on a quiet core (a plan drawing its six figures for the first time); on a 2-core machine running three other
# jobs they took 75-95 s, so the bound leaves room for a machine several times busier than quiet.
DEADLINE = timedelta(seconds=300)


def fuzz(name: str):
    return settings(max_examples=max(1, round(CASES * SHARES[name])), deadline=DEADLINE, derandomize=not RANDOM,
                    database=None, suppress_health_check=list(HealthCheck), print_blob=True)


def strict_json(text: str):
    def refuse(name: str):
        raise AssertionError(f"{name} in JSON output")

    return json.loads(text, parse_constant=refuse)


def check_ranked(doc: dict) -> None:
    """A search's plans come in the order of their rank key, which is what ``rank_by`` says: the band's slow
    end by default (so the point times need not be in order), or the point time."""
    from simulator.planner.plan_search import rank_order

    plans = doc["plans"]
    keys = [rank_order(p["rank_key_s"], p["iteration_time_s"]) for p in plans]  # keys equal to 12 digits tie
    assert plans and keys == sorted(keys), keys
    field = {"upper": "iteration_time_s_high", "point": "iteration_time_s"}.get(doc["rank_by"])
    if field is not None:
        for p in plans:
            assert_close(p["rank_key_s"], p[field], hint=field)


# --- values, valid and not ------------------------------------------------------------------------

WEIRD_NUMBERS = st.sampled_from([0, -1, -7, 1.5, 0.0, -0.0, 1e-300, 1e300, float("inf"), float("-inf"), float("nan"),
                                 2**31, 2**63, 10**30, 10**4000, True, None, "8", "", [], {}])
WEIRD_TEXT = st.sampled_from(["0", "-1", "-8", "1.5", "1e3", "1e30", "inf", "-inf", "nan", "NaN", "", " ", "abc",
                              "0x10", "1_000", "9" * 40, "1" * 5000, "\u0661", "８", "--json"])


def or_weird(valid: st.SearchStrategy, weird: st.SearchStrategy = WEIRD_NUMBERS, p: int = 8) -> st.SearchStrategy:
    """Mostly ``valid``, one time in ``p`` something else."""
    return st.integers(0, p - 1).flatmap(lambda i: weird if i == 0 else valid)


@st.composite
def jobs(draw) -> tuple[dict, dict, dict]:
    """(model, cluster, plan) as dicts, built to satisfy the rules; one time in three one field is then
    broken (a weird value, or a valid value that breaks a rule between fields)."""
    heads = draw(st.sampled_from([1, 2, 4, 8, 12, 16, 32]))
    hidden = heads * draw(st.sampled_from([8, 16, 32, 64, 128]))
    layers = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 24, 48]))
    groups = draw(st.sampled_from([g for g in (1, 2, 4, 8, heads) if heads % g == 0]))
    ffn = draw(st.sampled_from([4 * hidden, 3 * hidden, 8 * -(-8 * hidden // 24)]))
    vocab = draw(st.sampled_from([128, 1024, 32000, 51200]))
    model = {"name": "fuzz", "num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
             "num_query_groups": groups, "ffn_hidden_size": ffn, "vocab_size": vocab,
             "seq_length": draw(st.sampled_from([1, 2, 16, 128, 1024, 2048, 8192, 131072])),
             "swiglu": draw(st.booleans()), "normalization": draw(st.sampled_from(["LayerNorm", "RMSNorm"])),
             "position_embedding_type": draw(st.sampled_from(["learned_absolute", "rope"])),
             "untie_embeddings_and_output_weights": draw(st.booleans()), "add_bias_linear": draw(st.booleans()),
             "attention_dropout": draw(st.sampled_from([0.0, 0.1])), "hidden_dropout": draw(st.sampled_from([0.0, 0.1]))}
    cluster = load_cluster(draw(st.sampled_from(cluster_names()))).model_dump(mode="json")
    per_node, fp8 = cluster["gpus_per_node"], cluster["gpu"]["peak_tflops"]["fp8"] is not None
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if heads % t == 0 and ffn % t == 0 and vocab % t == 0
                               and (groups % t == 0 or t % groups == 0)]))
    pp = draw(st.sampled_from([p for p in (1, 2, 3, 4, 8) if layers % p == 0]))
    vpp = draw(st.sampled_from([1] + [v for v in (2, 3) if pp > 1 and layers % (pp * v) == 0]))
    dp = draw(st.sampled_from([1, 2, 4, 16]))
    mbs = draw(st.sampled_from([1, 2, 4]))
    micro_batches = draw(st.sampled_from([1, 2, 4, 8, 32])) * (pp if vpp > 1 else 1)
    granularity = draw(st.sampled_from(["none", "selective", "full"]))
    chunk = layers // (pp * vpp)
    precision = draw(st.sampled_from(["bf16", "bf16", "fp16", "fp32"]))
    plan = {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "data_parallel_size": dp,
            "virtual_pipeline_stages": vpp, "micro_batch_size": mbs, "global_batch_size": mbs * dp * micro_batches,
            "sequence_parallel": tp > 1 and draw(st.booleans()),
            "recompute": {"granularity": granularity, "method": draw(st.sampled_from(["uniform", "block"])),
                          "num_layers": draw(st.integers(1, chunk)) if granularity == "full" else 1},
            "use_distributed_optimizer": draw(st.booleans()), "precision": precision,
            "fp8_format": draw(st.sampled_from([None, "hybrid"])) if fp8 and precision != "fp32" else None,
            "use_flash_attention": draw(st.booleans()), "overlap_grad_reduce": draw(st.booleans()),
            "overlap_p2p_comm": draw(st.booleans()), "allow_tp_across_nodes": tp > per_node}
    if draw(st.integers(0, 2)) == 0:  # break one field
        which = draw(st.sampled_from(["model", "plan", "cluster"]))
        doc = {"model": model, "plan": plan, "cluster": cluster}[which]
        if which == "cluster":
            key = draw(st.sampled_from(sorted(CLUSTER_FIELDS) + ["gpu"]))
            value = draw(CLUSTER_FIELDS[key]) if key in CLUSTER_FIELDS else {
                **doc["gpu"], draw(st.sampled_from(["hbm_capacity_gib", "hbm_bandwidth_gbps", "sm_count"])):
                    draw(WEIRD_NUMBERS | st.sampled_from([1e-3, 0.5, 1e5]))}
        else:
            key = draw(st.sampled_from(sorted(doc)))
            value = draw(WEIRD_NUMBERS | st.sampled_from([1, 2, 3, 5, 7, 64, 96, 1000, 1002, 4096, "x",
                                                          limits.MAX_GPUS + 1, limits.MAX_SEQ_LENGTH,
                                                          limits.MAX_GLOBAL_BATCH_SIZE]))
        doc[key] = value
    return model, cluster, plan


CLUSTER_FIELDS = {
    "gpus_per_node": st.sampled_from([1, 2, 4, 8, 16, 72, 0, -8, limits.MAX_GPUS_PER_NODE + 1, 10**8]),
    "nvswitch": st.booleans(),
    "nvlink_bandwidth_gbps_per_direction": st.sampled_from([0.5, 300.0, 900.0, 0.0, 1e-300, 1e300, float("inf")]),
    "nics_per_node": st.sampled_from([1, 4, 8, 0, 10**6]),
    "nic_line_rate_gbit_s": st.sampled_from([100.0, 400.0, 0.0, -1.0, 1e-300]),
}


@st.composite
def cluster_dicts(draw) -> dict:
    """A cluster preset with up to three fields changed, some to values no cluster has."""
    base = load_cluster(draw(st.sampled_from(cluster_names()))).model_dump(mode="json")
    for key in draw(st.lists(st.sampled_from(sorted(CLUSTER_FIELDS)), max_size=3, unique=True)):
        base[key] = draw(CLUSTER_FIELDS[key])
    return base


PUBLISHED = {p.stem: json.loads(p.read_text()) for p in sorted((REPO / "calibration" / "profiles").glob("*.json"))}
PROFILE_PATHS = [("gemm", "max_efficiency"), ("gemm", "launch_overhead_s"), ("gemm", "tile_m"), ("gemm", "k_half"),
                 ("gemm", "tile_choices"), ("gemm", "full_rate_intensity_elements"),
                 ("elementwise", "achieved_fraction"), ("elementwise", "kernel_fractions"),
                 ("attention", "forward_efficiency"), ("attention", "seq_half"),
                 ("collectives", "nvlink", "max_busbw_gbps"), ("collectives", "network", "latency_s"),
                 ("collectives", "network", "half_size_bytes"), ("collectives", "nvlink", "ramp_curve"),
                 ("overlap_compute_slowdown",), ("schema_version",), ("gpu",)]


CPU_PROFILE = json.loads((REPO / "reports" / "cpu-validation" / "cpu-profile.json").read_text())
PROFILES = {doc["gpu"]: doc for doc in [*PUBLISHED.values(), CPU_PROFILE]}  # the profile of each GPU spec


@st.composite
def profile_docs(draw, gpu: str) -> dict | None:
    """For a cluster of ``gpu``: its default (None; the measured one for the CPU, which has no published
    one), its profile, its profile with fields changed, or now and then another GPU's profile."""
    choice = draw(st.sampled_from(["default", "default", "own", "changed", "changed", "other"]))
    if choice == "default":
        return CPU_PROFILE if gpu == "CPU" else None
    own = PROFILES.get(gpu, CPU_PROFILE)
    doc = json.loads(json.dumps(own if choice != "other" else draw(st.sampled_from(list(PROFILES.values())))))
    if choice != "changed":
        return doc
    for path in draw(st.lists(st.sampled_from(PROFILE_PATHS), min_size=1, max_size=2)):
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = draw(or_weird(st.sampled_from([0.5, 1.0, 2e-6, 128, {"layer_norm": 0.5}, [[1.0, 0.5]]]),
                                       st.sampled_from([0, -1, -0.5, 1e300, 2.0, {"copy": -0.5}, [[1.0, 5.0]], "x",
                                                        None]), p=2))
    return doc


# --- the invariants -------------------------------------------------------------------------------

def check_estimate(est: dict, seq_length: int, global_batch_size: int, tokens: float | None) -> None:
    """The invariants of one answer, on the JSON document `plan --json` prints (or the Estimate's dump)."""
    T = est["iteration_time_s"]
    assert math.isfinite(T) and T > 0, T
    parts = est["breakdown"]
    assert all(math.isfinite(v) and v >= -1e-9 * T for v in parts.values()), parts
    assert 0 < est["mfu"] <= est["hfu"] <= 1, (est["mfu"], est["hfu"])
    assert est["tokens_per_s"] == pytest.approx(global_batch_size * seq_length / T, rel=1e-12)
    mem = est["memory"]
    assert mem["peak_bytes"] == max(s["peak_bytes"] for s in mem["stages"]) > 0
    assert mem["fits"] is (mem["peak_bytes"] <= mem["capacity_bytes"])
    assert all(s["fits"] is (s["peak_bytes"] <= mem["capacity_bytes"]) for s in mem["stages"])
    if mem["fits"]:
        assert mem["overflowing_stage"] is None
    else:
        assert mem["stages"][mem["overflowing_stage"]]["peak_bytes"] == mem["peak_bytes"]
    if tokens is not None:
        days = est["training_days"]
        assert math.isfinite(days) and days > 0
        assert days == pytest.approx(tokens / est["tokens_per_s"] / 86400, rel=1e-12)


def check_memory(mem: dict) -> None:
    assert mem["peak_bytes"] == max(s["peak_bytes"] for s in mem["stages"]) > 0
    assert mem["fits"] is (mem["peak_bytes"] <= mem["capacity_bytes"])
    for s in mem["stages"]:
        parts = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "transient_bytes",
                 "reserve_bytes")
        assert s["peak_bytes"] == sum(s[p] for p in parts) and min(s[p] for p in parts) >= 0


def _activations(job: Job, **plan_changes) -> list[int] | None:
    """Per-stage activation bytes of ``job`` with the plan changed, or None if the rules refuse the change."""
    data = job.plan.model_dump()
    data.update(plan_changes)
    try:
        variant = build(Job, {"model": job.model, "cluster": job.cluster, "plan": build(ParallelPlan, data, "plan")},
                        "job")
    except SimulatorError:
        return None
    return [s.activations_bytes for s in memory_plan(variant).stages]


def check_recompute_and_sp_never_add_memory(job: Job) -> None:
    ladder = [_activations(job, recompute={"granularity": g}) for g in ("none", "selective", "full")]
    ladder = [a for a in ladder if a is not None]
    for more, less in zip(ladder, ladder[1:]):
        assert all(x >= y for x, y in zip(more, less)), ladder
    if job.plan.tensor_parallel_size > 1:
        off, on = _activations(job, sequence_parallel=False), _activations(job, sequence_parallel=True)
        if off is not None and on is not None:
            assert all(x >= y for x, y in zip(off, on)), (off, on)


# --- the library ----------------------------------------------------------------------------------

@pytest.mark.fuzz
@fuzz("library")
@given(job=jobs(), tokens=st.one_of(st.none(), st.sampled_from([1e6, 3e11, limits.MAX_TOKENS])), data=st.data())
def test_library_answers_or_refuses(job, tokens, data):
    model, cluster, plan = job
    gpu = cluster["gpu"]["name"] if isinstance(cluster.get("gpu"), dict) else "?"
    profile = data.draw(profile_docs(gpu))
    try:
        job = build(Job, {"model": build(ModelSpec, model, "model"), "cluster": build(ClusterSpec, cluster, "cluster"),
                          "plan": build(ParallelPlan, plan, "plan")}, "job")
        prof = None if profile is None else _parse(json.dumps(profile), "'fuzz.json'")
        est = simulate_job(job, prof, tokens).estimate
    except SimulatorError as exc:
        message = str(exc)
        assert message and "Traceback" not in message
        fuzz_tally.count("library", f"refused ({type(exc).__name__})")
        return
    doc = est.model_dump(mode="json")
    json.dumps(doc, allow_nan=False)
    check_estimate(doc, job.model.seq_length, job.plan.global_batch_size, tokens)
    check_memory(doc["memory"])
    check_recompute_and_sp_never_add_memory(job)
    fuzz_tally.count("library", "answered")


# --- the command line -----------------------------------------------------------------------------

def invoke(args: list[str], env: dict | None = None):
    """Run the CLI; assert no traceback, an exit code in {0, 2, 3} and one sentence when not 0."""
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"{args}: {type(result.exception).__name__}: {result.exception}"
    assert result.exit_code in (0, 2, 3), (args, result.exit_code, result.output)
    assert "Traceback" not in result.output, (args, result.output)
    if result.exit_code:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)
    return result


class Workdir:
    """A folder for the files a case writes, each under a fresh name."""

    def __init__(self, root: Path):
        self.root = root
        self._n = itertools.count()
        self.null = root / "null"
        try:
            os.mknod(self.null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except OSError:
            self.null = Path("/dev/null")  # not root: the system's, which we cannot replace
        self.fifo = root / "fifo"
        os.mkfifo(self.fifo)

    def file(self, suffix: str, content: bytes | str) -> str:
        path = self.root / f"f{next(self._n)}{suffix}"
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return str(path)

    def output(self, kind: str) -> str:
        n = next(self._n)
        return {"file": str(self.root / f"out{n}.json"), "folder": str(self.root / f"new{n}" / "sub" / "t.json"),
                "dir": str(self.root), "device": str(self.null), "fifo": str(self.fifo), "proc": "/proc/t.json",
                "long": "t" * 300 + ".json", "notdir": str(self.root / "afile" / "t.json")}[kind]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Workdir:
    w = Workdir(tmp_path_factory.mktemp("fuzz"))
    (w.root / "afile").write_text("x")
    return w


def serialise(doc, suffix: str, damage: int) -> bytes:
    text = json.dumps(doc) if suffix == ".json" else yaml.safe_dump(doc)
    data = text.encode()
    if damage == 1:
        return data[: len(data) // 2]
    if damage == 2:
        return data[:5] + b"\xff\xfe" + data[5:]
    if damage == 3:
        return b"[" * 5000 + b"]" * 5000
    if damage == 4:
        return b"- 1\n- 2\n"
    return data


@st.composite
def model_args(draw, work: Workdir) -> tuple[list[str], int | None]:
    """--model (a preset, a file, a missing name) and --seq-length; the sequence length an answer has (or None)."""
    kind = draw(st.sampled_from(["preset", "preset", "preset", "file", "missing"]))
    seq = draw(or_weird(st.sampled_from([None, None, 1, 7, 512, 4096]), WEIRD_TEXT, p=10))
    args = [] if seq is None else ["--seq-length", str(seq)]
    if kind == "preset":
        name = draw(st.sampled_from(["gpt3-125m", "gpt3-350m", "gpt3-1.3b", "gpt3-13b", "llama3-8b", "llama2-7b",
                                     "gpt3-175b", "megatron-22b"]))
        expected = PRESETS[name].seq_length
        args = ["--model", name, *args]
    elif kind == "file":
        doc = draw(jobs())[0]
        suffix = draw(st.sampled_from([".yaml", ".json"]))
        damage = draw(st.sampled_from([0, 0, 0, 0, 1, 2, 3, 4]))
        args = ["--model", work.file(suffix, serialise(doc, suffix, damage)), *args]
        expected = None  # whatever the file's fields come to
    else:
        args = ["--model", draw(st.sampled_from(["gpt-9", "", "a" * 300, "missing.yaml", "/dev/zero", "/proc"])), *args]
        expected = None
    if isinstance(seq, str):  # the flag reads numbers as Python's int() does: '1_000', '\u0661' and '８' are numbers
        try:
            seq = int(seq.strip())
        except ValueError:
            seq = None
    if seq is not None:
        expected = seq
    return args, expected


PLAN_FLAGS = {
    "--gpus": st.sampled_from(["1", "2", "4", "8", "12", "16", "64", "1024", str(limits.MAX_GPUS + 1)]),
    "--tp": st.sampled_from(["1", "2", "4", "8", "3", "16"]),
    "--pp": st.sampled_from(["1", "2", "3", "4", "8"]),
    "--dp": st.sampled_from(["1", "2", "3", "4", "16"]),
    "--vpp": st.sampled_from(["1", "2", "3"]),
    "--mbs": st.sampled_from(["1", "2", "4", "8"]),
    "--gbs": st.sampled_from(["1", "2", "4", "8", "16", "64", "96", "1536", str(limits.MAX_GLOBAL_BATCH_SIZE)]),
    "--recompute-granularity": st.sampled_from(["none", "selective", "full", "some"]),
    "--recompute-method": st.sampled_from(["uniform", "block"]),
    "--recompute-num-layers": st.sampled_from(["1", "2", "3"]),
    "--precision": st.sampled_from(["bf16", "fp16", "fp32"]),
    "--fp8-format": st.sampled_from(["hybrid", "e4m3"]),
}
PLAN_SWITCHES = ["--sp", "--no-sp", "--use-distributed-optimizer", "--use-flash-attn", "--overlap-grad-reduce",
                 "--overlap-p2p-communication", "--allow-tp-across-nodes"]


@st.composite
def cluster_args(draw, work: Workdir) -> list[str]:
    kind = draw(st.sampled_from(["default", "preset", "preset", "file", "missing"]))
    if kind == "default":
        return []
    if kind == "preset":
        return ["--cluster", draw(st.sampled_from(cluster_names()))]
    if kind == "missing":
        return ["--cluster", draw(st.sampled_from(["dgx-z", "c" * 300 + ".yaml", "/dev/zero"]))]
    doc = draw(cluster_dicts())
    if draw(st.booleans()):
        doc["gpu"] = doc["gpu"]["name"]  # by name, as the shipped files do
    return ["--cluster", work.file(".yaml", serialise(doc, ".yaml", draw(st.sampled_from([0, 0, 0, 1, 2]))))]


def job_flags(plan: dict) -> list[str]:
    """The `plan`/`memory` flags of a plan dict (values that are not numbers go through as text)."""
    r = plan["recompute"] if isinstance(plan["recompute"], dict) else {"granularity": plan["recompute"]}
    flags = ["--tp", plan["tensor_parallel_size"], "--pp", plan["pipeline_parallel_size"],
             "--dp", plan["data_parallel_size"], "--vpp", plan["virtual_pipeline_stages"],
             "--mbs", plan["micro_batch_size"], "--gbs", plan["global_batch_size"],
             "--recompute-granularity", r.get("granularity", "none"), "--precision", plan["precision"]]
    if r.get("granularity") == "full":
        flags += ["--recompute-method", r.get("method", "uniform"), "--recompute-num-layers", r.get("num_layers", 1)]
    for flag, key in (("--fp8-format", "fp8_format"), ("--cp", "context_parallel_size"),
                      ("--cp-comm-type", "cp_comm_type"), ("--attention-backend", "attention_backend"),
                      ("--data-parallel-sharding-strategy", "data_parallel_sharding_strategy"),
                      ("--decoder-first-pipeline-num-layers", "decoder_first_pipeline_num_layers"),
                      ("--decoder-last-pipeline-num-layers", "decoder_last_pipeline_num_layers"),
                      ("--ddp-bucket-size", "ddp_bucket_size"), ("--ep", "expert_model_parallel_size"),
                      ("--etp", "expert_tensor_parallel_size"),
                      ("--moe-token-dispatcher-type", "moe_token_dispatcher_type")):
        if plan.get(key) is not None:
            flags += [flag, plan[key]]
    flags += [flag for flag, key in (("--sp", "sequence_parallel"),
                                     ("--use-distributed-optimizer", "use_distributed_optimizer"),
                                     ("--overlap-grad-reduce", "overlap_grad_reduce"),
                                     ("--overlap-param-gather", "overlap_param_gather"),
                                     ("--tp-comm-overlap", "tp_comm_overlap"),
                                     ("--account-for-embedding-in-pipeline-split",
                                      "account_for_embedding_in_pipeline_split"),
                                     ("--account-for-loss-in-pipeline-split", "account_for_loss_in_pipeline_split"),
                                     ("--allow-tp-across-nodes", "allow_tp_across_nodes"),
                                     ("--moe-grouped-gemm", "moe_grouped_gemm")) if plan.get(key)]
    if plan.get("attention_backend") is None and "use_flash_attention" in plan:  # the older flag's field alone
        flags += ["--attention-backend", "auto" if plan["use_flash_attention"] is True else "unfused"
                  if plan["use_flash_attention"] is False else plan["use_flash_attention"]]
    if "overlap_p2p_comm" in plan:
        flags.append("--overlap-p2p-communication" if plan["overlap_p2p_comm"] else "--no-overlap-p2p-communication")
    return [str(f) for f in flags]


@st.composite
def plan_cases(draw, work: Workdir) -> tuple[list[str], int | None, float | None]:
    command = draw(st.sampled_from(["plan", "memory"]))
    if draw(st.integers(0, 2)):  # a job built to the rules (sometimes broken in one field), as flags and files
        model, cluster, plan = draw(jobs())
        suffix = draw(st.sampled_from([".yaml", ".json"]))
        preset = next((n for n in cluster_names() if load_cluster(n).model_dump(mode="json") == cluster), None)
        args = [command, "--model", work.file(suffix, serialise(model, suffix, 0)),
                "--cluster", preset or work.file(".yaml", serialise(cluster, ".yaml", 0)), *job_flags(plan)]
        if draw(st.booleans()) and all(isinstance(plan[k], int) for k in
                                       ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")):
            gpus = plan["tensor_parallel_size"] * plan["pipeline_parallel_size"] * plan["data_parallel_size"]
            args += ["--gpus", str(gpus + draw(st.sampled_from([0, 0, 0, 1])))]
        seq = model["seq_length"] if isinstance(model["seq_length"], int) else None
    else:  # flags and files drawn one by one: mostly refused
        model, seq = draw(model_args(work))
        args = [command, *model, *draw(cluster_args(work))]
        for flag in draw(st.lists(st.sampled_from(sorted(PLAN_FLAGS)), max_size=6, unique=True)):
            args += [flag, draw(or_weird(PLAN_FLAGS[flag], WEIRD_TEXT, p=10))]
        args += draw(st.lists(st.sampled_from(PLAN_SWITCHES), max_size=3, unique=True))
    tokens = None
    if command == "plan":
        if draw(st.booleans()):
            value = draw(or_weird(st.sampled_from(["1e9", "300e9", "2e12"]), WEIRD_TEXT, p=5))
            args += ["--tokens", value]
            tokens = float(value) if value in ("1e9", "300e9", "2e12") else None
        gpu = next((n for n in ("A100-SXM4-80GB", "A100-SXM4-40GB", "H100", "H200", "CPU") if n in " ".join(args)),
                   "A100-SXM4-80GB")
        if "local-cpu" in args or draw(st.integers(0, 3)) == 0:
            profile = draw(profile_docs(gpu)) if "local-cpu" not in args else CPU_PROFILE
            args += ["--profile", work.file(".json", json.dumps(profile)) if profile else "a100-sxm4-80gb-published"]
        if draw(st.integers(0, 4)) == 0:
            args += ["--trace", work.output(draw(st.sampled_from(
                ["file", "folder", "dir", "device", "fifo", "proc", "long", "notdir"])))]
    if draw(st.integers(0, 4)) == 0:
        args.append("--require-fit")
    if draw(st.integers(0, 5)):
        args.append("--json")
    return args, seq, tokens


@pytest.mark.fuzz
@fuzz("cli")
@given(data=st.data())
def test_cli_plan_and_memory_answer_or_refuse(work, data):
    args, seq, tokens = data.draw(plan_cases(work))
    result = invoke(args)
    fuzz_tally.count("cli plan/memory", f"exit {result.exit_code}")
    assert stat.S_ISCHR(os.lstat(work.null).st_mode), "the device was replaced"
    if result.exit_code == 2 or "--json" not in args:
        return
    doc = strict_json(result.stdout)
    fits = doc["memory"]["fits"] if args[0] == "plan" else doc["fits"]
    assert (result.exit_code == 3) is ("--require-fit" in args and not fits), (args, result.exit_code)
    if args[0] == "memory":
        check_memory(doc)
        return
    check_memory(doc["memory"])
    if seq is not None:
        check_estimate(doc, seq, doc["plan"]["global_batch_size"], tokens)
    else:  # a model whose sequence the case does not know: the rest of the invariants still hold
        check_estimate(doc, round(doc["tokens_per_s"] * doc["iteration_time_s"] / doc["plan"]["global_batch_size"]),
                       doc["plan"]["global_batch_size"], tokens)


# --- files of every kind ------------------------------------------------------------------------

RUN_RECORD = json.loads((REPO / "reports" / "cpu-validation" / "run-tp1.json").read_text())
HF_CONFIG = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000,
             "max_position_embeddings": 256, "tie_word_embeddings": False}


def _raw_points() -> dict:
    from tests.measure.test_calibrate import _synthetic_raw

    return _synthetic_raw()


RAW = _raw_points()


@st.composite
def damaged(draw, doc):
    """``doc`` with a few values anywhere in it replaced, removed or wrapped."""
    doc = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(1, 3))):
        parent, key, node = None, None, doc
        for _depth in range(draw(st.integers(1, 4))):
            if not isinstance(node, (dict, list)) or not node:
                break
            key = draw(st.sampled_from(list(node) if isinstance(node, dict) else list(range(len(node)))))
            parent, node = node, node[key]
        if parent is None:
            continue
        action = draw(st.integers(0, 3))
        if action == 0 and isinstance(parent, dict):
            del parent[key]
        elif action == 1:
            parent[key] = [parent[key]]
        else:
            parent[key] = draw(WEIRD_NUMBERS | st.sampled_from(["x", "\u00e9", -0.5, 0.5, 1e-12]))
    return doc


FILE_KINDS = {
    # kind: (a sound document, suffix, the command that reads the file)
    "model": (lambda: {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "seq_length": 512}, ".yaml",
              lambda f, out: ["memory", "--model", f, "--tp", "2", "--json"]),
    "cluster": (lambda: load_cluster("dgx-h100").model_dump(mode="json"), ".yaml",
                lambda f, out: ["memory", "--model", "gpt3-125m", "--cluster", f, "--json"]),
    "profile": (lambda: PUBLISHED["a100-sxm4-80gb-published"], ".json",
                lambda f, out: ["plan", "--model", "gpt3-125m", "--gbs", "2", "--profile", f, "--json"]),
    "run record": (lambda: RUN_RECORD, ".json", lambda f, out: ["validate", f, "--memory-only", "--json"]),
    "raw points": (lambda: RAW, ".json", lambda f, out: ["calibrate", "--raw", f, "--out", out, "--json"]),
    "hf config": (lambda: HF_CONFIG, ".json", lambda f, out: ["models", f, "--json"]),
}


@pytest.mark.fuzz
@fuzz("files")
@given(data=st.data())
def test_damaged_files_are_read_or_refused(work, data):
    # a fit takes a second, so raw points come up half as often as the other kinds
    kind = data.draw(st.sampled_from([k for k in sorted(FILE_KINDS) if k != "raw points"] * 2 + ["raw points"]))
    sound, suffix, command = FILE_KINDS[kind]
    doc = sound() if data.draw(st.integers(0, 5)) == 0 else data.draw(damaged(sound()))
    content = serialise(doc, suffix, data.draw(st.sampled_from([0, 0, 0, 0, 0, 0, 1, 2, 3, 4])))
    result = invoke(command(work.file(suffix, content), work.output("file")))
    fuzz_tally.count(f"files: {kind}", f"exit {result.exit_code}")
    if result.exit_code == 0:
        doc = strict_json(result.stdout)
        if kind in ("model", "cluster"):
            check_memory(doc)
        elif kind == "profile":
            check_estimate(doc, 2048, 2, None)


# --- the search -----------------------------------------------------------------------------------

SEARCH_MODELS = {"gpt3-125m": PRESETS["gpt3-125m"], "gpt3-350m": PRESETS["gpt3-350m"],
                 "gpt3-1.3b": PRESETS["gpt3-1.3b"], "llama3-8b": PRESETS["llama3-8b"]}
SEARCH_PINS = {"--tp": ["1", "2", "3", "4", "8", "16"], "--pp": ["1", "2", "3", "4"], "--vpp": ["1", "2", "3"],
               "--mbs": ["1", "2", "3", "4"], "--recompute-granularity": ["none", "selective", "full"]}


@pytest.mark.fuzz
@fuzz("search")
@given(model=st.sampled_from(sorted(SEARCH_MODELS)), cluster=st.sampled_from(["dgx-a100-80gb", "dgx-h100"]),
       gpus=st.sampled_from(["1", "2", "4", "8", "12", "16", "32", "64"]),
       gbs=st.sampled_from(["1", "8", "12", "16", "32", "64", "256"]),
       seq=st.sampled_from([None, None, "512", "4096"]),
       pins=st.dictionaries(st.sampled_from(sorted(SEARCH_PINS)), st.integers(0, 5), max_size=2),
       switches=st.lists(st.sampled_from(["--sp", "--no-sp", "--use-flash-attn", "--overlap-grad-reduce",
                                          "--use-distributed-optimizer"]), max_size=2, unique=True))
def test_search_plans_fit_and_plan_reproduces_their_time(model, cluster, gpus, gbs, seq, pins, switches):
    common = ["--model", model, "--cluster", cluster, *(["--seq-length", seq] if seq else [])]
    args = ["search", *common, "--gpus", gpus, "--gbs", gbs, "--top", "3", "--json", *switches]
    for flag, i in pins.items():
        args += [flag, SEARCH_PINS[flag][i % len(SEARCH_PINS[flag])]]
    result = invoke(args)
    fuzz_tally.count("cli search", f"exit {result.exit_code}")
    if result.exit_code:
        return
    doc = strict_json(result.stdout)
    seq_length = int(seq) if seq else SEARCH_MODELS[model].seq_length
    check_ranked(doc)
    for p in doc["plans"]:
        check_estimate(p, seq_length, int(gbs), None)
        assert p["memory"]["fits"]
        flags = [*common, "--gpus", gpus, *job_flags(p["plan"]), "--json"]
        memory = strict_json(invoke(["memory", *flags]).stdout)
        assert memory["fits"] and memory["peak_bytes"] == p["memory"]["peak_bytes"]
        again = strict_json(invoke(["plan", *flags]).stdout)
        assert_close(again["iteration_time_s"], p["iteration_time_s"], hint=" ".join(flags))
        assert again["plan"] == p["plan"]
