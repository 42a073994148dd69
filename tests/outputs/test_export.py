"""The launch files run what was simulated: Megatron flags and environment, the NeMo fragment, and
megatron-core's own config classes built from the exported JSON; the flags read back to the same job."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import yaml
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer import TransformerConfig

from simulator.cli.options import job_from_options
from simulator.estimator.prediction import simulate_job
from simulator.outputs.export import launch_lines, megatron_args, megatron_env, megatron_notes, node_shape
from simulator.outputs.export_config import (
    ddp_config,
    gpt_model_args,
    megatron_core_kwargs,
    nemo_yaml,
    transformer_config,
)
from simulator.planner.plan_search import SearchRequest, search
from simulator.spec.catalog import PRESETS, load_model
from simulator.spec.hardware import load_cluster
from simulator.spec.megatron_args import parse_launch, resolve
from simulator.spec.plan import AttentionBackend, Job, ParallelPlan

# Plans a user would type, one per feature the launch must carry.
TYPED = {
    "gpt3-175b interleaved": dict(gpus=1024, tensor_parallel_size=8, pipeline_parallel_size=16,
                                  virtual_pipeline_stages=2, sequence_parallel=True,
                                  recompute_granularity="selective", global_batch_size=1536),
    "llama3.1-405b uneven": dict(model="llama3-405b", cluster="dgx-h100", gpus=16384, tensor_parallel_size=8,
                                 pipeline_parallel_size=16, decoder_first_pipeline_num_layers=7,
                                 decoder_last_pipeline_num_layers=7, sequence_parallel=True, global_batch_size=2048,
                                 use_distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True),
    "llama3.1-405b cp16": dict(model="llama3-405b", seq_length=131072, cluster="dgx-h100", gpus=16384,
                               tensor_parallel_size=8, context_parallel_size=16, pipeline_parallel_size=16,
                               decoder_first_pipeline_num_layers=7, decoder_last_pipeline_num_layers=7,
                               sequence_parallel=True, global_batch_size=64, recompute_granularity="full",
                               recompute_method="uniform", recompute_num_layers=1, use_distributed_optimizer=True),
    "llama3-8b fp8 on H100": dict(model="llama3-8b", cluster="dgx-h100", gpus=16, tensor_parallel_size=2,
                                  sequence_parallel=True, tp_comm_overlap=True, fp8_format="hybrid",
                                  global_batch_size=64),
    "llama2-70b uneven interleaved": dict(model="llama2-70b", cluster="dgx-h100", gpus=128, tensor_parallel_size=8,
                                          pipeline_parallel_size=4, virtual_pipeline_stages=2,
                                          decoder_first_pipeline_num_layers=18, decoder_last_pipeline_num_layers=18,
                                          sequence_parallel=True, global_batch_size=64,
                                          overlap_p2p_comm=False),
    "llama3-8b embedding and loss in the split": dict(model="llama3-8b", cluster="dgx-h100", gpus=16,
                                                      pipeline_parallel_size=2, tensor_parallel_size=2,
                                                      account_for_embedding_in_pipeline_split=True,
                                                      account_for_loss_in_pipeline_split=True, global_batch_size=32),
    "gpt3-6.7b fsdp a2a cp": dict(model="gpt3-6.7b", gpus=32, tensor_parallel_size=2, context_parallel_size=2,
                                  cp_comm_type="a2a", data_parallel_sharding_strategy="optim_grads_params",
                                  use_distributed_optimizer=True, global_batch_size=64),
    "gpt3-13b fp16 block recompute": dict(model="gpt3-13b", gpus=32, tensor_parallel_size=4, pipeline_parallel_size=2,
                                          precision="fp16", accumulate_allreduce_grads_in_fp32=True,
                                          ddp_bucket_size=20_000_000, recompute_granularity="full",
                                          recompute_method="block", recompute_num_layers=3, global_batch_size=64,
                                          data_parallel_sharding_strategy="optim_grads"),
    "gpt3-1.3b on 12 GPUs": dict(model="gpt3-1.3b", gpus=12, tensor_parallel_size=2, global_batch_size=48,
                                 attention_backend="unfused"),
}
# The search's answers: (model, cluster, GPUs, global batch), the top two plans of each.
SEARCHED = (("gpt3-13b", "dgx-a100-80gb", 64, 128), ("llama2-7b", "dgx-h100", 32, 256),
            ("llama3-70b", "dgx-h100", 256, 512))


def _searched_jobs() -> dict[str, Job]:
    jobs = {}
    for model, cluster, gpus, gbs in SEARCHED:
        req = SearchRequest(model=load_model(model), cluster=load_cluster(cluster), num_gpus=gpus,
                            global_batch_size=gbs)
        for ranked in search(req, top=2).plans:
            jobs[f"search {model} {gpus} #{ranked.rank}"] = Job(model=req.model, cluster=req.cluster, plan=ranked.plan)
    return jobs


@pytest.fixture(scope="module")
def jobs() -> dict[str, Job]:
    return {**{name: job_from_options(**kw) for name, kw in TYPED.items()}, **_searched_jobs()}


def _flags(job: Job, name: str) -> list[str]:
    return [a for a in megatron_args(job) if a.split()[0] == name]


def test_every_plan_kind_is_covered(jobs):
    plans = [j.plan for j in jobs.values()]
    assert len(jobs) >= 10
    assert any(p.context_parallel_size > 1 for p in plans) and any(p.fp8_format for p in plans)
    assert any(p.decoder_first_pipeline_num_layers for p in plans) and any(p.interleaved for p in plans)
    assert any(p.account_for_loss_in_pipeline_split for p in plans)
    assert {p.sharding.value for p in plans} == {"no_shard", "optim", "optim_grads", "optim_grads_params"}
    assert len({j.model.name for j in jobs.values()}) >= 6


def test_dropout_is_always_printed():
    """Megatron's default dropout is 0.1: a Llama launch without --attention-dropout 0 trains with it."""
    llama = job_from_options(model="llama3-70b", cluster="dgx-h100", gpus=8, tensor_parallel_size=8)
    gpt = job_from_options(model="gpt3-1.3b", gpus=8)
    for job, value in ((llama, "0"), (gpt, "0.1")):
        args = megatron_args(job)
        assert f"--attention-dropout {value}" in args and f"--hidden-dropout {value}" in args


