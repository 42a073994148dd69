"""A least-recently-used cache for results built from specs, keyed by plain values.

``functools.lru_cache`` keys on its arguments themselves, so every lookup hashes and compares pydantic
models with Python code inside the cache's own dictionary operations. Keyed that way, the cost-model
cache once answered a lookup for one cluster and profile with the model of another (a process that had
validated the CPU reference runs and then played the report's A100 plans got an A100 cost model back
for the CPU cluster, until the entry aged out). Here the caller turns its arguments into a key of strings
and numbers first (``ClusterSpec.value_key``, ``HardwareProfile.value_key``), so the dictionary only
ever compares plain values, and the result is what those values build.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class ValueCache(Generic[T]):
    """Up to ``maxsize`` results by key, the least recently used dropped first."""

    def __init__(self, maxsize: int):
        assert maxsize > 0
        self.maxsize = maxsize
        self._items: OrderedDict[Hashable, T] = OrderedDict()

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        """The result stored under ``key``, or ``build()``'s, stored."""
        try:
            value = self._items[key]
        except KeyError:
            value = build()
            self._items[key] = value
            if len(self._items) > self.maxsize:
                self._items.popitem(last=False)
            return value
        self._items.move_to_end(key)
        return value

    def cache_clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)
