"""Fuzzing what files set: fields past their flag's bounds, values of the wrong type in every kind of file,
and a profile's ranges and fit points, all through the command line.

Every case ends in an answer or one sentence with exit code 2, never a traceback: a value past the bound
of the flag for the same number, of the wrong type (``true`` or ``"12"`` for a number, ``1`` for a flag),
or a profile range or fit point no measurement gives is refused, naming the field; an answer keeps its
band around its iteration time. The run and its size follow tests/test_fuzz.py (SIMULATOR_FUZZ_CASES,
derandomised unless it is set).
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.spec.hardware import load_gpu  # noqa: E402
from tests import fuzz_tally  # noqa: E402
from tests.test_file_fields import CASES as BOUND_CASES  # noqa: E402
from tests.test_file_fields import FILE_FIELDS, FILES, NOT_YET, REPO, _set  # noqa: E402
from tests.test_fuzz import (  # noqa: E402
    CASES,
    CPU_PROFILE,
    DEADLINE,
    PUBLISHED,
    RANDOM,
    RUN_RECORD,
    Workdir,
    check_estimate,
    invoke,
    strict_json,
)

SHARES = {"bounds": 0.05, "types": 0.05, "profiles": 0.05}  # of SIMULATOR_FUZZ_CASES: 20 each by default


def fuzz(name: str):
    return settings(max_examples=max(1, round(CASES * SHARES[name])), deadline=DEADLINE, derandomize=not RANDOM,
                    database=None, suppress_health_check=list(HealthCheck), print_blob=True)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Workdir:
    return Workdir(tmp_path_factory.mktemp("fuzz-files"))


def _write(work: Workdir, suffix: str, doc: Any) -> str:
    return work.file(suffix, json.dumps(doc) if suffix == ".json" else yaml.safe_dump(doc))


# The command that reads each kind of file, and checks what it answers.
def _command(kind: str, path: str) -> list[str]:
    return {"model": ["memory", "--model", path, "--tp", "2", "--json"],
            "cluster": ["memory", "--model", "gpt3-125m", "--cluster", path, "--json"],
            "run record": ["validate", path, "--memory-only", "--json"],
            "profile": ["plan", "--model", "gpt3-125m", "--gbs", "2", "--profile", path, "--json"]}[kind]


def _refused_naming(result, *names: str) -> None:
    assert result.exit_code == 2, result.output
    assert any(name in result.stderr for name in names), (names, result.stderr)


# --- fields past the flags' bounds ----------------------------------------------------------------

@st.composite
def past_the_bounds(draw):
    """(file kind, path, value, is it past the flag's bound, what the message names) for one bounded flag."""
    param, side, inside, past = draw(st.sampled_from([c for c in BOUND_CASES if c[:2] not in NOT_YET]))
    kind, path, _, field = draw(st.sampled_from(FILE_FIELDS[param]))
    sign = -1 if side == "low" else 1
    if field == "length":  # a list of that many entries: one past the bound, or the bound itself
        count = draw(st.sampled_from([past, inside]))
        return kind, path, count, count == past, "iteration"
    far = [past, sign * 1e308, sign * 1e300, sign * 1e30] if isinstance(inside, float) else \
        [past, past + sign, sign * 10**30, sign * 2**63, sign * 2**64]
    value = draw(st.sampled_from([inside] + [v for v in far if (v - inside) * sign > 0]))
    return kind, path, value, value != inside, path[-1]


@pytest.mark.fuzz
@fuzz("bounds")
@given(case=past_the_bounds())
def test_file_fields_past_the_flag_bounds_are_refused(work, case):
    kind, path, value, past, name = case
    sound, suffix, _ = FILES[kind]
    doc = sound()
    if name == "iteration":  # that many iterations, each with a time and a loss
        doc.update(iteration_times_s=[0.5] * value, losses=[2.0] * value, timers=None, warmup_iterations=0)
    else:
        _set(doc, path, value)
    result = invoke(_command(kind, _write(work, suffix, doc)))
    fuzz_tally.count(f"files past the flag bounds: {kind}", f"exit {result.exit_code}")
    if past:
        _refused_naming(result, name)


# --- values of the wrong type -------------------------------------------------------------------

def _cluster_doc() -> dict:
    return yaml.safe_load((REPO / "hardware_specs" / "clusters" / "dgx-h100.yaml").read_text())


TYPED_FILES = {
    # kind: (a sound document, suffix, how the file reaches a command)
    "model": (lambda: {"name": "m", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                       "seq_length": 512, "ffn_hidden_size": 1024, "attention_dropout": 0.1, "swiglu": False,
                       "kv_channels": 32, "num_query_groups": 4}, ".yaml", None),
    "cluster": (_cluster_doc, ".yaml", None),
    "gpu": (lambda: load_gpu("H100-SXM5-80GB").model_dump(mode="json"), ".yaml", "cluster"),
    "run record": (lambda: json.loads(json.dumps(RUN_RECORD)), ".json", None),
    "profile": (lambda: json.loads(json.dumps(PUBLISHED["h100-sxm5-80gb-published"])), ".json", None),
    "cpu profile": (lambda: json.loads(json.dumps(CPU_PROFILE)), ".json", "profile"),
}


def _leaves(node: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    """(path, value) of every number and flag in a document."""
    if isinstance(node, dict):
        return [leaf for key, value in node.items() for leaf in _leaves(value, (*path, key))]
    if isinstance(node, list):
        return [leaf for i, value in enumerate(node) for leaf in _leaves(value, (*path, i))]
    return [(path, node)] if isinstance(node, (int, float)) else []


def _wrong_types(value: Any) -> list[Any]:
    """What a file may hold in place of ``value`` that is not of its type."""
    if isinstance(value, bool):
        return [int(value), str(value).lower(), "yes", float(value)]
    if isinstance(value, int):  # (a fraction is wrong only where a whole number is expected, which a file's
        return [True, False, str(value), f" {value}"]  # number does not say)
    return [True, False, str(value), f"{value}"[:3]]


@pytest.mark.fuzz
@fuzz("types")
@given(data=st.data())
def test_values_of_the_wrong_type_are_refused_in_every_file_kind(work, data):
    kind = data.draw(st.sampled_from(sorted(TYPED_FILES)))
    sound, suffix, reaches = TYPED_FILES[kind]
    doc = sound()
    path, value = data.draw(st.sampled_from(_leaves(doc)))
    wrong = data.draw(st.sampled_from(_wrong_types(value)))
    _set(doc, path, wrong)
    file = _write(work, suffix, doc)
    if reaches == "cluster":  # a GPU file is named by the cluster file that uses it
        file = _write(work, ".yaml", {**_cluster_doc(), "gpu": file})
    result = invoke(_command(reaches or kind, file))
    fuzz_tally.count(f"files of the wrong type: {kind}", f"exit {result.exit_code}")
    named = [str(p) for p in path if isinstance(p, str)][-1:] or ["schema_version"]
    _refused_naming(result, *named)


# --- a profile's ranges and fit points ------------------------------------------------------------

@st.composite
def profile_changes(draw):
    """A profile with one range end or one fit-point value changed; whether no measurement gives it."""
    doc = json.loads(json.dumps(draw(st.sampled_from([*PUBLISHED.values(), CPU_PROFILE]))))
    targets: dict[str, list] = {"range": [], "point": []}  # kind -> (the list holding the number, its index)

    def walk(node: Any, key: str = "") -> None:
        if isinstance(node, dict):
            for name, value in node.items():
                if name == "ranges":
                    targets["range"] += [(pair, i) for pair in value.values() for i in (0, 1)]
                elif name == "fits":
                    targets["point"] += [(point, i) for fit in value for point in fit["points"]
                                         for i in range(len(point))]
                else:
                    walk(value, name)

    walk(doc)
    what = draw(st.sampled_from(sorted(targets)))
    holder, i = draw(st.sampled_from(targets[what]))
    value = draw(st.sampled_from([1e308, -1.0, -1e-9, 0.0, 1e-300, 1e16, holder[i] * 2, holder[i] / 2,
                                  holder[1 - i] if what == "range" else holder[i]]))
    never = value in (1e308, 1e16) or (value < 0) or (what == "range" and (i == 0 and value > holder[1]
                                                                            or i == 1 and value < holder[0]))
    holder[i] = value
    return doc, what, never


@pytest.mark.fuzz
@fuzz("profiles")
@given(change=profile_changes())
def test_profile_ranges_and_fit_points_are_checked_like_its_values(work, change):
    doc, what, never = change
    result = invoke(_command("profile", _write(work, ".json", doc)))
    fuzz_tally.count(f"profile {what}s", f"exit {result.exit_code}")
    if never:
        _refused_naming(result, "range" if what == "range" else "fit point")
        return
    if result.exit_code == 0:
        est = strict_json(result.stdout)
        check_estimate(est, 2048, 2, None)
        low, t, high = est["iteration_time_s_low"], est["iteration_time_s"], est["iteration_time_s_high"]
        assert math.isfinite(low) and math.isfinite(high) and low <= t <= high, (low, t, high)