def test_llama_architecture_flags():
    args = megatron_args(job_from_options(model="llama3-70b", cluster="dgx-h100", gpus=8, tensor_parallel_size=8))
    for flag in ("--normalization RMSNorm", "--swiglu", "--position-embedding-type rope",
                 "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--group-query-attention",
                 "--num-query-groups 8", "--ffn-hidden-size 28672", "--vocab-size 128256"):
        assert flag in args
    gpt = megatron_args(job_from_options(model="gpt3-1.3b", gpus=8))
    assert "--swiglu" not in gpt and "--disable-bias-linear" not in gpt and "--normalization LayerNorm" in gpt


def test_vocabulary_multiple_pads_to_exactly_the_simulated_vocabulary():
    job = job_from_options(model="llama3-70b", cluster="dgx-h100", gpus=8, tensor_parallel_size=8)
    (flag,) = _flags(job, "--make-vocab-size-divisible-by")
    multiple = int(flag.split()[1]) * 8
    assert 128256 % multiple == 0 and multiple <= 128 * 8  # Megatron's default (128 x TP) would pad to 129,024


def test_no_flag_megatron_rejects_and_p2p_overlap_as_megatron_defaults_it(jobs):
    """Megatron rejects --overlap-p2p-communication; it overlaps interleaved sends unless told not to."""
    for job in jobs.values():
        assert not _flags(job, "--overlap-p2p-communication") and not _flags(job, "--use-flash-attn")
        blocking = job.plan.interleaved and not job.plan.overlap_p2p_comm
        assert bool(_flags(job, "--no-overlap-p2p-communication")) == blocking
    assert job_from_options(pipeline_parallel_size=4, virtual_pipeline_stages=2, gpus=32,
                            global_batch_size=32).plan.overlap_p2p_comm is True
    assert job_from_options(pipeline_parallel_size=4, gpus=32).plan.overlap_p2p_comm is False


