"""The measurement side: calibrating a profile from microbenchmarks (``calibrate``, ``calibrate_blocks``,
``calibrate_host``, ``fitting``, ``profile_check``), the reference loop's run records and their validation
(``run_record``, ``validate``), the measured data sets and their roles (``datasets``), Korthikanti et al.
2022's tables (``korthikanti``), how far each answer can be trusted (``trust``), and the child processes
that measure (``children``).

May import: ``spec`` to ``estimator``; not ``planner`` (a sibling).
"""
