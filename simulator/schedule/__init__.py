"""How an iteration is played: the pipeline schedules as pure data (``schedules``: 1F1B, interleaved,
GPipe), a layer's ops timed on their streams (``timing``), each stage's work for the engine (``stage_work``:
forward and backward steps, gradient buckets, the optimizer), the simpy engine (``engine``), the same
recurrence without events (``fast_engine``) and the closed-form screen (``screen``).

May import: ``spec``, ``graph``, ``cost``.
"""
