"""The semantic cache's in-memory index: exact cosine search per scope, at a cost that does not
grow with how often the index changes.

A scope holds one tenant's entries for one model, prompt and parameter set. Under a stream of
new questions every lookup is followed by a store, so the index changes as often as it is
searched. The first version rebuilt a scope's matrix (``np.stack`` of every vector) on the
first search after a change, scanned every entry for expiry on every search and rebuilt the
entry list on every removal: at 10,000 entries in one scope that was 2-7 ms of the edge's CPU
per request (``bench/cache``), most of it copying vectors that had not changed.

Here each scope keeps its vectors in one preallocated matrix that grows by doubling: an add
writes one row, a removal moves the last row into the hole, so both are O(dimensions). A search
is one matrix-vector product over the live rows; only the rows at or above the threshold are
looked at in Python (expiry and guard), best first. Expired entries leave from the front of
the insertion order (entries share one TTL, so the oldest expire first) and, whatever their
order, whenever a search meets one.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

_INITIAL_ROWS = 16


@dataclass
class Entry:
    id: str
    tenant_id: str
    scope: str
    question: str
    vector: np.ndarray
    guard: frozenset[str]
    expires_at: float  # unix seconds


class _Scope:
    """One scope's entries and their vectors, row i of ``matrix`` being ``entries[i]``."""

    __slots__ = ("entries", "matrix", "rows")

    def __init__(self, dim: int) -> None:
        self.entries: list[Entry] = []
        self.matrix = np.empty((_INITIAL_ROWS, dim), dtype=np.float32)
        self.rows: dict[str, int] = {}

    def add(self, entry: Entry) -> None:
        n = len(self.entries)
        if n == len(self.matrix):
            grown = np.empty((2 * n, self.matrix.shape[1]), dtype=np.float32)
            grown[:n] = self.matrix
            self.matrix = grown
        self.matrix[n] = entry.vector
        self.entries.append(entry)
        self.rows[entry.id] = n

    def remove(self, entry_id: str) -> None:
        i = self.rows.pop(entry_id)
        last = len(self.entries) - 1
        if i != last:
            moved = self.entries[last]
            self.entries[i] = moved
            self.matrix[i] = self.matrix[last]
            self.rows[moved.id] = i
        self.entries.pop()

    def scores(self, vector: np.ndarray) -> np.ndarray:
        return self.matrix[:len(self.entries)] @ vector


class SemanticIndex:
    """Exact cosine search per scope (vectors are unit-norm: a dot product); ``max_entries``
    bounds the whole index, the oldest entry leaving first."""

    def __init__(self, max_entries: int = 100_000) -> None:
        self.max_entries = max_entries
        self._scopes: dict[str, _Scope] = {}
        self._order: OrderedDict[str, Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def scope_size(self, scope_key: str) -> int:
        scope = self._scopes.get(scope_key)
        return len(scope.entries) if scope is not None else 0

    def add(self, entry: Entry) -> None:
        if entry.id in self._order:
            return
        scope = self._scopes.get(entry.scope)
        if scope is None:
            scope = self._scopes[entry.scope] = _Scope(len(entry.vector))
        elif len(entry.vector) != scope.matrix.shape[1]:
            return  # another model's vector (the edge's model changed): not comparable
        self._order[entry.id] = entry
        scope.add(entry)
        while len(self._order) > self.max_entries:
            self.remove(next(iter(self._order)))

    def remove(self, entry_id: str) -> None:
        entry = self._order.pop(entry_id, None)
        if entry is None:
            return
        scope = self._scopes[entry.scope]
        scope.remove(entry_id)
        if not scope.entries:
            del self._scopes[entry.scope]

    def remove_tenant(self, tenant_id: str) -> int:
        gone = [e.id for e in self._order.values() if e.tenant_id == tenant_id]
        for entry_id in gone:
            self.remove(entry_id)
        return len(gone)

    def expire(self, now: float) -> int:
        """Drop the expired entries at the front of the insertion order; O(those dropped)."""
        dropped = 0
        while self._order:
            entry = next(iter(self._order.values()))
            if entry.expires_at > now:
                break
            self.remove(entry.id)
            dropped += 1
        return dropped

    def search(self, scope_key: str, vector: np.ndarray, guard: frozenset[str], threshold: float,
               now: float) -> tuple[Entry, float] | None:
        """The most similar live entry of the scope at or above ``threshold`` with the same guard."""
        self.expire(now)
        scope = self._scopes.get(scope_key)
        if scope is None or len(vector) != scope.matrix.shape[1]:
            return None
        scores = scope.scores(vector)
        above = np.flatnonzero(scores >= threshold)
        if not len(above):
            return None
        # Look up every candidate before removing expired ones: a removal moves rows.
        ranked = [(float(scores[i]), scope.entries[i]) for i in above[np.argsort(-scores[above], kind="stable")]]
        found = None
        for score, entry in ranked:
            if entry.expires_at <= now:
                self.remove(entry.id)
            elif found is None and entry.guard == guard:
                found = entry, score
        return found
