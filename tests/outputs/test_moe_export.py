"""Mixture-of-experts jobs as the launches that run them: Megatron flags, the NeMo fragment and megatron-core's
``TransformerConfig`` built from the exported JSON; the flags read back to the same experts and expert layout."""

from __future__ import annotations

import warnings

import pytest
import yaml

pytest.importorskip("megatron.core")
from megatron.core.transformer import TransformerConfig  # noqa: E402

from simulator.cli.options import job_from_options
from simulator.outputs.export import layer_freq_pattern, megatron_args, megatron_notes
from simulator.outputs.export_config import megatron_core_kwargs, nemo_yaml, transformer_config
from simulator.spec.catalog import PRESETS
from simulator.spec.errors import ConfigError
from simulator.spec.megatron_args import layer_freq, parse_launch, resolve
from simulator.spec.plan import Job
from tests.outputs.test_export import round_trip  # noqa: E402

MOE_JOBS = {
    "mixtral-8x7b ep8 alltoall grouped": dict(
        model="mixtral-8x7b", cluster="dgx-h100", gpus=64, tensor_parallel_size=2, sequence_parallel=True,
        pipeline_parallel_size=4, expert_model_parallel_size=8, expert_tensor_parallel_size=1,
        moe_token_dispatcher_type="alltoall", moe_grouped_gemm=True, global_batch_size=64),
    "qwen1.5-moe shared experts, etp = tp": dict(
        model="qwen1.5-moe-a2.7b", cluster="dgx-h100", gpus=16, tensor_parallel_size=2, sequence_parallel=True,
        expert_model_parallel_size=4, global_batch_size=64),
    "qwen3-30b-a3b own head size": dict(
        model="qwen3-30b-a3b", cluster="dgx-h100", gpus=16, expert_model_parallel_size=16,
        moe_token_dispatcher_type="alltoall", global_batch_size=64, moe_load_imbalance=1.2),
    "deepseek-v3-style layer pattern": dict(
        model="deepseek-v3-style", cluster="dgx-h100", gpus=1024, tensor_parallel_size=8, sequence_parallel=True,
        pipeline_parallel_size=8, decoder_first_pipeline_num_layers=7, decoder_last_pipeline_num_layers=6,
        expert_model_parallel_size=64, expert_tensor_parallel_size=1, moe_token_dispatcher_type="alltoall",
        moe_grouped_gemm=True, global_batch_size=1024),
}
EXPERT_FIELDS = ("num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
                 "moe_layer_freq", "moe_expert_capacity_factor", "kv_channels", "qk_layernorm")
LAYOUT_FIELDS = ("expert_model_parallel_size", "expert_tensor_parallel_size", "moe_token_dispatcher_type",
                 "moe_grouped_gemm", "sequence_parallel")


@pytest.fixture(scope="module")
def jobs() -> dict[str, Job]:
    return {name: job_from_options(**kw) for name, kw in MOE_JOBS.items()}


def _config(job: Job) -> TransformerConfig:
    with warnings.catch_warnings():  # megatron-core's advice (fp32 routing for many experts) is not a failure
        warnings.simplefilter("ignore")
        return TransformerConfig(**megatron_core_kwargs(transformer_config(job)))


def test_transformer_config_of_moe_plans_constructs_in_megatron_core(jobs):
    for name, job in jobs.items():
        config, m, p = _config(job), job.model, job.plan
        assert config.num_moe_experts == m.num_experts and config.moe_router_topk == m.moe_router_topk, name
        assert config.moe_ffn_hidden_size == m.expert_ffn_size and config.ffn_hidden_size == m.ffn_size, name
        assert config.moe_shared_expert_intermediate_size == m.moe_shared_expert_intermediate_size, name
        assert config.expert_model_parallel_size == p.expert_model_parallel_size, name
        assert config.expert_tensor_parallel_size == p.expert_tp_size, name
        assert config.moe_token_dispatcher_type == p.moe_token_dispatcher_type.value, name
        assert config.moe_grouped_gemm == p.moe_grouped_gemm and config.kv_channels == m.head_dim, name
        assert config.qk_layernorm == m.qk_layernorm, name
        layers = config.moe_layer_freq
        pattern = [int(i % layers == 0) for i in range(m.num_layers)] if isinstance(layers, int) else layers
        assert pattern == [int(m.is_moe_layer(i)) for i in range(m.num_layers)], name
    deepseek = _config(jobs["deepseek-v3-style layer pattern"])
    assert deepseek.moe_layer_freq == [0, 0, 0] + [1] * 58


