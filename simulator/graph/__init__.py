"""The work of one transformer layer as a graph of ops, each declared once (``ops``: its GEMM shape or
bytes, FLOPs and saved tensors), built from Megatron's modules (``modules``: ``ColumnParallelLinear``,
``RowParallelLinear``, attention, MLP, MoE) into a layer graph (``layers``), and the parameters each rank
of each stage holds (``parameters``).

May import: ``spec``.
"""
