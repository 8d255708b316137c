"""An approximate, bounded index of which prompt prefixes each replica has in its KV cache.

Prompts are cut into fixed-size character blocks from the start and chain-hashed (block i's
hash covers blocks 0..i), so two prompts share block hashes exactly as long as they share a
prefix, and lookups are dict reads. Each replica gets an LRU of block hashes whose size mirrors
its KV capacity (``max_total_tokens``): when the engine would have evicted a prefix, so have we.
Entries also expire after a TTL. The engine's reported ``cached_tokens`` corrects the picture:
if it found less than we predicted, the replica is holding less than we thought, so its LRU
shrinks; when predictions hold, it grows back towards the nominal size.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


def block_hashes(text: str, block_chars: int) -> list[int]:
    """Chained hashes of the full blocks of ``text`` (a trailing partial block is not cacheable)."""
    out: list[int] = []
    h = 0
    for start in range(0, len(text) - block_chars + 1, block_chars):
        h = hash((h, text[start:start + block_chars]))
        out.append(h)
    return out


@dataclass(slots=True)
class _ReplicaBlocks:
    kv_tokens: int
    nominal_capacity: int
    capacity: int
    blocks: OrderedDict = field(default_factory=OrderedDict)  # hash -> last use (monotonic s)


class PrefixIndex:
    MIN_CAPACITY_SHARE = 0.1
    TOLERANCE = 0.1  # shares of the prompt; block granularity and template differences live in here

    def __init__(self, block_chars: int = 64, chars_per_token: float = 4.0, ttl_s: float = 600.0,
                 max_blocks_total: int = 1_000_000) -> None:
        self.block_chars = block_chars
        self.chars_per_token = chars_per_token
        self.ttl_s = ttl_s
        self.max_blocks_total = max_blocks_total
        self._replicas: dict[str, _ReplicaBlocks] = {}

    # ---- sizing ----

    def _nominal_blocks(self, max_total_tokens: int) -> int:
        blocks = int(max_total_tokens * self.chars_per_token / self.block_chars)
        per_replica_cap = self.max_blocks_total // max(1, len(self._replicas) or 1)
        return max(1, min(blocks, per_replica_cap))

    def _get(self, replica_id: str, max_total_tokens: int) -> _ReplicaBlocks:
        entry = self._replicas.get(replica_id)
        if entry is None:
            nominal = self._nominal_blocks(max_total_tokens)
            entry = self._replicas[replica_id] = _ReplicaBlocks(max_total_tokens, nominal, nominal)
        return entry

    def calibrate(self, chars_per_token: float) -> None:
        """Follow the token estimator: each replica's LRU holds its KV capacity in *characters*, so
        with a stale characters-per-token figure the index forgets prefixes before the engine does
        (4.0 assumed against 5.1 measured forgot a fifth of every replica's cache: a returning
        tenant's prompt then looked cold everywhere and went wherever load was lowest)."""
        if chars_per_token <= 0 or abs(chars_per_token - self.chars_per_token) < 0.02 * self.chars_per_token:
            return
        self.chars_per_token = chars_per_token
        for entry in self._replicas.values():
            nominal = self._nominal_blocks(entry.kv_tokens)
            # Keep what the engine's feedback taught (capacity / nominal), on the new scale.
            entry.capacity = max(1, min(nominal, round(entry.capacity * nominal / entry.nominal_capacity)))
            entry.nominal_capacity = nominal
            while len(entry.blocks) > entry.capacity:
                entry.blocks.popitem(last=False)

    def forget(self, replica_id: str) -> None:
        self._replicas.pop(replica_id, None)

    def retain(self, replica_ids: set[str]) -> None:
        for rid in list(self._replicas):
            if rid not in replica_ids:
                del self._replicas[rid]

    # ---- queries ----

    def matched_blocks(self, replica_id: str, hashes: list[int], now: float) -> int:
        entry = self._replicas.get(replica_id)
        if entry is None:
            return 0
        blocks = entry.blocks
        horizon = now - self.ttl_s
        n = 0
        for h in hashes:
            seen = blocks.get(h)
            if seen is None or seen < horizon:
                break
            n += 1
        return n

    def occupancy(self, replica_id: str) -> float:
        """How full this replica's prefix cache is believed to be, 0..1."""
        entry = self._replicas.get(replica_id)
        return 0.0 if entry is None else len(entry.blocks) / max(1, entry.capacity)

    def blocks_held(self, replica_id: str) -> int:
        entry = self._replicas.get(replica_id)
        return 0 if entry is None else len(entry.blocks)

    # ---- updates ----

    def record(self, replica_id: str, max_total_tokens: int, hashes: list[int], now: float) -> None:
        """The replica is about to compute this prompt, so it will hold all of its blocks."""
        entry = self._get(replica_id, max_total_tokens)
        blocks = entry.blocks
        # Deepest block first, root last: the root ends up most recent, so LRU eviction takes
        # leaves first, as the engine's radix tree does.
        for h in reversed(hashes):
            blocks[h] = now
            blocks.move_to_end(h)
        while len(blocks) > entry.capacity:
            blocks.popitem(last=False)

    def correct(self, replica_id: str, predicted_share: float, reported_share: float) -> None:
        """Feed back what the engine actually found cached (as shares of the prompt, so the edge's
        token estimate and the engine's tokenizer need not agree)."""
        entry = self._replicas.get(replica_id)
        if entry is None:
            return
        if reported_share + self.TOLERANCE < predicted_share:
            # We believed it held more than it did: it is evicting sooner than its nominal size says.
            floor = max(1, int(entry.nominal_capacity * self.MIN_CAPACITY_SHARE))
            entry.capacity = max(floor, int(entry.capacity * 0.9))
            while len(entry.blocks) > entry.capacity:
                entry.blocks.popitem(last=False)
        elif entry.capacity < entry.nominal_capacity:
            entry.capacity = min(entry.nominal_capacity, int(entry.capacity * 1.02) + 1)
