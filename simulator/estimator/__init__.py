"""One plan's answer: where its memory goes (``memory``), the orchestration that plays its schedule
and sums the result into an ``Estimate`` (``prediction``: ``estimate``, ``simulate_job``), and the band
around the answer from the constants no measurement pins (``band``).

May import: ``spec``, ``graph``, ``cost``, ``schedule``.
"""
