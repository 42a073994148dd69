"""What the fuzz tests saw, for the summary pytest prints at the end (tests/conftest.py)."""

from __future__ import annotations

from collections import Counter, defaultdict

# test name -> outcome ("exit 0", "exit 2", "refused: ConfigError", ...) -> count
OUTCOMES: defaultdict[str, Counter] = defaultdict(Counter)


def count(test: str, outcome: str) -> None:
    OUTCOMES[test][outcome] += 1


def summary() -> list[str]:
    lines = []
    for test in sorted(OUTCOMES):
        c = OUTCOMES[test]
        parts = ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
        lines.append(f"{test}: {sum(c.values())} cases ({parts})")
    if OUTCOMES:
        total = sum(sum(c.values()) for c in OUTCOMES.values())
        lines.append(f"all fuzz tests: {total} cases; a crash, a hang past the deadline or a broken invariant fails "
                     "its test, so a passing run had none")
    return lines
