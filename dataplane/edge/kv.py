"""KV-aware admission: what the requests in flight hold in each replica's KV cache, and whether
one more fits.

An engine runs a request only while its KV cache holds the request's prompt and the tokens it
generates; a request that does not fit waits in the engine's queue, whatever its slot count says.
The prompts of requests in flight on one replica share their common prefixes (RadixAttention
keeps one copy of each block), so what they *pin* is the union of their prompt blocks plus their
outputs; cached blocks no running request uses are evictable and do not count.

Why the edge cares: under load its fair queue releases waiters as slots free up, and a waiter
sent to whichever replica has a free slot brings its whole prefix into a cache full of other
tenants' pinned prefixes. Each such request pins thousands of tokens there for its whole life, so
the replica runs fewer requests at once, more wait, more are sent wherever a slot frees, and the
fleet's concurrency collapses (bench/edge/README.md, 2026-12-06: 9-19 running of 32 per engine
and the hit rate down to 0.74, where sglang-router's engines ran 20-32). Counting what a request
would add to a replica's pinned KV keeps a waiter off replicas where it cannot run, so it goes
where its prefix is already pinned (it adds a few blocks) or where there is room for it.

One ``PinnedKv`` per replica, kept by ``Router.dispatch``/``release`` from this edge's own
requests (other edges' requests show only through the engine's slot counts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class PinnedKv:
    """The prompt blocks (chained hashes, see ``prefix.block_hashes``) and tokens this edge's
    requests in flight hold on one replica."""

    blocks: dict[int, int] = field(default_factory=dict)  # block hash -> requests in flight using it
    loose_tokens: int = 0  # tokens outside shared blocks: each prompt's partial tail and its output
    requests: int = 0

    def new_blocks(self, hashes: Sequence[int]) -> int:
        """Blocks of a prompt that no request in flight here pins. Hashes are chained (block i's
        covers blocks 0..i) and a request pins its whole chain, so the pinned ones are a leading
        run: found by bisection, a few lookups per candidate even for a long prompt."""
        blocks = self.blocks
        lo, hi = 0, len(hashes)  # hashes[:lo] pinned, hashes[hi:] not
        while lo < hi:
            mid = (lo + hi) // 2
            if hashes[mid] in blocks:
                lo = mid + 1
            else:
                hi = mid
        return len(hashes) - lo

    def pin(self, hashes: Sequence[int], loose_tokens: int) -> None:
        blocks = self.blocks
        for h in hashes:
            blocks[h] = blocks.get(h, 0) + 1
        self.loose_tokens += loose_tokens
        self.requests += 1

    def unpin(self, hashes: Sequence[int], loose_tokens: int) -> None:
        blocks = self.blocks
        for h in hashes:
            left = blocks.get(h, 0) - 1
            if left > 0:
                blocks[h] = left
            else:
                blocks.pop(h, None)
        self.loose_tokens -= loose_tokens
        self.requests -= 1

    def tokens(self, tokens_per_block: float) -> float:
        return len(self.blocks) * tokens_per_block + self.loose_tokens

    def fits(self, hashes: Sequence[int], loose_tokens: int, tokens_per_block: float, budget: float) -> bool:
        """Whether a request adding ``hashes``' unpinned blocks and ``loose_tokens`` stays within
        ``budget`` tokens. A replica with nothing of ours in flight always takes one: a prompt
        larger than the budget must still reach an engine, which judges it."""
        if not self.requests:
            return True
        added = self.new_blocks(hashes) * tokens_per_block + loose_tokens
        return self.tokens(tokens_per_block) + added <= budget


def loose_tokens(prompt_tokens: int, blocks: int, tokens_per_block: float, output_tokens: int) -> int:
    """What a request pins outside its shared prompt blocks: the prompt's tokens past its last
    full block, and the tokens it will generate."""
    return max(0, round(prompt_tokens - blocks * tokens_per_block)) + max(0, output_tokens)