def test_default_attention_is_megatrons_default():
    default = {f.name: f.default for f in dataclasses.fields(TransformerConfig)}["attention_backend"]
    assert ParallelPlan().attention_backend.value == default.name == "auto"
    assert job_from_options(model="gpt3-1.3b").plan.attention_backend is AttentionBackend.auto
    assert SearchRequest(model=PRESETS["gpt3-1.3b"], cluster=load_cluster("dgx-a100-80gb"), num_gpus=8,
                         global_batch_size=8).use_flash_attention is True  # the search simulates auto too
    assert "--attention-backend auto" in megatron_args(job_from_options(model="gpt3-1.3b"))


def test_every_feature_has_its_flag(jobs):
    uneven = jobs["llama3.1-405b uneven"]
    assert {"--decoder-first-pipeline-num-layers 7", "--decoder-last-pipeline-num-layers 7",
            "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"} <= set(
        megatron_args(uneven))
    cp = megatron_args(jobs["llama3.1-405b cp16"])
    assert "--context-parallel-size 16" in cp and "--cp-comm-type p2p" in cp and "--seq-length 131072" in cp
    fp8 = megatron_args(jobs["llama3-8b fp8 on H100"])
    assert {"--fp8-format hybrid", "--transformer-impl transformer_engine", "--tp-comm-overlap"} <= set(fp8)
    fsdp = megatron_args(jobs["gpt3-6.7b fsdp a2a cp"])
    assert {"--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads_params",
            "--use-distributed-optimizer", "--no-gradient-accumulation-fusion", "--cp-comm-type a2a",
            "--ckpt-format fsdp_dtensor"} <= set(fsdp)  # validate_args refuses Megatron-FSDP with any other format
    assert not any(a.startswith("--ckpt-format") for a in megatron_args(uneven))
    fp16 = megatron_args(jobs["gpt3-13b fp16 block recompute"])
    assert {"--fp16", "--accumulate-allreduce-grads-in-fp32", "--ddp-bucket-size 20000000",
            "--recompute-method block", "--recompute-num-layers 3"} <= set(fp16)
    inter = megatron_args(jobs["llama2-70b uneven interleaved"])
    assert "--num-virtual-stages-per-pipeline-rank 2" in inter
    assert not any(a.startswith("--num-layers-per-virtual-pipeline-stage") for a in inter)
    assert "--attention-backend unfused" in megatron_args(jobs["gpt3-1.3b on 12 GPUs"])


