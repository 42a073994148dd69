"""Megatron training logs for the tests, in the formats Megatron-LM's and Megatron-Bridge's ``training_log``,
``_print_args`` and ``Timers.log`` print (the writers live in ``simulator.measure.megatron_log``).

``python -m tests.measure.log_fixtures`` writes the committed fixtures under ``fixtures/logs``; the times in
them are made up (a run whose steady iteration is ``STEADY_S``), not measurements.
"""

from __future__ import annotations

from pathlib import Path

from simulator.measure.megatron_log import arguments_block, iteration_line, timers_block

FIXTURES = Path(__file__).parent / "fixtures" / "logs"
STEADY_S = 1.85

# a GPT of 1.3B parameters on 16 GPUs, TP 2, PP 2, DP 4, as Megatron-LM prints its arguments after validate_args
ARGUMENTS: dict[str, object] = {
    "accumulate_allreduce_grads_in_fp32": True, "adam_beta1": 0.9, "adam_beta2": 0.95, "adam_eps": 1e-08,
    "add_bias_linear": True, "add_position_embedding": True, "apply_query_key_layer_scaling": False,
    "attention_backend": "AttnBackend.auto", "attention_dropout": 0.1, "bf16": True, "clip_grad": 1.0,
    "context_parallel_size": 1, "cp_comm_type": ["p2p"], "data_parallel_sharding_strategy": "no_shard",
    "data_parallel_size": 4, "data_path": ["/data/pile_text_document"], "ddp_bucket_size": None,
    "encoder_seq_length": 2048, "eval_interval": 1000, "eval_iters": 10, "expert_model_parallel_size": 1,
    "expert_tensor_parallel_size": 2, "ffn_hidden_size": 8192, "fp16": False, "fp8": None,
    "global_batch_size": 256, "group_query_attention": False, "hidden_dropout": 0.1, "hidden_size": 2048,
    "init_method_std": 0.02, "kv_channels": 128, "log_interval": 10, "log_throughput": True, "lr": 0.0002,
    "main_grads_dtype": "torch.float32", "make_vocab_size_divisible_by": 128, "max_position_embeddings": 2048,
    "micro_batch_size": 4, "num_attention_heads": 16, "num_experts": None, "num_layers": 24,
    "num_layers_per_virtual_pipeline_stage": None, "num_query_groups": 16, "overlap_grad_reduce": True,
    "overlap_p2p_comm": False, "overlap_param_gather": False, "params_dtype": "torch.bfloat16",
    "pipeline_model_parallel_size": 2, "position_embedding_type": "learned_absolute", "rank": 0,
    "recompute_granularity": "selective", "recompute_method": None, "recompute_num_layers": None,
    "save": "/checkpoints/gpt-1.3b", "save_interval": 100, "seed": 1234, "seq_length": 2048,
    "sequence_parallel": True, "swiglu": False, "tensor_model_parallel_size": 2, "timing_log_level": 1,
    "tokenizer_type": "GPT2BPETokenizer", "train_iters": 200, "transformer_impl": "transformer_engine",
    "untie_embeddings_and_output_weights": False, "use_distributed_optimizer": True,
    "use_megatron_fsdp": False, "virtual_pipeline_model_parallel_size": None, "vocab_size": None,
    "world_size": 16,
}

PREAMBLE = [
    "using world size: 16, data-parallel size: 4, context-parallel size: 1, tensor-model-parallel size: 2, "
    "pipeline-model-parallel size: 2",
    "> building GPT2BPETokenizer tokenizer ...",
    " > padded vocab (size: 50257) with 431 dummy tokens (new size: 50688)",
    "> initializing torch distributed ...",
    "[after dataloaders are built] datetime: 2026-03-02 09:14:05 ",
    "done with setup ...",
    "(min, max) time across ranks (ms):",
    "    model-and-optimizer-setup ......................: (5012.33, 5104.87)",
    "    train/valid/test-data-iterators-setup ..........: (812.10, 840.55)",
    "training ...",
    "[before the start of training step] datetime: 2026-03-02 09:14:06 ",
]


