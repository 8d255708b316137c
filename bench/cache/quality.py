"""Precision and recall of the semantic cache's match rule on the committed quality set.

    .venv/bin/python -m bench.cache.quality [--json bench/cache/quality.json]

For each threshold: the share of paraphrase pairs that hit (recall) and of near-miss pairs that
hit (false hits), by embedding similarity alone and with the edge's guard (``guard_terms``), the
rule the edge applies. The same embedder and guard as the edge, nothing re-implemented.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from dataplane.edge.embedder import Embedder
from dataplane.edge.semantic_cache import guard_terms

PAIRS = Path(__file__).with_name("pairs.jsonl")
THRESHOLDS = (0.70, 0.75, 0.80, 0.825, 0.85, 0.875, 0.90, 0.925, 0.95, 0.975)


def load_pairs(path: Path = PAIRS) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def embed_all(texts: list[str]) -> dict[str, np.ndarray]:
    embedder = Embedder()
    embedder.load_now()  # the bench is not an event loop
    unique = sorted(set(texts))
    vectors = embedder.encode_sync(unique)
    return dict(zip(unique, vectors, strict=True))


def evaluate(pairs: list[dict], vectors: dict[str, np.ndarray], thresholds=THRESHOLDS) -> list[dict]:
    sims = np.array([float(vectors[p["a"]] @ vectors[p["b"]]) for p in pairs])
    same_guard = np.array([guard_terms(p["a"]) == guard_terms(p["b"]) for p in pairs])
    should = np.array([p["should_hit"] for p in pairs])
    kinds = sorted({p["kind"] for p in pairs if not p["should_hit"]})
    rows = []
    for t in thresholds:
        for rule, hit in (("embedding", sims >= t), ("embedding+guard", (sims >= t) & same_guard)):
            row = {"threshold": t, "rule": rule,
                   "recall": float(hit[should].mean()), "false_hits": float(hit[~should].mean()),
                   "precision": float(hit[should].sum() / max(1, hit.sum()))}
            for kind in kinds:
                mask = np.array([p["kind"] == kind for p in pairs])
                row[f"false_{kind}"] = float(hit[mask].mean())
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the table here too")
    args = ap.parse_args(argv)
    pairs = load_pairs()
    started = time.perf_counter()
    vectors = embed_all([p[k] for p in pairs for k in ("a", "b")])
    took = time.perf_counter() - started
    rows = evaluate(pairs, vectors)
    hits = sum(p["should_hit"] for p in pairs)
    print(f"{hits} paraphrase pairs, {len(pairs) - hits} near misses; {len(vectors)} sentences embedded "
          f"in {took:.1f}s (model load included)")
    kinds = [k for k in rows[0] if k.startswith("false_") and k != "false_hits"]
    print("| threshold | rule | recall (paraphrases hit) | false hits (near misses hit) | precision | "
          + " | ".join(k.removeprefix("false_") for k in kinds) + " |")
    print("|---" * (5 + len(kinds)) + "|")
    for r in rows:
        print(f"| {r['threshold']:.3f} | {r['rule']} | {100 * r['recall']:.1f} % | {100 * r['false_hits']:.2f} % | "
              f"{100 * r['precision']:.2f} % | " + " | ".join(f"{100 * r[k]:.1f} %" for k in kinds) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
