"""The attention blocks of the published profiles: FlashAttention-2 on A100, and on Hopper the FA3 paper's
curves of FlashAttention-2, cuDNN's fused attention and FlashAttention-3, each fitted as fractions of peak with
its sequence, head-size and causal terms (``simulator.cost.attention`` reads them).
"""

from __future__ import annotations

import functools

from calibration.published_data import LAUNCH_OVERHEAD_S, LAUNCH_RANGE, LAUNCH_SOURCE, MD, measured_rows
from simulator.cost.profile import AttentionParams
from simulator.measure.fitting import fit_attention
from simulator.spec.hardware import GpuSpec


def _fa2_a100_fit():
    # FA2's benchmark: 16k tokens per batch, hidden 2048, head dim 128 (16 heads), non-causal.
    def point(seq: int, backward: bool, eff: float) -> tuple:
        bh = (16384 // seq) * 16
        fwd = 4.0 * bh * seq * seq * 128
        return (bh, seq, 128, False, backward, (2.5 if backward else 1.0) * fwd / (eff * A100_PEAK))

    points = [point(16384, False, 0.73), point(16384, True, 0.63), point(512, True, 0.50)]
    return fit_attention(points, A100_PEAK, fixed={"launch_overhead_s": LAUNCH_OVERHEAD_S},
                         note="FA2 on A100: 73% forward and 63% backward at long sequences; the 50% low end of "
                              "its 50-73% range taken at the shortest sequence (512), backward")


A100_PEAK = 312e12
H100_PEAK = 989.4e12
FA3_CURVES = "fa3_paper_h100_curves"
HOPPER_KERNELS = {"fa2": "FlashAttention-2", "cudnn": "cuDNN's fused attention", "fa3": "FlashAttention-3"}


@functools.lru_cache(maxsize=None)
def hopper_attention_fit(kernel: str):
    """One kernel of the FA3 paper's H100 curves (16k tokens a batch, hidden 2048, head dims 64 and 128): the
    forward with and without the causal mask and the backward (only timed without it), each at its measured
    TFLOPs/s, fitted as fractions of H100's peak; the causal term from the two forwards."""
    row = measured_rows()[FA3_CURVES]["values"]
    points = []
    for head_dim in (64, 128):
        curves = row[f"head_dim_{head_dim}"]
        for curve, causal, backward in (("forward_causal", True, False), ("forward_noncausal", False, False),
                                        ("backward_noncausal", False, True)):
            for seq, tflops in zip(row["seqlen"], curves[curve][kernel]):
                if tflops is None:  # not transcribed
                    continue
                bh = (16384 // seq) * (2048 // head_dim)
                fwd = 4.0 * bh * seq * seq * head_dim / (2 if causal else 1)
                points.append((bh, seq, head_dim, causal, backward,
                               (2.5 if backward else 1.0) * fwd / (tflops * 1e12)))
    return fit_attention(points, H100_PEAK, fixed={"launch_overhead_s": LAUNCH_OVERHEAD_S}, backward_terms=True,
                         note=f"{HOPPER_KERNELS[kernel]} on H100 SXM5, head dims 64 and 128: the forward with and "
                              "without the causal mask and the non-causal backward at 512-16k tokens (FA3 paper, "
                              "Figs. 5-6)")


# a fitted kernel's sequence and head-size terms, each ranging from no effect up to twice its fitted value
SIZE_TERMS = ("seq_half", "backward_seq_half", "head_dim_half", "backward_head_dim_half")


def _hopper_kernel(kernel: str, faster: str, why_faster: str) -> AttentionParams:
    """A Hopper kernel at its fitted fractions of peak (the same on H200: its tensor peak is H100's), with each
    efficiency's range up to ``faster``'s, the kernel the same backend runs where ``why_faster`` holds."""
    fit, fast = hopper_attention_fit(kernel), hopper_attention_fit(faster)
    name, fast_name = HOPPER_KERNELS[kernel], HOPPER_KERNELS[faster]
    p = fit.params
    ranges = {"launch_overhead_s": LAUNCH_RANGE, **{k: (0.0, 2 * p[k]) for k in SIZE_TERMS}}
    sources = {"launch_overhead_s": LAUNCH_SOURCE}
    for phase, prefix in (("forward", ""), ("backward", "backward_")):
        sources[f"{prefix}seq_half"] = (f"fitted with the efficiencies to {name}'s {phase} from 512 to 16k tokens; "
                                        "range: no size effect up to twice it")
        sources[f"{prefix}head_dim_half"] = (f"fitted with the efficiencies to {name}'s {phase} at head dims 64 and "
                                             "128 (none other was transcribed); range: no head-size effect up to "
                                             "twice it")
    for phase, curve in (("forward", "the forward without the mask"), ("backward", "the backward (timed without "
                                                                                    "the causal mask)")):
        key = f"{phase}_efficiency"
        ranges[key] = (p[key], max(p[key], fast.params[key]))
        sources[key] = (f"fitted to {name} on H100 SXM5, {curve}, stated at head dim 128, 512-16k tokens ({MD} section 3e, "
                        f"FA3 paper Figs. 5-6); range up to {fast_name}'s {fast.params[key]:.3f}, {why_faster}")
    ranges.update(causal_ranges(p))
    sources.update(causal_sources(f"{name}'s forward with and without the mask, H100 SXM5, head dims 64 and 128, "
                                  f"512-16k tokens ({MD} section 3e, FA3 paper Fig. 5)"))
    return AttentionParams(**p, ranges=ranges, sources=sources, fits=(fit.record,))


def causal_ranges(p: dict) -> dict:
    """The causal term's ranges: its loss is measured on the forward only, and the backward is taken to lose the
    same (it walks the same diagonal tiles); the range runs from no loss beyond the skipped half to twice the
    measured short-sequence loss."""
    return {"causal_efficiency": (p["causal_efficiency"], 1.0), "causal_seq_half": (0.0, 2 * p["causal_seq_half"])}


def causal_sources(measured: str) -> dict:
    return {"causal_efficiency": (f"fitted to {measured}; the causal backward, not timed there, taken to lose the "
                                  "same; range up to no loss beyond the skipped half"),
            "causal_seq_half": "fitted with causal_efficiency; range: no short-sequence loss up to twice it"}


def attention_block(gpu: GpuSpec) -> AttentionParams:
    """The kernel Megatron's --attention-backend auto runs: FA2 on Ampere; on Hopper, Transformer Engine gives
    cuDNN's fused attention preference over FlashAttention (its get_attention_backend, sm90 and later)."""
    a100_fit = _fa2_a100_fit()
    if gpu.architecture == "ampere":
        fa2 = hopper_attention_fit("fa2").params
        fa2_h100 = fa2["head_dim_half"]
        causal = {k: fa2[k] for k in ("causal_efficiency", "causal_seq_half")}
        return AttentionParams(
            **a100_fit.params, head_dim_half=0.0, **causal,
            ranges={"launch_overhead_s": LAUNCH_RANGE, "seq_half": (0.0, 2 * a100_fit.params["seq_half"]),
                    "head_dim_half": (0.0, fa2_h100), **causal_ranges(causal)},
            sources={
                **causal_sources("FlashAttention-2's forward with and without the mask on H100 SXM5 (FA3 paper "
                                 f"Fig. 5, {MD} section 3e), taken for FA2 on A100: the same kernel, whose tiles "
                                 "are the same on sm80 and sm90, and FA2's A100 curves were not transcribed"),
                "head_dim_half": ("not measured on A100 (FA2's per-head-size curves exist only as figures, not "
                                  "transcribed): 0, every head size at head size 128's efficiency; range up to "
                                  f"FA2's on H100 ({fa2_h100:.0f}, FA3 paper Fig. 5)"),
                "forward_efficiency": f"fitted to FA2 on A100 80GB: up to 73% of peak forward ({MD} section 3e, [FA2])",
                "backward_efficiency": f"fitted to FA2 on A100 80GB: up to 63% of peak backward ({MD} section 3e)",
                "seq_half": ("fitted: FA2's 50-73% range spans seqlen 512-16k; its low end is attributed to the "
                             "shortest sequence (an interpretation: the per-seqlen curves exist only as figures); "
                             "range: no size effect up to twice that"),
                "launch_overhead_s": LAUNCH_SOURCE,
            },
            fits=(a100_fit.record,))
    return _hopper_kernel("cudnn", "fa3", "which newer cuDNN releases approach")


def attention_kernels(gpu: GpuSpec) -> dict[str, AttentionParams]:
    """Backends that run another kernel than auto's: on Hopper, --attention-backend flash runs the flash-attn
    package, FlashAttention-2 unless FlashAttention-3's is installed beside it."""
    if gpu.architecture != "hopper":
        return {}
    return {"flash": _hopper_kernel("fa2", "fa3", "which Transformer Engine runs instead where flash_attn_3 is "
                                                  "installed")}

