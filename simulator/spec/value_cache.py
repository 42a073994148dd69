"""A least-recently-used cache for results built from specs, keyed by plain values.

``functools.lru_cache`` keys on its arguments themselves: every lookup hashes and compares pydantic models,
whose equality reaches every nested model (private attributes included) while a hash is computed once.
Should the two ever disagree (a nested model that fills a private attribute on first use compares
unequal to an unused copy of itself with the same hash), two entries share a hash and later compare
equal, and the C implementation's eviction, which removes the first entry equal to the oldest key, can
remove the other one and leave the oldest key pointing at the newest result: one cluster's cost model
answers for another's. Here the caller turns its arguments into a key of strings and numbers first
(``ClusterSpec.value_key``, ``HardwareProfile.value_key``), so the dictionary compares plain values only.
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
