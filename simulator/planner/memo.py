"""What the search's candidates share, computed once.

The candidates of one search differ only in their layout (``search_space.Candidate``), and each part
of a plan's memory and of its closed-form time depends on a few of the layout's values:

- a stage's weights, gradients and optimizer state: TP, CP, DP, PP, EP/ETP, the sharding and the
  stage's layers; a chunk's saved activations: TP, CP, SP, micro-batch, recompute, EP/ETP and the
  chunk's layers; the in-flight chunks and the embedding's and loss's extras: the schedule's shape;
- a chunk's forward and backward steps: TP, CP, SP, micro-batch, recompute, EP/ETP, the chunk's
  layers and whether it holds the embedding or the loss; a stage's gradient reduction and optimizer
  step: everything but the micro-batch and the recompute; the pipeline sends: the layout and the
  micro-batch.

Each part is computed once per distinct key, by the very functions ``memory.stage_peak_bytes`` and
``screen.screen`` call, on the first candidate that needs it. Each candidate then combines its parts
with those functions' own arithmetic (``memory.stage_totals``, ``stage_work.stage_work``,
``stage_work.pipeline_work``, ``screen.fast_iteration_time_s``), so its peak and screen time are the
same to the bit as the direct ones (tests/planner/test_search.py checks every candidate of several
searches). A key holds only values that vary between candidates: the model, the cluster and every
other plan field are the request's (``space.plan_template``), the same for all.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.estimator.memory import (
    extra_activations,
    heaviest_chunk_of,
    in_flight_chunks,
    layer_saved_bytes,
    stage_peak_bytes,
    stage_state,
    stage_totals,
)
from simulator.graph.layers import LayerKey
from simulator.planner.space import Candidate, SearchRequest
from simulator.schedule.screen import fast_iteration_time_s
from simulator.schedule.stage_work import (
    StageSteps,
    backward_span,
    forward_span,
    layer_kinds,
    p2p_times,
    pipeline_work,
    stage_communication,
    stage_kinds,
    stage_work,
)
from simulator.schedule.timing import cost_model_for, extra_times
from simulator.spec.parallel_plan import megatron_work_queues
from simulator.spec.plan import Job, ParallelPlan, PipelineSchedule


def peak_stages(job: Job) -> tuple[int, ...]:
    """The stages whose peaks bound every stage's: the first holds the most in-flight activations and
    the embedding, the last the output layer and logits; every middle stage is bounded by the first."""
    p = job.plan.pipeline_parallel_size
    stages = {0, p - 1}
    if len(set(job.layers_per_stage)) > 1:  # a fuller second stage can outweigh a lighter first
        stages |= {min(1, p - 1), max(p - 2, 0)}
    if job.model.is_moe and p > 2:  # stages may hold other mixes of dense and MoE layers: one of each mix
        runs = job.layer_runs
        mixes = {runs[s]: s for s in range(p - 2, 0, -1) if runs[s] not in (runs[0], runs[p - 1])}
        stages |= set(mixes.values())
    return tuple(sorted(stages))


def peak_bytes(job: Job) -> int:
    """The plan's per-GPU peak: the largest of its ``peak_stages``."""
    return max(stage_peak_bytes(job, s) for s in peak_stages(job))


@dataclass(frozen=True)
class _Shape:
    """What a candidate's pipeline shape (PP, virtual stages, split) fixes: each stage's layers."""

    stage_layers: tuple  # per stage, its chunks' layers: counts, or for an MoE model runs of (MoE, count)
    firsts: tuple[int, ...]  # the first stage of each kind (``stage_work.stage_kinds``)
    kind_of: tuple[int, ...]  # each stage's kind
    activation_layers: tuple  # per stage, what its saved activations follow: its largest chunk, or its chunks' runs
    layers_per_stage: tuple[int, ...]
    moe_layers_per_stage: tuple[int, ...]
    peak_stages: tuple[int, ...]


