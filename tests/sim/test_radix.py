"""Radix cache bookkeeping: matching, page alignment, locking and LRU eviction."""

from dataplane.sim.radix import RadixCache


def test_match_and_insert_share_prefixes():
    cache = RadixCache()
    assert cache.insert([1, 2, 3, 4])[0] == 4
    assert cache.insert([1, 2, 9])[0] == 1  # only the new suffix is stored
    assert cache.total_size == 5
    assert cache.match_prefix([1, 2, 3, 4, 5])[0] == 4
    assert cache.match_prefix([1, 2, 9, 9])[0] == 3
    assert cache.match_prefix([7])[0] == 0


def test_page_size_caches_whole_pages_only():
    cache = RadixCache(page_size=4)
    added, _ = cache.insert(list(range(10)))
    assert added == 8
    assert cache.match_prefix(list(range(10)))[0] == 8
    assert cache.match_prefix([0, 1, 2, 3, 4, 5, 99, 99])[0] == 4  # partial page does not count


def test_locked_paths_survive_eviction_and_lru_goes_first():
    cache = RadixCache()
    _, old = cache.insert([1, 1, 1])
    _, mid = cache.insert([2, 2, 2])
    _, new = cache.insert([3, 3, 3])
    cache.match_prefix([2, 2, 2])  # touch: now [1,1,1] is least recently used
    cache.lock(new)
    assert cache.evictable_size == 6
    assert cache.evict(3) == 3
    assert cache.match_prefix([1, 1, 1])[0] == 0
    assert cache.match_prefix([2, 2, 2])[0] == 3
    assert cache.evict(100) == 3  # only the unlocked one left to go
    assert cache.match_prefix([3, 3, 3])[0] == 3
    cache.unlock(new)
    assert cache.evictable_size == 3
    assert cache.evict(100) == 3 and cache.total_size == 0
    del old, mid


def test_split_keeps_lock_counts_consistent():
    cache = RadixCache()
    _, leaf = cache.insert([1, 2, 3, 4])
    cache.lock(leaf)
    matched, node = cache.match_prefix([1, 2, 7])  # splits the locked node after [1, 2]
    assert matched == 2 and node.lock_ref == 1
    assert cache.evictable_size == 0
    cache.unlock(leaf)
    assert cache.evictable_size == 4


def test_parent_becomes_evictable_after_children():
    cache = RadixCache()
    cache.insert([1, 2, 3])
    cache.insert([1, 2, 4])
    assert cache.evict(10) == 4 and cache.total_size == 0


def test_disabled_cache_matches_nothing():
    cache = RadixCache(enabled=False)
    assert cache.insert([1, 2, 3])[0] == 0
    assert cache.match_prefix([1, 2, 3])[0] == 0
    assert cache.total_size == 0


def test_reset_refuses_while_locked():
    cache = RadixCache()
    _, node = cache.insert([5, 6])
    cache.lock(node)
    assert not cache.reset()
    cache.unlock(node)
    assert cache.reset() and cache.total_size == 0
