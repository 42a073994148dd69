"""The report's questions: its scenarios, the searches that answer them, and the table helpers its
sections share (``report`` puts the sections together; ``report_figures`` and ``report_moe`` draw)."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.estimator.prediction import Estimate, estimate
from simulator.measure import korthikanti as k
from simulator.planner.plan_search import SearchPins, SearchRequest, SearchResult, search
from simulator.spec.catalog import PRESETS
from simulator.spec.hardware import load_cluster
from simulator.spec.plan import Job, ParallelPlan, RecomputeGranularity, RecomputePolicy
from simulator.spec.plan_names import sharding_name

TOKENS = 300e9
ARTICLE_SPACE = SearchPins(virtual_pipeline_stages=1, use_distributed_optimizer=False)
SEARCH_ALONE = SearchPins(virtual_pipeline_stages=1, use_distributed_optimizer=False, sequence_parallel=False,
                          recompute_granularity=RecomputeGranularity.full)
COMMAND = "simulator report --out reports"


@dataclass(frozen=True)
class Scenario:
    """A model on a realistic cluster, with its 2021-style standard configuration."""

    model: str
    gpus: int
    global_batch_size: int
    standard_pp: int
    why: str


SCENARIOS = (
    Scenario("gpt3-175b", 1024, 1536, 16, "the article's headline: 128 DGX A100, global batch 1,536"),
    Scenario("megatron-22b", 256, 512, 1, "32 DGX A100, global batch 512 (1M tokens)"),
    Scenario("mt-nlg-530b", 2240, 1920, 35, "MT-NLG's 280 DGX A100 and global batch 1,920"),
    Scenario("megatron-1t", 3072, 3072, 64, "Narayanan et al. 2021: 384 DGX A100, global batch 3,072"),
)


GPU_COUNTS = (128, 256, 512, 1024, 2048, 4096)


TOP_PLANS = 5  # the full space's plans the engine ranks (their time breakdowns are a figure)


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _describe(plan: ParallelPlan) -> str:
    r = plan.recompute
    rec = r.granularity.value + (f" ({r.method.value}, {r.num_layers})" if r.granularity is RecomputeGranularity.full else "")
    return (f"TP {plan.tensor_parallel_size}" + (f", CP {plan.context_parallel_size}" if plan.context_parallel_size > 1
                                                 else "")
            + (f", EP {plan.expert_model_parallel_size}" if plan.expert_model_parallel_size > 1 else "")
            + f", PP {plan.pipeline_parallel_size}"
            + (f" x{plan.virtual_pipeline_stages}" if plan.interleaved else "")
            + f", DP {plan.data_parallel_size}, mbs {plan.micro_batch_size}, SP {'on' if plan.sequence_parallel else 'off'}, "
            + f"recompute {rec}" + (f", {sharding_name(plan)}" if sharding_name(plan) else ""))


def standard_plan(s: Scenario) -> ParallelPlan:
    """Megatron-LM's 2021 GPT-3 example: TP 8, micro-batch 1, full recompute, no SP, no interleaving."""
    return ParallelPlan(tensor_parallel_size=8, pipeline_parallel_size=s.standard_pp,
                        data_parallel_size=s.gpus // (8 * s.standard_pp), micro_batch_size=1,
                        global_batch_size=s.global_batch_size, recompute=RecomputePolicy(granularity="full"),
                        attention_backend=k.ATTENTION)


def search_request(s: Scenario, pins: SearchPins = SearchPins()) -> SearchRequest:
    """The article's 2022 question, answered with the attention Megatron ran then (no flash attention)."""
    return SearchRequest(model=PRESETS[s.model], cluster=load_cluster(k.CLUSTER), num_gpus=s.gpus,
                         global_batch_size=s.global_batch_size, pins=pins, use_flash_attention=False)


def _search(s: Scenario, pins: SearchPins, top: int = 1) -> SearchResult:
    return search(search_request(s, pins), tokens=TOKENS, top=top)


@dataclass
class Decomposition:
    scenario: Scenario
    standard: Estimate
    standard_plan: ParallelPlan
    search_alone: SearchResult
    article_best: SearchResult
    full_space: SearchResult

    @property
    def search_gain(self) -> float:
        return self.standard.iteration_time_s / self.search_alone.best.estimate.iteration_time_s - 1

    @property
    def sp_sar_gain(self) -> float:
        return self.search_alone.best.estimate.iteration_time_s / self.article_best.best.estimate.iteration_time_s - 1


def decompose(s: Scenario) -> Decomposition:
    plan = standard_plan(s)
    std = estimate(Job(model=PRESETS[s.model], cluster=load_cluster(k.CLUSTER), plan=plan), tokens=TOKENS)
    return Decomposition(s, std, plan, _search(s, SEARCH_ALONE), _search(s, ARTICLE_SPACE),
                         _search(s, SearchPins(), top=TOP_PLANS))


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out
