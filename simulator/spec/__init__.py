"""What the user describes, validated once at the boundary: the model (``ModelSpec``, the presets, the
Hugging Face and Megatron command-line readers), the hardware (GPU, node, cluster), the parallel plan and
its recompute policy, the one rank layout every group is asked of, and the bounds on every size. Also the
bottom of the package that all layers share: the project's errors, file reading and safe writing,
byte units, and the cache keyed by specs' values (``value_cache``).

May import: nothing else of ``simulator``.
"""