def test_environment():
    tp = job_from_options(model="gpt3-1.3b", gpus=8, tensor_parallel_size=2)
    assert megatron_env(tp) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert megatron_env(job_from_options(model="gpt3-1.3b", gpus=8)) == {}
    fsdp = job_from_options(model="gpt3-1.3b", gpus=8, data_parallel_sharding_strategy="optim_grads")
    assert megatron_env(fsdp)["CUDA_DEVICE_MAX_CONNECTIONS"] != "1"  # Megatron-FSDP asserts it is not 1
    assert launch_lines(tp)[0].startswith("CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nnodes 1 --nproc-per-node 8 ")
    # the queues the simulation assumed are the ones the launch sets, and a plan that names them gets them
    for j in (tp, fsdp, job_from_options(model="gpt3-1.3b", gpus=8, tensor_parallel_size=2,
                                         cuda_device_max_connections=4)):
        assert megatron_env(j)["CUDA_DEVICE_MAX_CONNECTIONS"] == str(j.plan.work_queues)
    many = job_from_options(model="gpt3-1.3b", gpus=8, tensor_parallel_size=2, cuda_device_max_connections=8)
    assert not many.plan.collectives_issued_in_order and tp.plan.collectives_issued_in_order
    assert any("CUDA_DEVICE_MAX_CONNECTIONS=8" in n for n in megatron_notes(many))
    # the launch printed for a plan with its own queues reads back to them, and to the same prediction
    back = round_trip(many)
    assert back.plan.cuda_device_max_connections == 8 and simulate_job(back).estimate == simulate_job(many).estimate
    script = "export CUDA_DEVICE_MAX_CONNECTIONS=4\ntorchrun pretrain_gpt.py --tensor-model-parallel-size 2\n"
    assert parse_launch(script).get("p.cuda_device_max_connections") == 4


def test_nodes_multiply_to_the_gpu_count(jobs):
    job = jobs["gpt3-1.3b on 12 GPUs"]
    nodes, per_node = node_shape(job)
    assert (nodes, per_node) == (2, 6)
    trainer = yaml.safe_load(nemo_yaml(job))["trainer"]
    assert trainer["num_nodes"] * trainer["devices"] == 12
    assert any("do not fill nodes of 8" in n for n in megatron_notes(job))
    assert "--nnodes 2 --nproc-per-node 6" in launch_lines(job)[0]
    for job in jobs.values():
        trainer = yaml.safe_load(nemo_yaml(job))["trainer"]
        assert trainer["num_nodes"] * trainer["devices"] == job.num_gpus


def test_nemo_fragment_carries_the_architecture_and_layout(jobs):
    llama = yaml.safe_load(nemo_yaml(jobs["llama3.1-405b cp16"]))["model"]
    assert llama["normalization"] == "rmsnorm" and llama["activation"] == "fast-swiglu"
    assert llama["position_embedding_type"] == "rope" and llama["share_embeddings_and_output_weights"] is False
    assert llama["bias"] is False and llama["hidden_dropout"] == 0 and llama["attention_dropout"] == 0
    assert llama["num_query_groups"] == 8 and llama["context_parallel_size"] == 16
    assert llama["num_layers_in_first_pipeline_stage"] == 7 and llama["encoder_seq_length"] == 131072
    gpt = yaml.safe_load(nemo_yaml(jobs["gpt3-175b interleaved"]))["model"]
    assert gpt["normalization"] == "layernorm" and gpt["activation"] == "gelu" and gpt["hidden_dropout"] == 0.1
    assert gpt["virtual_pipeline_model_parallel_size"] == 2 and gpt["overlap_p2p_comm"] is True
    fp8 = yaml.safe_load(nemo_yaml(jobs["llama3-8b fp8 on H100"]))["model"]
    assert fp8["fp8"] is True and fp8["fp8_hybrid"] is True and fp8["ub_tp_comm_overlap"] is True


def _megatron_configs(job: Job):
    config = TransformerConfig(**megatron_core_kwargs(transformer_config(job)))
    return config, DistributedDataParallelConfig(**ddp_config(job))


