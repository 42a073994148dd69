"""Byte units and the few formatting functions the reports and the CLI share."""

from __future__ import annotations

GIB = 1024**3
GB = 10**9


def gib(nbytes: float) -> float:
    """Bytes in GiB (2**30): what nvidia-smi and PyTorch's allocator call "GB"."""
    return nbytes / GIB


def format_gib(nbytes: float, digits: int = 2) -> str:
    return f"{gib(nbytes):.{digits}f}"


def text_table(header: tuple[str, ...], rows: list[tuple[str, ...]], left: frozenset[int] = frozenset({0})) -> str:
    """A plain-text table: columns in ``left`` left-aligned (text), the others right-aligned (numbers)."""
    table = [header, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