def test_megatron_core_checks_the_exported_experts():
    """The construction is a real check: megatron-core refuses expert parallelism without experts."""
    job = job_from_options(model="mixtral-8x7b", cluster="dgx-h100", gpus=8, expert_model_parallel_size=8)
    exported = transformer_config(job)
    with pytest.raises(ValueError, match="num_moe_experts must be non None"):
        TransformerConfig(**megatron_core_kwargs({**exported, "num_moe_experts": None, "moe_ffn_hidden_size": None}))


def test_moe_flags_say_the_experts_and_their_layout(jobs):
    mixtral = megatron_args(jobs["mixtral-8x7b ep8 alltoall grouped"])
    assert {"--num-experts 8", "--moe-router-topk 2", "--moe-ffn-hidden-size 14336", "--expert-model-parallel-size 8",
            "--expert-tensor-parallel-size 1", "--moe-token-dispatcher-type alltoall", "--moe-grouped-gemm",
            "--sequence-parallel"} <= set(mixtral)
    assert not any(a.startswith(("--moe-layer-freq", "--moe-shared", "--moe-router-load-balancing")) for a in mixtral)
    qwen = megatron_args(jobs["qwen1.5-moe shared experts, etp = tp"])
    assert "--moe-shared-expert-intermediate-size 5632" in qwen and "--moe-token-dispatcher-type allgather" in qwen
    assert not any(a.startswith("--expert-tensor-parallel-size") for a in qwen)  # Megatron's default: TP
    qwen3 = megatron_args(jobs["qwen3-30b-a3b own head size"])
    assert {"--kv-channels 128", "--qk-layernorm"} <= set(qwen3)
    deepseek = megatron_args(jobs["deepseek-v3-style layer pattern"])
    assert "--moe-layer-freq '([0]*3+[1]*58)'" in deepseek
    dense = megatron_args(job_from_options(model="llama3-8b", cluster="dgx-h100", gpus=8))
    assert not any("expert" in a or "moe" in a for a in dense)


def test_every_moe_output_states_the_load_imbalance(jobs):
    notes = megatron_notes(jobs["qwen3-30b-a3b own head size"])
    assert any("busiest expert rank gets 1.2 x its balanced share" in n for n in notes)
    assert not any("expert" in n for n in megatron_notes(job_from_options(model="llama3-8b", cluster="dgx-h100")))


def test_nemo_fragment_carries_the_experts(jobs):
    model = yaml.safe_load(nemo_yaml(jobs["deepseek-v3-style layer pattern"]))["model"]
    assert model["num_moe_experts"] == 256 and model["moe_router_topk"] == 8
    assert model["moe_layer_freq"] == [0, 0, 0] + [1] * 58 and model["moe_ffn_hidden_size"] == 2048
    assert model["moe_shared_expert_intermediate_size"] == 2048 and model["expert_model_parallel_size"] == 64
    assert model["expert_tensor_parallel_size"] == 1 and model["moe_token_dispatcher_type"] == "alltoall"
    assert model["moe_grouped_gemm"] is True and model["kv_channels"] == 128
    mixtral = yaml.safe_load(nemo_yaml(jobs["mixtral-8x7b ep8 alltoall grouped"]))["model"]
    assert mixtral["moe_layer_freq"] == 1 and mixtral["moe_shared_expert_intermediate_size"] is None