class SearchMemo:
    """The parts of one search's candidates, under one profile (``profile`` as ``screen`` takes it).

    Per candidate the parts come in two bundles, each a dict lookup: what follows its layers and
    recompute (per peak stage its activations; per kind of stage its steps) and what follows its
    layout and sharding (per peak stage its state; per kind of stage its data-parallel work). A bundle
    missing is put together from parts memoised more finely still (a chunk's steps, a stage's state),
    which other shapes share.
    """

    def __init__(self, req: SearchRequest, template: ParallelPlan, profile=None):
        self.model, self.cluster, self.template, self.profile = req.model, req.cluster, template, profile
        self.batch, self.num_gpus = req.global_batch_size, req.num_gpus
        self.gpipe = template.schedule is PipelineSchedule.gpipe
        self._cost = None
        self._job: tuple[Candidate | None, Job | None] = (None, None)
        self._shapes: dict[tuple, _Shape] = {}
        self._keys: dict[tuple, tuple] = {}
        # memory: bundles, and the parts they are made of
        self._activations, self._states = {}, {}
        self._state, self._chunk, self._in_flight, self._extras, self._saved = {}, {}, {}, {}, {}
        # the screen: bundles, and the parts they are made of
        self._all_steps, self._all_comm, self._send = {}, {}, {}
        self._layers, self._forward, self._backward, self._comm = {}, {}, {}, {}

    def job(self, c: Candidate, plan: ParallelPlan | None = None) -> Job:
        """The candidate's job, built once (for the parts it is the first to need)."""
        if self._job[0] is not c:
            plan = plan if plan is not None else c.plan(self.template)
            self._job = (c, Job.model_construct(model=self.model, cluster=self.cluster, plan=plan))
        return self._job[1]

    def _shape(self, c: Candidate) -> _Shape:
        key = (c.p, c.v, c.split)
        shape = self._shapes.get(key)
        if shape is None:
            job = self.job(c)
            moe = self.model.is_moe
            stage_layers = job.layer_runs if moe else job.chunk_layers
            shape = self._shapes[key] = _Shape(
                stage_layers, *stage_kinds(stage_layers), job.layer_runs if moe else job.layers_per_chunk,
                job.layers_per_stage, job.moe_layers_per_stage, peak_stages(job))
        return shape

    def _layer_keys(self, c: Candidate) -> tuple[LayerKey, LayerKey | None]:
        """The dense and the MoE layer's keys (what their graphs depend on) of the candidate's plan."""
        key = _layer(c)
        keys = self._keys.get(key)
        if keys is None:
            plan = self.job(c).plan
            keys = self._keys[key] = (LayerKey.of(plan), LayerKey.of(plan, moe=True) if self.model.is_moe else None)
        return keys

    # --- memory ----------------------------------------------------------------------------------

    def peak_bytes(self, c: Candidate) -> int:
        """``peak_bytes`` of the candidate's job."""
        layer, policy = _layer(c), (c.recompute.method, c.recompute.num_layers)
        shape_key = (c.p, c.v, c.split)
        key = (layer, policy, shape_key)
        activations = self._activations.get(key)
        if activations is None:
            shape = self._shape(c)
            activations = self._activations[key] = tuple(self._stage_activations(c, shape, layer, policy, s)
                                                         for s in shape.peak_stages)
        key = (c.t, c.cp, c.d, c.ep, c.etp, c.sharding, shape_key)
        states = self._states.get(key)
        if states is None:
            shape = self._shape(c)
            states = self._states[key] = tuple(self._stage_state(c, shape, s) for s in shape.peak_stages)
        return max(stage_totals(state, *acts)[3] for state, acts in zip(states, activations))

    def _stage_state(self, c: Candidate, shape: _Shape, s: int):
        key = (c.t, c.cp, c.d, c.p, c.ep, c.etp, c.sharding, shape.layers_per_stage[s],
               shape.moe_layers_per_stage[s], s == 0, s == c.p - 1)
        state = self._state.get(key)
        if state is None:
            state = self._state[key] = stage_state(self.job(c), s)
        return state

    def _stage_activations(self, c: Candidate, shape: _Shape, layer: tuple, policy: tuple, s: int):
        """(in-flight chunks, a chunk's saved bytes, its transient, the extras) of stage ``s``."""
        first, last = s == 0, s == c.p - 1
        m = self.batch // (c.mbs * c.d)
        key = (layer, policy, shape.activation_layers[s])
        chunk = self._chunk.get(key)
        if chunk is None:
            per_kind = self._saved.get(layer)
            if per_kind is None:
                per_kind = self._saved[layer] = layer_saved_bytes(self.model, *self._layer_keys(c))
            chunk = self._chunk[key] = heaviest_chunk_of(per_kind, c.recompute, shape.activation_layers[s])
        key = (s, c.p, m, c.v)
        chunks = self._in_flight.get(key)
        if chunks is None:
            chunks = self._in_flight[key] = in_flight_chunks(s, self.job(c).plan)
        key = (layer, first, last, c.p, m, c.v) if first or last else None  # a middle stage has none
        extras = self._extras.get(key)
        if extras is None:
            extras = self._extras[key] = extra_activations(self.model, self._layer_keys(c)[0], s, c.p, m, c.v,
                                                           self.gpipe)
        return chunks, chunk[0], chunk[1], extras

    # --- the closed-form screen ------------------------------------------------------------------

    @property
    def cost(self):
        if self._cost is None:
            # every candidate runs on the request's GPUs, which keep as many devices of a machine busy
            self._cost = cost_model_for(Job.model_construct(model=self.model, cluster=self.cluster,
                                                            plan=self.template), self.profile, self.num_gpus)
        return self._cost

    def screen_s(self, c: Candidate, plan: ParallelPlan) -> float:
        """``screen(job, profile)`` of the candidate's job (``plan`` is its plan)."""
        layer, policy = _layer(c), (c.recompute.method, c.recompute.num_layers)
        shape_key = (c.p, c.v, c.split)
        key = (layer, policy, shape_key)
        steps = self._all_steps.get(key)
        if steps is None:
            shape = self._shape(c)
            steps = self._all_steps[key] = tuple(self._stage_steps(c, plan, shape, layer, policy, s)
                                                 for s in shape.firsts)
        key = (c.t, c.cp, c.d, c.ep, c.etp, c.sharding, c.sp, shape_key)
        comm = self._all_comm.get(key)
        if comm is None:
            shape = self._shape(c)
            comm = self._all_comm[key] = tuple(self._stage_comm(c, plan, shape, s) for s in shape.firsts)
        send = (0.0,)
        if c.p > 1:
            key = (c.t, c.cp, c.d, c.p, c.ep, c.etp, c.sp, c.mbs)
            send = self._send.get(key)
            if send is None:
                send = self._send[key] = p2p_times(self.cost, self.job(c, plan))
        works = [stage_work(st, cm) for st, cm in zip(steps, comm)]
        work = pipeline_work(plan, self._shapes[shape_key].kind_of, works, send, self.cost.profile.step_jitter)
        return fast_iteration_time_s(work, plan.num_micro_batches)

    def _stage_comm(self, c: Candidate, plan: ParallelPlan, shape: _Shape, s: int):
        key = (c.t, c.cp, c.d, c.p, c.v, c.ep, c.etp, c.sharding, c.sp, shape.layers_per_stage[s],
               shape.moe_layers_per_stage[s], s == 0, s == c.p - 1)
        comm = self._comm.get(key)
        if comm is None:
            comm = self._comm[key] = stage_communication(self.job(c, plan), self.cost, s)
        return comm

    def _stage_steps(self, c: Candidate, plan: ParallelPlan, shape: _Shape, layer: tuple, policy: tuple, s: int):
        spans = (self._chunk_steps(c, plan, layer, policy, s, chunk, runs)
                 for chunk, runs in enumerate(shape.stage_layers[s]))
        return StageSteps.of(tuple(spans))

    def _chunk_steps(self, c: Candidate, plan: ParallelPlan, layer: tuple, policy: tuple, s: int, chunk: int, runs):
        """A chunk's (forward, backward) step spans: the forward is the same under every recompute policy
        of one granularity, and both are shared by alike chunks of every stage and plan."""
        key = (layer, runs, s == 0 and chunk == 0, s == c.p - 1 and chunk == c.v - 1, c.p > 1)
        fwd = self._forward.get(key)
        if fwd is None:
            fwd = self._forward[key] = forward_span(self.job(c, plan), self.cost, *self._layer_times(c, plan, layer),
                                                    s, chunk)
        bwd = self._backward.get((key, policy))
        if bwd is None:
            bwd = self._backward[key, policy] = backward_span(self.job(c, plan), self.cost,
                                                              *self._layer_times(c, plan, layer), s, chunk)
        return fwd, bwd

    def _layer_times(self, c: Candidate, plan: ParallelPlan, layer: tuple):
        """Each kind of layer's times and the stage extras' (cached by the cost model's keys)."""
        times = self._layers.get(layer)
        if times is None:
            job = self.job(c, plan)
            times = self._layers[layer] = (layer_kinds(job, self.cost), extra_times(job, self.cost))
        return times


def _layer(c: Candidate) -> tuple:
    """What the candidate's layer graphs depend on (``layers.LayerKey``, less the request's fields; with TP,
    whether the CUDA work queues Megatron's launch sets let the GEMMs overtake the collectives before them)."""
    ordered = c.t == 1 or megatron_work_queues(c.sharding, c.t, c.cp) == 1
    return c.t, c.cp, c.sp, c.mbs, c.recompute.granularity, c.ep, c.etp, ordered