def _time_of(iteration: int) -> float:
    """Warm-up slow, then steady with a small deterministic wobble."""
    if iteration <= 3:
        return STEADY_S * (3.0 - 0.5 * iteration)
    return STEADY_S * (1 + 0.004 * (((iteration - 1) // 5 * 7) % 5 - 2))


def megatron_lm_log(iterations: int = 200, log_interval: int = 10, timestamp: bool = True,
                    arguments: dict[str, object] | None = None, save_interval: int | None = 100,
                    eval_interval: int | None = 1000, timers: bool = True) -> list[str]:
    """Lines of a Megatron-LM run: arguments, set-up, iteration lines every ``log_interval``, the timers after
    each, a save every ``save_interval`` (slower), the memory report after the first interval."""
    lines = arguments_block(arguments if arguments is not None else ARGUMENTS) + PREAMBLE
    gbs = 256
    for it in range(log_interval, iterations + 1, log_interval):
        span = range(it - log_interval + 1, it + 1)
        elapsed = sum(_time_of(i) for i in span) / log_interval
        if save_interval and (it - log_interval) % save_interval == 0 and it > log_interval:
            elapsed *= 1.03  # the interval after a save runs behind its async finalisation
        stamp = f"2026-03-02 09:{14 + it // 60:02d}:{it % 60:02d}.{it * 1013 % 1000000:06d}" if timestamp else None
        lines.append(iteration_line(it, iterations, it * gbs, elapsed, 1.5e-4, gbs, {"lm loss": 9.0 - it / 100},
                                    grad_norm=1.2, throughput_tflops_per_gpu=101.3 if timestamp else None,
                                    timestamp=stamp))
        if it == log_interval:
            lines.append("[Rank 0] (after 10 iterations) memory (MB) | allocated: 14012.5 | max allocated: "
                         "10231.9 | reserved: 13108.0 | max reserved: 13108.0")
        if timers:
            lines += timers_block({"forward-backward": (elapsed * 1e3 * 0.93, elapsed * 1e3 * 0.95),
                                   "optimizer": (elapsed * 1e3 * 0.04, elapsed * 1e3 * 0.045)})
        if save_interval and it % save_interval == 0:
            lines += [f"saving checkpoint at iteration {it:7d} to /checkpoints/gpt-1.3b in torch_dist format",
                      f"  successfully saved checkpoint from iteration {it:7d} to /checkpoints/gpt-1.3b "
                      "[ t 1/2, p 1/2 ]"]
        if eval_interval and it % eval_interval == 0:
            lines.append("-" * 100)
            lines.append(f" validation loss at iteration {it} on validation set | lm loss value: 7.1E+00 |")
    return lines


def megatron_lm_2022_log() -> list[str]:
    """Megatron-LM of 2022 (v3.0): no timestamp or throughput, the learning rate to 3 digits, and its timers on
    one line ("time (ms) | name: ms | ...")."""
    lines = arguments_block({k: v for k, v in ARGUMENTS.items() if k not in (
        "attention_backend", "cp_comm_type", "data_parallel_sharding_strategy", "expert_tensor_parallel_size",
        "use_megatron_fsdp", "main_grads_dtype", "log_throughput", "transformer_impl", "fp8")}) + PREAMBLE[:6]
    for it in range(10, 201, 10):
        elapsed = sum(_time_of(i) for i in range(it - 9, it + 1)) / 10
        line = " iteration {:8d}/{:8d} |".format(it, 200)
        line += " consumed samples: {:12d} |".format(it * 256)
        line += " elapsed time per iteration (ms): {:.1f} |".format(elapsed * 1000.0)
        line += " learning rate: {:.3E} |".format(1.5e-4)
        line += " global batch size: {:5d} |".format(256)
        line += " lm loss: {:.6E} |".format(9.0 - it / 100)
        line += " loss scale: {:.1f} |".format(1.0)
        line += " grad norm: {:.3f} |".format(1.2)
        line += " number of skipped iterations: {:3d} |".format(0)
        line += " number of nan iterations: {:3d} |".format(0)
        lines.append(line)
        lines.append("time (ms) | forward-compute: {:.2f} | backward-compute: {:.2f} | optimizer: {:.2f}".format(
            elapsed * 1e3 * 0.3, elapsed * 1e3 * 0.6, elapsed * 1e3 * 0.04))
        if it % 100 == 0:
            lines += [f"saving checkpoint at iteration {it:7d} to /checkpoints/gpt-1.3b",
                      f"  successfully saved checkpoint at iteration {it:7d} to /checkpoints/gpt-1.3b"]
    return lines


def bridge_log(newer: bool = True) -> list[str]:
    """Megatron-Bridge: no arguments block; a "Step Time" line before each iteration line (rank 0's), the
    timestamp to the second, the memory report in GB. ``newer``: with throughput in the line and
    'max attention logit' (Bridge after its FLOPs moved to the interval's own count)."""
    lines = [
        "> initializing torch distributed ...", "training ..."]
    for it in range(5, 151, 5):
        elapsed = sum(_time_of(i) for i in range(it - 4, it + 1)) / 5
        lines.append(f"Step Time : {elapsed:.2f}s GPU utilization: 101.3MODEL_TFLOP/s/GPU")
        line = f" [2026-03-02 10:{it // 60:02d}:{it % 60:02d}]"
        line += " iteration {:8d}/{:8d} |".format(it, 150)
        line += " consumed samples: {:12d} |".format(it * 256)
        line += " elapsed time per iteration (ms): {:.1f} |".format(elapsed * 1000.0)
        if newer:
            line += f" throughput per GPU (TFLOP/s/GPU): {101.3:.1f} |"
        line += f" learning rate: {1.5e-4:.6E} |"
        line += f" global batch size: {256:5d} |"
        line += " lm loss: {:.6E} |".format(9.0 - it / 100)
        line += f" loss scale: {1.0:.1f} |"
        line += f" grad norm: {1.2:.3f} |"
        if newer:
            line += f" max attention logit: {31.4:.3f} |"
        line += " number of skipped iterations: {:3d} |".format(0)
        line += " number of nan iterations: {:3d} |".format(0)
        lines.append(line)
        if it == 5:
            lines.append("[Rank 0] (after 5 iterations) memory (GB) | mem-allocated-gigabytes: 14.693 | "
                         "mem-max-allocated-gigabytes: 10.186 | mem-reserved-gigabytes: 13.202")
    return lines


# the Megatron flags of the plan the Bridge runs trained, beside their logs
BRIDGE_LAUNCH = """#!/bin/bash
torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py \\
    --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 \\
    --max-position-embeddings 2048 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \\
    --sequence-parallel --micro-batch-size 4 --global-batch-size 256 --bf16 \\
    --recompute-activations --use-distributed-optimizer --overlap-grad-reduce \\
    --tokenizer-type GPT2BPETokenizer --log-interval 5
"""


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


if __name__ == "__main__":
    FIXTURES.mkdir(parents=True, exist_ok=True)
    write(FIXTURES / "megatron_lm_core_r0.13.log", megatron_lm_log())
    write(FIXTURES / "megatron_lm_v3.0_2022.log", megatron_lm_2022_log())
    write(FIXTURES / "megatron_bridge_0.2.log", bridge_log(newer=True))
    write(FIXTURES / "megatron_bridge_0.1.log", bridge_log(newer=False))
    (FIXTURES / "bridge_launch.sh").write_text(BRIDGE_LAUNCH, encoding="utf-8")
