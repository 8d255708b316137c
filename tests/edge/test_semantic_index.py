"""The semantic cache's index (``dataplane/edge/semantic_index.py``): the same answers as a plain
search over every live entry, whatever the order of adds, removals, purges and expiries; and an
add or a removal that does not copy the scope's vectors."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.edge.semantic_index import Entry, SemanticIndex

DIM = 8


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def entry(n: int, *, scope: str = "s", tenant: str = "t", guard: frozenset[str] = frozenset(),
          expires_at: float = 1e12, vector: np.ndarray | None = None) -> Entry:
    return Entry(f"e{n}", tenant, scope, f"q{n}", unit(n) if vector is None else vector, guard, expires_at)


def naive(entries: dict[str, Entry], scope: str, vector: np.ndarray, guard: frozenset[str], threshold: float,
          now: float) -> tuple[str, float] | None:
    best = None
    for e in entries.values():
        if e.scope != scope or e.expires_at <= now or e.guard != guard:
            continue
        score = float(e.vector @ vector)
        if score >= threshold and (best is None or score > best[1]):
            best = (e.id, score)
    return best


def test_the_most_similar_entry_with_the_same_guard_wins() -> None:
    index = SemanticIndex()
    q = unit(1)
    near = (q + 0.05 * unit(2)) / np.linalg.norm(q + 0.05 * unit(2))
    index.add(entry(1, vector=q, guard=frozenset({"n:15"})))
    index.add(entry(2, vector=near))
    index.add(entry(3, vector=-q))
    found = index.search("s", q, frozenset(), 0.9, now=0.0)
    assert found is not None and found[0].id == "e2"  # e1 is closer but its guard differs
    assert index.search("s", q, frozenset({"n:15"}), 0.9, now=0.0)[0].id == "e1"
    assert index.search("s", q, frozenset({"n:16"}), 0.9, now=0.0) is None
    assert index.search("other", q, frozenset(), 0.0, now=0.0) is None


def test_expired_entries_are_never_found_and_leave_the_index() -> None:
    index = SemanticIndex()
    q = unit(1)
    index.add(entry(1, vector=q, expires_at=100.0))
    index.add(entry(2, vector=q, expires_at=300.0))
    assert index.search("s", q, frozenset(), 0.9, now=50.0)[0].id in {"e1", "e2"}
    assert index.search("s", q, frozenset(), 0.9, now=200.0)[0].id == "e2"
    assert len(index) == 1
    assert index.search("s", q, frozenset(), 0.9, now=400.0) is None
    assert len(index) == 0 and index.scope_size("s") == 0


def test_the_oldest_entry_leaves_first_at_the_bound() -> None:
    index = SemanticIndex(max_entries=3)
    for n in range(5):
        index.add(entry(n))
    assert len(index) == 3
    assert index.search("s", unit(0), frozenset(), 0.99, now=0.0) is None
    assert index.search("s", unit(4), frozenset(), 0.99, now=0.0)[0].id == "e4"


def test_an_add_writes_one_row_instead_of_restacking_the_scope() -> None:
    index = SemanticIndex()
    index.add(entry(0))
    scope = index._scopes["s"]
    matrix = scope.matrix
    for n in range(1, len(matrix)):  # up to the preallocated rows: the same array, written in place
        index.add(entry(n))
        index.search("s", unit(n), frozenset(), 0.5, now=0.0)
        assert scope.matrix is matrix
    index.add(entry(len(matrix)))  # one past: it doubles once
    assert len(scope.matrix) == 2 * len(matrix)
    assert np.array_equal(scope.matrix[:len(matrix)], matrix)


ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 40), st.sampled_from(["a", "b"]), st.sampled_from(["t1", "t2"]),
              st.integers(0, 2), st.integers(1, 100)),
    st.tuples(st.just("remove"), st.integers(0, 200)),
    st.tuples(st.just("purge"), st.sampled_from(["t1", "t2"])),
    st.tuples(st.just("search"), st.integers(0, 40), st.sampled_from(["a", "b"]), st.integers(0, 2),
              st.sampled_from([-1.0, 0.0, 0.5, 0.9]), st.integers(0, 10)),
), max_size=120)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_the_index_answers_as_a_search_over_every_live_entry(script) -> None:
    """Time only moves forward; entries live for 1-100 s from when they are added."""
    index = SemanticIndex()
    live: dict[str, Entry] = {}
    added: list[str] = []
    now = 0.0
    for op in script:
        if op[0] == "add":
            _, n, scope, tenant, g, ttl = op
            e = Entry(f"e{len(added)}", tenant, scope, f"q{n}", unit(n), frozenset({f"g{g}"}), now + ttl)
            added.append(e.id)
            live[e.id] = e
            index.add(e)
        elif op[0] == "remove":
            if added:
                gone = added[op[1] % len(added)]
                live.pop(gone, None)
                index.remove(gone)
        elif op[0] == "purge":
            for k in [k for k, e in live.items() if e.tenant_id == op[1]]:
                del live[k]
            index.remove_tenant(op[1])
        else:
            _, n, scope, g, threshold, dt = op
            now += dt
            want = naive(live, scope, unit(n), frozenset({f"g{g}"}), threshold, now)
            got = index.search(scope, unit(n), frozenset({f"g{g}"}), threshold, now)
            assert (got is None) == (want is None)
            if got is not None:
                assert abs(got[1] - want[1]) < 1e-5  # equal vectors may tie: either id is right
                assert got[0].expires_at > now and got[0].scope == scope and got[0].id in live
            # the index holds no removed or purged entry, and every live one
            assert {e.id for e in live.values() if e.expires_at > now} <= set(index._order) <= set(live)
