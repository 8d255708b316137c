"""RadixAttention's prefix cache, reduced to bookkeeping: a radix tree over token ids.

What matters for the platform is *which* tokens an engine would find cached and *when* it
would have to throw them away, so this follows SGLang's radix cache semantics:

* keys are token ids, stored in pages of ``page_size`` (only whole pages are cached);
* a match splits a node so the matched prefix is its own node (it can then be locked alone);
* a running request holds a lock on its path (``lock_ref`` counts users up to the root);
* under memory pressure unlocked *leaves* go first, least recently used first, and a parent
  whose last child went becomes a leaf candidate itself.

``total_size`` is every cached token, ``evictable_size`` the ones no running request locks.
A disabled cache matches nothing and stores nothing (``--disable-radix-cache``).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


class RadixNode:
    __slots__ = ("children", "key", "last_access", "lock_ref", "parent")

    def __init__(self, key: tuple[int, ...] = (), parent: RadixNode | None = None):
        self.key = key
        self.parent = parent
        self.children: dict[tuple[int, ...], RadixNode] = {}
        self.lock_ref = 0
        self.last_access = 0

    def __lt__(self, other: RadixNode) -> bool:  # heap order for eviction: oldest first
        return self.last_access < other.last_access


class RadixCache:
    def __init__(self, page_size: int = 1, enabled: bool = True):
        self.page_size = max(1, page_size)
        self.enabled = enabled
        self.root = RadixNode()
        self.root.lock_ref = 1  # the root is never evicted
        self.total_size = 0
        self.evictable_size = 0
        self._tick = 0

    # -- helpers ---------------------------------------------------------------------------
    def _touch(self) -> int:
        self._tick += 1
        return self._tick

    def _child_key(self, tokens: Sequence[int], pos: int) -> tuple[int, ...]:
        return tuple(tokens[pos : pos + self.page_size])

    def _aligned(self, length: int) -> int:
        return length - length % self.page_size

    def _common_length(self, key: tuple[int, ...], tokens: Sequence[int], pos: int) -> int:
        """Length (in whole pages) of the common prefix of ``key`` and ``tokens[pos:]``."""
        n = min(len(key), len(tokens) - pos)
        if key[:n] == tuple(tokens[pos : pos + n]):
            return self._aligned(n)
        i = 0
        while i < n and key[i] == tokens[pos + i]:
            i += 1
        return self._aligned(i)

    def _split(self, node: RadixNode, length: int) -> RadixNode:
        """Cut ``node`` after ``length`` tokens; returns the new upper part."""
        parent = node.parent
        assert parent is not None
        upper = RadixNode(node.key[:length], parent)
        upper.lock_ref = node.lock_ref
        upper.last_access = node.last_access
        parent.children[node.key[: self.page_size]] = upper
        node.key = node.key[length:]
        node.parent = upper
        upper.children[node.key[: self.page_size]] = node
        return upper

    # -- public API ------------------------------------------------------------------------
    def match_prefix(self, tokens: Sequence[int]) -> tuple[int, RadixNode]:
        """Longest cached prefix of ``tokens``: (its length, the node where it ends)."""
        node = self.root
        if not self.enabled:
            return 0, node
        pos = 0
        now = self._touch()
        end = self._aligned(len(tokens))
        while pos < end:
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                break
            common = self._common_length(child.key, tokens, pos)
            if common == 0:
                break
            if common < len(child.key):
                child = self._split(child, common)
            child.last_access = now
            node = child
            pos += common
        return pos, node

    def insert(self, tokens: Sequence[int]) -> tuple[int, RadixNode]:
        """Cache the whole pages of ``tokens``; returns (tokens newly added, last node)."""
        if not self.enabled:
            return 0, self.root
        end = self._aligned(len(tokens))
        matched, node = self.match_prefix(tokens[:end])
        if matched >= end:
            return 0, node
        leaf = RadixNode(tuple(tokens[matched:end]), node)
        leaf.last_access = self._touch()
        node.children[leaf.key[: self.page_size]] = leaf
        added = end - matched
        self.total_size += added
        self.evictable_size += added
        return added, leaf

    def lock(self, node: RadixNode) -> None:
        """A request starts using the path root..node: none of it may be evicted."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: RadixNode) -> None:
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_size += len(node.key)
            node = node.parent  # type: ignore[assignment]

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` by dropping unlocked leaves, LRU first."""
        if num_tokens <= 0 or self.evictable_size == 0:
            return 0
        heap = [n for n in self._nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < num_tokens:
            leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[: self.page_size]]
            freed += len(leaf.key)
            self.total_size -= len(leaf.key)
            self.evictable_size -= len(leaf.key)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, parent)
        return freed

    def reset(self) -> bool:
        """``/flush_cache``: only allowed when nothing is locked, as in SGLang."""
        if self.total_size != self.evictable_size:
            return False
        self.root.children.clear()
        self.total_size = self.evictable_size = 0
        return True

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())
