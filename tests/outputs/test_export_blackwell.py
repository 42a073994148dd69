"""The launches of the plans the search picks on GB200 NVL72 (TP 16 inside a domain, EP 64 inside a domain,
Megatron-FSDP over racks) build megatron-core's own configs, start whole compute trays, and say how to place them."""

from __future__ import annotations

import inspect

import pytest
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer import TransformerConfig

from simulator.cli.options import job_from_options
from simulator.outputs.export import megatron_args, megatron_notes, node_shape
from simulator.outputs.export_config import ddp_config, gpt_model_args, megatron_core_kwargs, transformer_config

NVL72 = dict(cluster="gb200-nvl72")
PLANS = {  # each the best plan `simulator search` gives for its question (TP 16 pinned for the second)
    "llama3-405b fsdp": dict(model="llama3-405b", **NVL72, gpus=576, tensor_parallel_size=2, context_parallel_size=2,
                             sequence_parallel=True, use_distributed_optimizer=True,
                             data_parallel_sharding_strategy="optim_grads_params", global_batch_size=1152),
    "llama3-405b tp16": dict(model="llama3-405b", **NVL72, gpus=576, tensor_parallel_size=16, pipeline_parallel_size=6,
                             virtual_pipeline_stages=21, micro_batch_size=4, sequence_parallel=True,
                             use_distributed_optimizer=True, global_batch_size=1152),
    "deepseek-v3-style ep64": dict(model="deepseek-v3-style", **NVL72, gpus=1152, pipeline_parallel_size=3,
                                   virtual_pipeline_stages=7, account_for_embedding_in_pipeline_split=True,
                                   account_for_loss_in_pipeline_split=True, expert_model_parallel_size=64,
                                   moe_token_dispatcher_type="alltoall", moe_grouped_gemm=True,
                                   use_distributed_optimizer=True, global_batch_size=4608),
}


@pytest.fixture(scope="module")
def jobs():
    return {name: job_from_options(**kw) for name, kw in PLANS.items()}


def test_the_gb200_launches_build_megatron_cores_configs(jobs):
    model_params = set(inspect.signature(GPTModel.__init__).parameters)
    for name, job in jobs.items():
        config = TransformerConfig(**megatron_core_kwargs(transformer_config(job)))
        DistributedDataParallelConfig(**ddp_config(job))
        assert set(gpt_model_args(job)) <= model_params, name
        assert config.tensor_model_parallel_size == job.plan.tensor_parallel_size, name
        assert config.expert_model_parallel_size == job.plan.expert_model_parallel_size, name
    assert "--tensor-model-parallel-size 16" in megatron_args(jobs["llama3-405b tp16"])
    assert "--expert-model-parallel-size 64" in megatron_args(jobs["deepseek-v3-style ep64"])


def test_a_gb200_launch_starts_whole_trays_and_says_how_to_place_them(jobs):
    for name, job in jobs.items():
        assert node_shape(job) == (job.num_gpus // 4, 4), name
        assert any("--segment=16" in note for note in megatron_notes(job)), name
    h100 = job_from_options(model="llama3-8b", cluster="dgx-h100", gpus=16, global_batch_size=16)
    assert not any("--segment" in note for note in megatron_notes(h100))