def test_moe_flags_round_trip_to_the_same_experts_and_layout(jobs):
    for name, job in jobs.items():
        back = round_trip(job)
        for f in EXPERT_FIELDS:
            assert getattr(back.model, f) == getattr(job.model, f), (name, f)
        for f in LAYOUT_FIELDS:
            assert getattr(back.plan, f) == getattr(job.plan, f), (name, f)
        assert transformer_config(back) == transformer_config(job), name


def test_capacity_factor_is_exported_and_read_back():
    capped = PRESETS["mixtral-8x7b"].model_copy(update={"moe_expert_capacity_factor": 1.25})
    job = job_from_options(model="mixtral-8x7b", cluster="dgx-h100", gpus=8, expert_model_parallel_size=8,
                           model_overrides={"moe_expert_capacity_factor": 1.25})
    assert job.model == capped
    assert "--moe-expert-capacity-factor 1.25" in megatron_args(job)
    assert round_trip(job).model.moe_expert_capacity_factor == 1.25
    assert _config(job).moe_expert_capacity_factor == 1.25


@pytest.mark.parametrize("freq", [
    (0, 0, 0) + (1,) * 58, (1, 0) * 12, (0, 1, 1) * 4, (1, 1, 0), (0, 1, 0, 1, 1, 1), (1,) * 5 + (0,),
])
def test_layer_freq_patterns_read_back_as_megatron_evaluates_them(freq):
    text = layer_freq_pattern(freq)
    assert list(eval(text)) == list(freq)  # what Megatron's argparse type does with it
    assert layer_freq(text, len(freq)) == freq


@pytest.mark.parametrize("text, expected", [
    ("2", 2), ("[1,0,1,0]", (1, 0, 1, 0)), ("([1]*3+[0]*1)*3", (1, 1, 1, 0) * 3), ("[0]*2+[1]", (0, 0, 1)),
])
def test_layer_freq_reads_megatrons_forms(text, expected):
    assert layer_freq(text, 12) == expected


@pytest.mark.parametrize("text", ["[2,1]", "__import__('os')", "[1]*10**9", "([1]*3+[0]", "[1,[0]]", "one", "[1.0]",
                                  "[1]*-1+[0]"])
def test_layer_freq_refuses_anything_else_in_one_sentence(text):
    with pytest.raises(ConfigError, match="--moe-layer-freq"):
        layer_freq(text, 12)


def test_megatron_lines_with_experts_are_read_not_refused():
    line = ("torchrun --nnodes 8 --nproc-per-node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
            "--num-attention-heads 32 --ffn-hidden-size 14336 --swiglu --num-experts 8 --moe-router-topk 2 "
            "--expert-model-parallel-size 8 --tensor-model-parallel-size 2 --sequence-parallel "
            "--moe-token-dispatcher-type alltoall --moe-grouped-gemm --moe-aux-loss-coeff 1e-2 "
            "--moe-router-load-balancing-type aux_loss --moe-pad-expert-input-to-capacity --bf16")
    model, options, notes = resolve(parse_launch(line), PRESETS["gpt3-175b"], None)
    assert (model["num_experts"], model["moe_router_topk"]) == (8, 2)
    assert options["expert_model_parallel_size"] == 8 and options["moe_token_dispatcher_type"] == "alltoall"
    assert options["moe_grouped_gemm"] is True
    # the balancing loss changes training, not speed (silent); padding to capacity is not modelled (a note)
    assert any("--moe-pad-expert-input-to-capacity" in n for n in notes)
    assert not any("aux-loss" in n or "load-balancing" in n for n in notes)
    with pytest.raises(ConfigError, match="--multi-latent-attention: the simulator models GPTs with standard"):
        parse_launch(line + " --multi-latent-attention")
    with pytest.raises(ConfigError, match="--moe-token-dispatcher-type flex is not one of alltoall, allgather"):
        parse_launch(line.replace("dispatcher-type alltoall", "dispatcher-type flex"))
