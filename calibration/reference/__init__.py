"""The reference training loop: a real PyTorch GPT with Megatron's tensor, sequence, pipeline and
data parallelism and recompute policies, whose runs ``simulator validate`` checks predictions against."""
