"""A job as a Megatron-Bridge recipe: Python that builds the ``ConfigContainer`` training the simulated job.

Megatron-Bridge (``pip install megatron-bridge``, NVIDIA's successor to NeMo's Megatron path) configures a
run as one ``ConfigContainer``: the model provider (megatron-core's ``TransformerConfig`` fields with the
GPT model's), training, optimizer, scheduler, DDP, dataset, tokenizer, checkpoint, mixed precision and
communication overlap. Everything the simulation assumed is in it, under the names megatron-core and
Megatron-Bridge read, from the same exported values as the Megatron-LM launch
(``simulator.outputs.export``): Megatron-FSDP as megatron-core's own ``use_megatron_fsdp`` with its
sharding strategy and the ``fsdp_dtensor`` checkpoint format it requires, never PyTorch FSDP.
The learning rate, data and iteration count are the user's and are marked as such. Run as a script, the
recipe hands its config to Bridge's ``pretrain`` with Bridge's GPT ``forward_step``, as Bridge's own recipe
scripts do; the checkpoint interval and asynchronous save are the plan's, as in its Megatron-LM launch.
"""

from __future__ import annotations

import pprint
from typing import Any

from simulator.outputs.export import megatron_notes, node_shape, uses_megatron_fsdp, vocab_multiple
from simulator.outputs.export_config import ddp_config, gpt_model_args, transformer_config
from simulator.spec.plan import Job, Precision

_DTYPES = {"bfloat16": "torch.bfloat16", "float16": "torch.float16", "float32": "torch.float32"}


class _Code(str):
    """A value printed as Python code rather than as its repr (torch.bfloat16, F.silu)."""

    def __repr__(self) -> str:
        return str(self)


def model_provider_kwargs(job: Job) -> dict[str, Any]:
    """``GPTModelProvider`` keyword arguments: megatron-core's ``TransformerConfig`` fields and the GPT
    model's (vocabulary, sequence, positions, tied embeddings), with Python values as code."""
    config = dict(transformer_config(job))
    for key in ("params_dtype", "pipeline_dtype"):
        config[key] = _Code(_DTYPES[config[key]])
    config["activation_func"] = _Code(f"F.{config['activation_func']}")
    config["attention_backend"] = _Code(f"AttnBackend.{config['attention_backend']}")
    if config.get("window_size") is not None:
        config["window_size"] = tuple(config["window_size"])
    model = gpt_model_args(job)
    config.update(vocab_size=model["vocab_size"], seq_length=model["max_sequence_length"],
                  position_embedding_type=model["position_embedding_type"],
                  share_embeddings_and_output_weights=model["share_embeddings_and_output_weights"],
                  make_vocab_size_divisible_by=vocab_multiple(job))
    for key in ("rotary_base", "rope_scaling", "rope_scaling_factor"):
        if key in model:
            config[key] = model[key]
    if uses_megatron_fsdp(job):
        config["gradient_accumulation_fusion"] = False  # Megatron-FSDP has no fused wgrad accumulation
    return config


def mixed_precision_kwargs(job: Job) -> dict[str, Any]:
    p = job.plan
    dtype = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}[p.precision.value]
    out: dict[str, Any] = {"bf16": p.precision is Precision.bf16, "fp16": p.precision is Precision.fp16,
                           "params_dtype": _Code(dtype), "pipeline_dtype": _Code(dtype),
                           "grad_reduce_in_fp32": p.grad_bytes == 4}
    if p.fp8_format is not None:
        out.update(fp8=p.fp8_format.value, fp8_recipe="delayed", fp8_param_gather=p.fp8_param_gather)
    return out


def optimizer_kwargs(job: Job) -> dict[str, Any]:
    p = job.plan
    out: dict[str, Any] = {"optimizer": "adam", "lr": 3e-4, "min_lr": 3e-5, "weight_decay": 0.1,
                           "adam_beta1": 0.9, "adam_beta2": 0.95, "clip_grad": 1.0,
                           "bf16": p.precision is Precision.bf16, "fp16": p.precision is Precision.fp16,
                           "use_distributed_optimizer": p.shards_optimizer}
    if p.use_precision_aware_optimizer:
        out["use_precision_aware_optimizer"] = True
        out["store_param_remainders"] = p.store_param_remainders
        names = {"fp32": "torch.float32", "fp16": "torch.float16", "bf16": "torch.bfloat16", "fp8": "torch.uint8"}
        for key in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
            out[key] = _Code(names[getattr(p, key).value])
    return out


def _call(name: str, kwargs: dict[str, Any], indent: str) -> str:
    inner = indent + "    "
    lines = [f"{inner}{k}={pprint.pformat(v, width=100, compact=True)}," for k, v in kwargs.items()]
    return f"{name}(\n" + "\n".join(lines) + f"\n{indent})"


# Iterations between saves when the plan has no interval of its own (no --tokens, no --save-interval)
PLACEHOLDER_SAVE_INTERVAL = 1000


