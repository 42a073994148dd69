"""The work of one transformer layer as a graph of ops, each declared once (``ops``: its GEMM shape or
bytes, FLOPs and saved tensors), built from Megatron's modules (``modules``: norms, ``ColumnParallelLinear``,
``RowParallelLinear``, MLP; ``attention``: flash, context-parallel and unfused attention; ``moe``: the MoE
MLP; ``module_base``: the per-rank sizes and module contract they share) into a layer graph (``layers``),
and the parameters each rank of each stage holds (``parameters``).

May import: ``spec``.
"""
