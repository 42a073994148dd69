"""The job a logged run played: its Megatron-LM arguments block, or the launch beside a log that has none, read
by the same launch reader as ``--megatron-args`` (``simulator.spec.megatron_args``), so that a log and the script
that started it give one plan."""

from __future__ import annotations

from pathlib import Path

from simulator.cli.options import job_from_options
from simulator.measure.megatron_log import MegatronLog, launch_of_arguments
from simulator.spec.errors import ConfigError
from simulator.spec.megatron_args import parse_launch, read_text, resolve


def job_of_log(log: MegatronLog, cluster: str, model: str, launch_path: str | None, gpus: int | None = None,
               cluster_given: bool = True):
    """(Job, notes) of the run ``log`` records; a log with no arguments needs ``launch_path``. ``cluster_given``:
    the user named the cluster (else it is the default, which the notes say a log cannot tell)."""
    from simulator.spec.catalog import load_model
    from simulator.spec.hardware import load_cluster

    notes: list[str] = []
    if log.arguments is not None:
        text, world = launch_of_arguments(log.arguments, log.tokenizer_vocab_size)
        if launch_path is not None:
            notes.append("the log's own arguments block was read; --megatron-args is for logs without one")
    elif launch_path is not None:
        text, world = read_text(launch_path, lambda: ""), None
    else:
        raise ConfigError(f"the {log.flavour} log {log.source!r} prints no arguments block, so the run's plan is "
                          "unknown; give the launch it ran with --megatron-args FILE")
    spec = load_cluster(cluster)
    launch = parse_launch(text, spec.gpus_per_node)
    base = load_model(model)
    overrides, options, read_notes = resolve(launch, base, gpus or world)
    notes += read_notes
    if overrides:
        overrides["name"] = Path(log.source).stem or "logged-run"
    split = options.pop("pipeline_layer_split", None)
    job = job_from_options(
        model_overrides=overrides, plan_overrides={"pipeline_layer_split": split} if split else None,
        # a run that put TP across nodes did run: the rule that refuses it guards plans, not measurements
        **{**options, "model": model, "cluster": cluster, "allow_tp_across_nodes": True})
    if log.arguments is not None and world is None:
        notes.append("the arguments block has no world_size; the GPUs came from its parallel sizes")
    if not cluster_given:
        notes.append(f"cluster {cluster}: a log does not say which GPUs and network it ran on; give --cluster")
    return job, notes