def checkpoint_kwargs(job: Job, save_interval: int | None = None, async_save: bool = False) -> dict[str, Any]:
    """``CheckpointConfig`` keyword arguments: the plan's save interval (``simulator.estimator.goodput``) and
    asynchronous save, the same as its Megatron-LM launch's ``--save-interval`` and ``--async-save``."""
    out: dict[str, Any] = {"save_interval": save_interval if save_interval is not None else PLACEHOLDER_SAVE_INTERVAL,
                           "save": "checkpoints",
                           "ckpt_format": "fsdp_dtensor" if uses_megatron_fsdp(job) else "torch_dist"}
    if async_save and not uses_megatron_fsdp(job):  # Bridge saves fsdp_dtensor checkpoints synchronously only
        out["async_save"] = True
    return out


def bridge_recipe(job: Job, save_interval: int | None = None, async_save: bool = False) -> str:
    """The recipe as a Python module: ``pretrain_config()`` returns the job's ``ConfigContainer``, and run as a
    script under torchrun on the nodes it states it calls Megatron-Bridge's
    ``pretrain(config=pretrain_config(), forward_step_func=forward_step)``. ``save_interval`` and ``async_save``
    are the plan's checkpoint settings, as ``megatron_args`` takes them."""
    p, m = job.plan, job.model
    nodes, per_node = node_shape(job)
    ddp = ddp_config(job)
    notes = [n for n in megatron_notes(job) if "vocabulary" not in n]
    if async_save and uses_megatron_fsdp(job):
        notes.append("Megatron-Bridge saves asynchronously in the torch_dist format only, and Megatron-FSDP needs "
                     "fsdp_dtensor: the plan's asynchronous save is left out, so each save blocks for its write")
    checkpoint = checkpoint_kwargs(job, save_interval, async_save)
    own = "checkpoint path" if save_interval is not None else "checkpoint path and interval"
    placeholders = f"The learning rate, schedule, data, iterations and {own} are placeholders: set your own."
    overlap = {"tp_comm_overlap": p.tp_comm_overlap}
    head = [
        f'"""Megatron-Bridge recipe for {m.name} on {job.num_gpus} x {job.cluster.gpu.name} ({nodes} nodes of '
        f"{per_node}), as simulated.",
        "",
        f"Run: torchrun --nnodes {nodes} --nproc-per-node {per_node} this_file.py (with megatron-bridge installed).",
        placeholders,
        *(f"Note: {n}." for n in notes),
        '"""',
        "",
        "import torch",
        "import torch.nn.functional as F",
        "from megatron.bridge.models import GPTModelProvider",
        "from megatron.bridge.training.comm_overlap import CommOverlapConfig",
        "from megatron.bridge.training.config import (CheckpointConfig, ConfigContainer, GPTDatasetConfig, LoggerConfig,",
        "                                             RNGConfig, SchedulerConfig, TokenizerConfig, TrainingConfig)",
        "from megatron.bridge.training.gpt_step import forward_step",
        "from megatron.bridge.training.mixed_precision import MixedPrecisionConfig",
        "from megatron.bridge.training.pretrain import pretrain",
        "from megatron.core.distributed import DistributedDataParallelConfig",
        "from megatron.core.optimizer import OptimizerConfig",
        "from megatron.core.transformer.enums import AttnBackend",
        "",
        "",
        "def pretrain_config() -> ConfigContainer:",
        "    return ConfigContainer(",
        "        model=" + _call("GPTModelProvider", model_provider_kwargs(job), "        ") + ",",
        "        train=" + _call("TrainingConfig", {"global_batch_size": p.global_batch_size,
                                                    "micro_batch_size": p.micro_batch_size,
                                                    "train_iters": 1000}, "        ") + ",",
        "        optimizer=" + _call("OptimizerConfig", optimizer_kwargs(job), "        ") + ",",
        "        scheduler=" + _call("SchedulerConfig", {"lr_decay_style": "cosine", "lr_warmup_iters": 100},
                                     "        ") + ",",
        "        ddp=" + _call("DistributedDataParallelConfig", ddp, "        ") + ",",
        "        dataset=" + _call("GPTDatasetConfig", {"random_seed": 1234, "sequence_length": m.seq_length,
                                                      "reset_attention_mask": False, "reset_position_ids": False,
                                                      "eod_mask_loss": False}, "        ") + ",",
        "        logger=LoggerConfig(log_interval=10),",
        "        tokenizer=" + _call("TokenizerConfig", {"tokenizer_type": "NullTokenizer",
                                                       "vocab_size": m.vocab_size - 1}, "        ") + ",",
        "        checkpoint=" + _call("CheckpointConfig", checkpoint, "        ") + ",",
        "        rng=RNGConfig(seed=1234),",
        "        comm_overlap=" + _call("CommOverlapConfig", overlap, "        ") + ",",
        "        mixed_precision=" + _call("MixedPrecisionConfig", mixed_precision_kwargs(job), "        ") + ",",
        "    )",
        "",
        "",
        'if __name__ == "__main__":',
        "    pretrain(config=pretrain_config(), forward_step_func=forward_step)",
    ]
    return "\n".join(head) + "\n"
