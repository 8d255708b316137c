"""KV-aware admission: a request goes only where its prompt and output fit in the KV cache beside
what this edge's requests in flight pin there, whatever the slot count says."""

from __future__ import annotations

import random

from dataplane.edge.kv import PinnedKv, loose_tokens
from dataplane.edge.policies import RouteRequest
from dataplane.edge.prefix import block_hashes
from tests.edge.test_routing import catalog, make_router

# 16-character blocks at 4 characters per token: 4 tokens a block
A, B, C = "a" * 400, "b" * 400, "c" * 400  # 25 blocks, 100 tokens each


def request(text: str, max_tokens: int = 8) -> RouteRequest:
    return RouteRequest(block_hashes(text, 16), len(text) // 4, len(text), max_tokens=max_tokens)


def send(router, cat, req: RouteRequest, now: float = 0.0):
    cands = router.eligible(cat, list(cat.replicas.values()), now)
    decision = router.choose(req, cands, now)
    return None if decision is None else router.dispatch(cat, decision, req, req.prompt_tokens + req.max_tokens, now)


def test_shared_prompt_blocks_are_pinned_once_and_released_with_the_last_request():
    kv = PinnedKv()
    a1, a2 = block_hashes(A + "x" * 32, 16), block_hashes(A + "y" * 32, 16)
    kv.pin(a1, 8)
    assert kv.new_blocks(a2) == 2  # only the two blocks past the shared 25
    kv.pin(a2, 8)
    assert len(kv.blocks) == 29 and kv.tokens(4.0) == 29 * 4 + 16
    kv.unpin(a1, 8)
    assert kv.new_blocks(a1) == 2 and len(kv.blocks) == 27  # a2 still holds the shared prefix
    kv.unpin(a2, 8)
    assert kv.blocks == {} and kv.loose_tokens == 0 and kv.requests == 0
    # nothing in flight: even a prompt larger than the budget is let through (the engine judges it)
    assert kv.fits(block_hashes("z" * 4000, 16), 8, 4.0, budget=100)
    assert loose_tokens(prompt_tokens=110, blocks=25, tokens_per_block=4.0, output_tokens=8) == 18


def test_a_request_waits_rather_than_bring_its_prefix_into_a_cache_full_of_others_but_joins_its_own():
    router = make_router()
    cat = catalog(n=2, max_running=8, max_total_tokens=200)
    first = send(router, cat, request(A))
    second = send(router, cat, request(B))
    assert first is not None and second is not None
    assert first.replica.id != second.replica.id  # B's 100 tokens do not fit beside A's 108
    # Both replicas have free slots, but a third tenant's prompt fits in neither cache: it waits.
    assert all(router.load(r).inflight < 8 for r in cat.replicas)
    assert send(router, cat, request(C)) is None
    # A follow-up of A's conversation adds two blocks to what A already pins: it goes there.
    follow = send(router, cat, request(A + "x" * 32))
    assert follow is not None and follow.replica.id == first.replica.id
    # Once A's requests finish, C fits where they were.
    router.release(first, True, 1.0)
    router.release(follow, True, 1.0)
    late = send(router, cat, request(C), now=1.0)
    assert late is not None and late.replica.id == first.replica.id


def test_the_output_reserve_learns_each_variants_typical_answers_and_never_exceeds_max_tokens():
    router = make_router()
    cat = catalog(n=1, max_running=8, max_total_tokens=10_000)
    req = request(A, max_tokens=500)
    assert router.kv_loose_tokens(req, "v") == 500  # nothing learned yet: the limit
    for _ in range(3):
        ticket = send(router, cat, req)
        router.release(ticket, True, 1.0, completion_tokens=40)
    assert router.kv_loose_tokens(req, "v") == 40
    assert router.kv_loose_tokens(request(A, max_tokens=16), "v") == 16
    assert router.kv_loose_tokens(req, "another-variant") == 500  # learned per variant
    assert router.pinned_kv("rep0").requests == 0 and router.pinned_kv("rep0").blocks == {}


def test_kv_admission_can_be_turned_off():
    router = make_router(kv_admission_fill=0.0)
    cat = catalog(n=2, max_running=8, max_total_tokens=200)
    assert all(send(router, cat, request(text)) is not None for text in (A, B, C))


def test_the_unpinned_blocks_are_found_by_bisection_exactly_as_a_scan_finds_them():
    rng = random.Random(5)
    for _ in range(200):
        kv = PinnedKv()
        # prompts that share prefixes of random lengths (a two-letter alphabet makes that common)
        texts = ["".join(rng.choice("ab") for _ in range(rng.randint(0, 30))) * 16 for _ in range(5)]
        for text in texts[:3]:
            kv.pin(block_hashes(text, 16), 0)
        for text in texts:
            hashes = block_hashes(text, 16)
            leading = next((i for i, h in enumerate(hashes) if h not in kv.blocks), len(hashes))
            assert kv.new_blocks(hashes) == len(hashes) - leading
