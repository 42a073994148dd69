"""What the user reads: the Megatron launch (``export``), the NeMo and megatron-core configs
(``export_config``), Chrome traces (``trace``), figures and the data behind them (``figure_data``,
``figures``, ``plots`` and how each is drawn, ``plots_base``), the HTML pages of a search
(``html_report``) and of a capacity answer (``html_capacity``), a capacity answer in words
(``capacity_text``), the report and its cache (``report``, ``report_scenarios``, ``report_figures``,
``report_moe``, ``report_capacity``, ``report_cache``), and how plans are named and tabulated
(``describe``, ``search_table``).

May import: every layer below (``spec`` to ``planner`` and ``measure``); never ``cli``.
"""
