"""Engine metrics → heartbeat numbers (from a real simulator's /metrics), and the artifact caches
(a directory source, a regional shared cache, and S3 through a moto server)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import httpx
import pytest

from dataplane.agent import artifacts, scrape
from dataplane.sim.process import SimProcess, free_port


def test_heartbeat_metrics_are_gauges_plus_deltas_from_a_real_engine():
    with SimProcess(served_model_name="m", extra_args=["--time-scale", "50", "--enable-metrics"]) as sim:
        before = scrape.parse(httpx.get(sim.url + "/metrics").text)
        for _ in range(2):
            r = httpx.post(sim.url + "/v1/completions", json={"model": "m", "prompt": "a b c d", "max_tokens": 5})
            assert r.status_code == 200
        after = scrape.parse(httpx.get(sim.url + "/metrics").text)
    m = scrape.heartbeat_metrics(after, before, interval_s=2.0)
    assert m["num_requests_delta"] == 2 and m["num_requests_per_s"] == 1.0
    assert m["generation_tokens_delta"] == 10
    assert set(scrape.GAUGES) <= set(m)
    ttft = m["histograms"]["time_to_first_token_seconds"]
    assert ttft["count"] == 2 and ttft["buckets"]["+Inf"] == 2 and scrape.mean_from(ttft) > 0
    assert m["histograms"]["inter_token_latency_seconds"]["count"] == 8  # 4 gaps per 5-token answer
    assert scrape.in_flight(after) == 0


def test_a_counter_going_backwards_is_an_engine_restart():
    old = scrape.Sample(counters={"num_requests": 50.0},
                        histograms={"queue_time_seconds": scrape.Histogram({"+Inf": 50.0}, 9.0, 50.0)})
    new = scrape.Sample(counters={"num_requests": 3.0},
                        histograms={"queue_time_seconds": scrape.Histogram({"+Inf": 3.0}, 0.5, 3.0)})
    m = scrape.heartbeat_metrics(new, old, 5.0)
    assert m["num_requests_delta"] == 3.0
    assert m["histograms"]["queue_time_seconds"] == {"buckets": {"+Inf": 3.0}, "sum": 0.5, "count": 3.0}


def _model_dir(root: Path, name: str) -> Path:
    d = root / name
    (d / "sub").mkdir(parents=True)
    (d / "config.json").write_text('{"arch": "llama"}')
    (d / "sub" / "model.safetensors").write_bytes(os.urandom(4096))
    return d


def test_fetch_goes_source_then_shared_cache_then_local_cache(tmp_path):
    source = tmp_path / "bucket"
    _model_dir(source, "org/model")
    shared = tmp_path / "shared"

    first = artifacts.fetch("org/model", local_cache_dir=tmp_path / "node1", shared_cache_dir=shared,
                            source=f"file://{source}")
    assert first.source == "source" and first.bytes == 4096 + 17
    assert (Path(first.path) / "sub" / "model.safetensors").read_bytes() == (
        source / "org/model/sub/model.safetensors").read_bytes()
    # A second node of the region finds it in the shared cache, even with the source gone.
    (source / "org/model/config.json").unlink()
    second = artifacts.fetch("org/model", local_cache_dir=tmp_path / "node2", shared_cache_dir=shared,
                             source=f"file://{source}")
    assert second.source == "shared_cache" and Path(second.path, "config.json").exists()
    again = artifacts.fetch("org/model", local_cache_dir=tmp_path / "node2", shared_cache_dir=shared)
    assert again.source == "local_cache" and again.download_s == 0.0 and again.path == second.path
    # Nothing configured: the engine resolves the hub id itself; a local directory is used in place.
    assert artifacts.fetch("org/other", local_cache_dir=tmp_path / "n3").source == "engine"
    assert artifacts.fetch(str(source), local_cache_dir=tmp_path / "n3").path == str(source)


def test_the_local_cache_evicts_the_least_recently_used_checkpoint_no_replica_runs(tmp_path):
    """Each entry is 4,113 bytes. A hit makes an entry the most recently used; eviction deletes the
    oldest first down to the limit, never a model in ``keep``, and what it deleted is no longer
    listed (nor found: the next fetch downloads it again)."""
    source, local = tmp_path / "bucket", tmp_path / "node"
    for name in ("org/a", "org/b", "org/c"):
        _model_dir(source, name)
        artifacts.fetch(name, local_cache_dir=local, source=f"file://{source}")
    for age, name in ((3000, "org/a"), (2000, "org/b"), (1000, "org/c")):  # a oldest, then b, then c
        os.utime(local / artifacts.cache_key(name) / artifacts.COMPLETE_MARKER, (1e9 - age, 1e9 - age))
    assert artifacts.fetch("org/a", local_cache_dir=local, source=f"file://{source}").on_node  # a: used now
    assert artifacts.cached(local) == ["org/a", "org/b", "org/c"]
    assert artifacts.evict(local, max_bytes=3 * 4113) == []  # within the limit: nothing goes
    assert artifacts.evict(local, max_bytes=2 * 4113 + 100, keep={"org/c"}) == ["org/b"]
    assert artifacts.evict(local, max_bytes=0, keep={"org/c"}) == ["org/a"]
    assert artifacts.cached(local) == ["org/c"]
    assert [p.name for p in local.iterdir() if not p.name.endswith(".lock")] == [artifacts.cache_key("org/c")]
    again = artifacts.fetch("org/a", local_cache_dir=local, source=f"file://{source}")
    assert again.source == "source" and not again.on_node


def test_concurrent_fetches_download_once_and_failures_leave_no_partial_copy(tmp_path, monkeypatch):
    source = tmp_path / "bucket"
    _model_dir(source, "m")
    calls = []
    real = artifacts.source_filler

    def slow_filler(src, model_path):
        fill = real(src, model_path)

        def wrapped(dest):
            calls.append(model_path)
            time.sleep(0.3)
            fill(dest)
        return wrapped

    monkeypatch.setattr(artifacts, "source_filler", slow_filler)
    results = []
    threads = [threading.Thread(target=lambda: results.append(artifacts.fetch(
        "m", local_cache_dir=tmp_path / "local", source=str(source)))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["m"] and len({r.path for r in results}) == 1
    with pytest.raises(FileNotFoundError):
        artifacts.fetch("missing", local_cache_dir=tmp_path / "local", source=str(source))
    assert not any(p.name.startswith(artifacts.cache_key("missing")) for p in (tmp_path / "local").iterdir())


@pytest.fixture
def moto_s3(monkeypatch):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        for k, v in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
                     "AWS_ENDPOINT_URL_S3": url}.items():
            monkeypatch.setenv(k, v)
        yield boto3.client("s3")
    finally:
        proc.terminate()
        proc.wait(10)


def test_fetch_from_s3_into_the_shared_cache(tmp_path, moto_s3):
    moto_s3.create_bucket(Bucket="weights")
    moto_s3.put_object(Bucket="weights", Key="models/org/m/config.json", Body=b"{}")
    moto_s3.put_object(Bucket="weights", Key="models/org/m/shards/0.safetensors", Body=b"x" * 1000)
    got = artifacts.fetch("org/m", local_cache_dir=tmp_path / "local", shared_cache_dir=tmp_path / "shared",
                          source="s3://weights/models")
    assert got.source == "source" and got.bytes == 1002
    assert Path(got.path, "shards", "0.safetensors").read_bytes() == b"x" * 1000
    assert (tmp_path / "shared" / artifacts.cache_key("org/m") / artifacts.COMPLETE_MARKER).exists()
    with pytest.raises(FileNotFoundError):
        artifacts.fetch("org/none", local_cache_dir=tmp_path / "local", source="s3://weights/models")
