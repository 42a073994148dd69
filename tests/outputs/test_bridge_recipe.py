"""The Megatron-Bridge recipe runs: as a script it hands the ConfigContainer it builds to Bridge's
``pretrain`` with Bridge's GPT ``forward_step`` (the entry point Bridge's own recipe scripts call), and its
checkpoint settings are the plan's, the same as the Megatron-LM launch of the same plan.

Megatron-Bridge does not install here (its releases need Python 3.12 and Transformer Engine), so its
modules are stood in for by ones that record what the recipe hands them; megatron-core's configs are real."""

from __future__ import annotations

import json
import runpy
import sys
import types

import pytest
from click.testing import CliRunner

from simulator.cli import cli
from simulator.cli.options import job_from_options
from simulator.outputs.bridge import bridge_recipe
from simulator.outputs.export import megatron_args

DENSE = dict(model="gpt3-1.3b", gpus=16, tensor_parallel_size=2, pipeline_parallel_size=2, sequence_parallel=True,
             global_batch_size=32, use_distributed_optimizer=True)


class _Recorded:
    """A Bridge config class: keeps the keyword arguments it was built with."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs


@pytest.fixture
def bridge(monkeypatch):
    """Bridge's modules, as far as the recipe imports them; ``calls`` collects each ``pretrain`` call."""
    calls = []

    def forward_step(state, data_iterator, model, return_schedule_plan=False):  # Bridge's gpt_step signature
        raise AssertionError("the recipe only hands the forward step to pretrain")

    def pretrain(config, forward_step_func, callbacks=None):
        calls.append({"config": config, "forward_step_func": forward_step_func, "callbacks": callbacks})

    names = {
        "megatron.bridge": {},
        "megatron.bridge.models": {"GPTModelProvider": type("GPTModelProvider", (_Recorded,), {})},
        "megatron.bridge.training": {},
        "megatron.bridge.training.comm_overlap": {"CommOverlapConfig": type("CommOverlapConfig", (_Recorded,), {})},
        "megatron.bridge.training.config": {name: type(name, (_Recorded,), {}) for name in (
            "CheckpointConfig", "ConfigContainer", "GPTDatasetConfig", "LoggerConfig", "RNGConfig", "SchedulerConfig",
            "TokenizerConfig", "TrainingConfig")},
        "megatron.bridge.training.gpt_step": {"forward_step": forward_step},
        "megatron.bridge.training.mixed_precision": {
            "MixedPrecisionConfig": type("MixedPrecisionConfig", (_Recorded,), {})},
        "megatron.bridge.training.pretrain": {"pretrain": pretrain},
    }
    for name, attributes in names.items():
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        monkeypatch.setitem(sys.modules, name, module)
    return types.SimpleNamespace(calls=calls, forward_step=forward_step)


def _run_as_script(text: str, tmp_path) -> dict:
    path = tmp_path / "recipe.py"
    path.write_text(text)
    return runpy.run_path(str(path), run_name="__main__")


def test_run_as_a_script_the_recipe_calls_pretrain_with_its_config(bridge, tmp_path):
    job = job_from_options(**DENSE)
    namespace = _run_as_script(bridge_recipe(job), tmp_path)
    assert len(bridge.calls) == 1, "run as a script, the recipe calls pretrain once"
    call = bridge.calls[0]
    assert call["forward_step_func"] is bridge.forward_step
    config = call["config"]
    assert type(config).__name__ == "ConfigContainer"
    model = config.kwargs["model"].kwargs
    assert model["tensor_model_parallel_size"] == 2 and model["pipeline_model_parallel_size"] == 2
    assert config.kwargs["train"].kwargs["global_batch_size"] == 32
    assert config.kwargs["ddp"].use_distributed_optimizer  # megatron-core's own DistributedDataParallelConfig
    # imported, not run as a script, it builds the config and trains nothing
    bridge.calls.clear()
    runpy.run_path(str(tmp_path / "recipe.py"), run_name="recipe")
    assert bridge.calls == [] and callable(namespace["pretrain_config"])


@pytest.mark.parametrize("async_save", [False, True])
def test_the_checkpoint_settings_are_the_launchs(bridge, tmp_path, async_save):
    job = job_from_options(**DENSE)
    _run_as_script(bridge_recipe(job, save_interval=275, async_save=async_save), tmp_path)
    checkpoint = bridge.calls[0]["config"].kwargs["checkpoint"].kwargs
    args = megatron_args(job, 275, async_save)
    assert f"--save-interval {checkpoint['save_interval']}" in args
    assert checkpoint.get("async_save", False) == ("--async-save" in args)


def test_megatron_fsdp_saves_synchronously_and_says_so(bridge, tmp_path):
    job = job_from_options(**{**DENSE, "use_distributed_optimizer": False,
                              "data_parallel_sharding_strategy": "optim_grads_params"})
    text = bridge_recipe(job, save_interval=100, async_save=True)
    _run_as_script(text, tmp_path)
    checkpoint = bridge.calls[0]["config"].kwargs["checkpoint"].kwargs
    assert checkpoint["ckpt_format"] == "fsdp_dtensor" and "async_save" not in checkpoint
    assert "asynchronous save is left out" in text


def test_plan_hands_the_recipe_the_interval_its_launch_has():
    """`plan --tokens --async-save --json`: the recipe's CheckpointConfig carries the interval and the
    asynchronous save the Megatron-LM launch of the same plan carries."""
    result = CliRunner().invoke(cli, ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--tp", "2", "--pp", "2",
                                      "--sp", "--gbs", "32", "--use-distributed-optimizer", "--tokens", "1e9",
                                      "--async-save", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    interval = doc["goodput"]["save_interval"]
    assert f"--save-interval {interval}" in doc["megatron_args"] and "--async-save" in doc["megatron_args"]
    assert f"save_interval={interval}," in doc["bridge_recipe"] and "async_save=True," in doc["bridge_recipe"]
