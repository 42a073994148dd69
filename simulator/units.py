"""Byte units and the few formatting functions the reports and the CLI share."""

from __future__ import annotations

GIB = 1024**3
GB = 10**9


def gib(nbytes: float) -> float:
    """Bytes in GiB (2**30): what nvidia-smi and PyTorch's allocator call "GB"."""
    return nbytes / GIB


def format_gib(nbytes: float, digits: int = 2) -> str:
    return f"{gib(nbytes):.{digits}f}"
