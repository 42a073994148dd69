"""The search for the fastest plan that fits: the space of plans and how it is pruned (``space``), the
parts of an estimate that candidates share (``memo``), the search itself (``plan_search``: ``search``,
``SearchRequest``, ``SearchResult``) and sweeps over many questions (``sweep``).

May import: ``spec`` to ``estimator``; not ``measure`` (a sibling).
"""