def test_transformer_config_constructs_in_megatron_core(jobs):
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    model_params = set(inspect.signature(GPTModel.__init__).parameters)
    for name, job in jobs.items():
        exported = transformer_config(job)
        assert set(exported) <= fields, name
        assert set(gpt_model_args(job)) <= model_params, name
        config, ddp = _megatron_configs(job)
        m, p = job.model, job.plan
        assert (config.num_layers, config.hidden_size, config.ffn_hidden_size) == (m.num_layers, m.hidden_size,
                                                                                    m.ffn_size), name
        assert config.num_query_groups == m.query_groups and config.kv_channels == m.head_dim
        assert config.gated_linear_unit == m.swiglu and config.add_bias_linear == m.add_bias_linear
        assert config.hidden_dropout == m.hidden_dropout and config.normalization == m.normalization.value
        assert config.attention_backend.name == p.attention_backend.value
        assert config.virtual_pipeline_model_parallel_size == (p.virtual_pipeline_stages if p.interleaved else None)
        assert config.context_parallel_size == p.context_parallel_size and config.fp8 == (
            p.fp8_format.value if p.fp8_format else None)
        assert config.num_layers_in_first_pipeline_stage == p.decoder_first_pipeline_num_layers
        assert ddp.use_distributed_optimizer == p.shards_optimizer
        assert ddp.data_parallel_sharding_strategy == (p.sharding.value if ddp.use_megatron_fsdp else "no_shard")


def test_megatron_core_refuses_what_it_should():
    """The construction is a real check: megatron-core raises on an inconsistent config."""
    job = job_from_options(model="gpt3-1.3b", gpus=8, tensor_parallel_size=2, pipeline_parallel_size=4)
    exported = transformer_config(job)
    TransformerConfig(**megatron_core_kwargs({**exported, "num_layers_in_first_pipeline_stage": 4,
                                              "num_layers_in_last_pipeline_stage": 4}))  # 16 middle layers over 2
    with pytest.raises(ValueError):  # 15 middle layers do not split over 2 stages
        TransformerConfig(**megatron_core_kwargs({**exported, "num_layers_in_first_pipeline_stage": 5,
                                                  "num_layers_in_last_pipeline_stage": 4}))
    with pytest.raises(ValueError):
        TransformerConfig(**megatron_core_kwargs({**exported, "fp16": True}))  # and bf16


def round_trip(job: Job) -> Job:
    """The printed launch (torchrun line and flags) read back as `simulator plan --megatron-args` reads it,
    on the default base model, so every architecture value must come from the flags."""
    launch = parse_launch(" \\\n  ".join(launch_lines(job)), job.cluster.gpus_per_node)
    model, options, _ = resolve(launch, PRESETS["gpt3-175b"], None)
    split = options.pop("pipeline_layer_split", None)
    back = job_from_options(model_overrides={**model, "name": job.model.name},
                            plan_overrides={"pipeline_layer_split": split} if split else None,
                            model="gpt3-175b", cluster=job.cluster.name, **options)
    return back


def _architecture(model) -> dict:
    """The model's fields with the defaults spelled out (ffn 4h, as many groups as heads)."""
    return {**model.model_dump(), "ffn_hidden_size": model.ffn_size, "num_query_groups": model.query_groups}


def test_flags_round_trip_to_the_same_prediction(jobs):
    for name, job in jobs.items():
        back = round_trip(job)
        assert _architecture(back.model) == _architecture(job.model), name
        same = {"use_distributed_optimizer", "data_parallel_sharding_strategy", "accumulate_allreduce_grads_in_fp32"}
        assert back.plan.model_dump(exclude=same) == job.plan.model_dump(exclude=same), name
        assert (back.plan.sharding, back.plan.grad_bytes) == (job.plan.sharding, job.plan.grad_bytes), name
        assert back.num_gpus == job.num_gpus
        assert simulate_job(back).estimate == simulate_job(job).estimate, name
        assert transformer_config(back) == transformer_config(job), name


def test_explicit_stage_split_round_trips_as_a_layout():
    job = job_from_options(model="gpt3-1.3b", gpus=3, pipeline_parallel_size=3, global_batch_size=6,
                           plan_overrides={"pipeline_layer_split": (7, 9, 8)})
    assert "--pipeline-model-parallel-layout 'Et*7|t*9|t*8L'" in megatron_args(job)  # quoted: '|' would pipe
    assert round_trip(job).plan.pipeline_layer_split == (7, 9, 8)
    config, _ = _megatron_configs(job)
    assert config.pipeline_model_parallel_layout is not None
