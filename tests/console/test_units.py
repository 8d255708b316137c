"""Pure parts of the console: percentiles, time folding, latency split, CSV, charts, key sealing."""

from __future__ import annotations

import datetime as dt
import re
import uuid

import pytest
from cryptography.exceptions import InvalidTag
from hypothesis import given
from hypothesis import strategies as st

from controlplane.console import charts, metrics, sessions
from controlplane.models.console import ConsoleSession
from controlplane.schemas.usage import UsageBucket, UsageNumbers, UsageReport, UsageSeries

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


def test_weighted_percentile_uses_request_weights():
    # 90 requests at 100 ms and 10 at 1000 ms: the median is 100, p95 is 1000
    samples = [(100.0, 90), (1000.0, 10)]
    assert metrics.weighted_percentile(samples, 0.5) == 100.0
    assert metrics.weighted_percentile(samples, 0.95) == 1000.0
    assert metrics.weighted_percentile([], 0.5) is None
    assert metrics.weighted_percentile([(5.0, 0)], 0.5) is None


@given(st.lists(st.tuples(st.floats(0, 1e6), st.integers(1, 50)), min_size=1, max_size=40),
       st.floats(0.01, 1.0))
def test_percentile_is_one_of_the_samples_and_monotone(samples, q):
    p = metrics.weighted_percentile(samples, q)
    assert p in {v for v, _ in samples}
    assert metrics.weighted_percentile(samples, min(q + 0.1, 1.0)) >= p


def _numbers(requests, ttft, prompt=100, cached=25, errors=0):
    return UsageNumbers(requests=requests, errors=errors, prompt_tokens=prompt, completion_tokens=10,
                        cached_tokens=cached, avg_queue_ms=5.0, avg_ttft_ms=ttft, avg_duration_ms=ttft + 200)


def test_timeline_folds_minutes_and_variants_into_display_buckets():
    start, end, step = T0, T0 + dt.timedelta(hours=3), dt.timedelta(hours=1)
    report = UsageReport(start=start, end=end, granularity="minute", total=UsageNumbers(), series=[
        UsageSeries(variant_id=uuid.uuid4(), model="a", tier="bf16", total=UsageNumbers(), buckets=[
            UsageBucket(start=T0 + dt.timedelta(minutes=1), usage=_numbers(3, 100.0)),
            UsageBucket(start=T0 + dt.timedelta(minutes=59), usage=_numbers(1, 900.0, errors=1)),
            UsageBucket(start=T0 + dt.timedelta(hours=5), usage=_numbers(7, 1.0)),  # outside: ignored
        ]),
        UsageSeries(variant_id=uuid.uuid4(), model="b", tier="fp8", total=UsageNumbers(), buckets=[
            UsageBucket(start=T0 + dt.timedelta(hours=2, minutes=3), usage=_numbers(2, 50.0, prompt=0, cached=0)),
        ]),
    ])
    points = metrics.timeline(report, start, end, step)
    assert [p.start for p in points] == [T0, T0 + step, T0 + 2 * step]
    assert [p.requests for p in points] == [4, 0, 2]
    assert points[0].errors == 1 and points[0].tokens == 220
    assert points[0].ttft_p50 == 100.0 and points[0].ttft_p95 == 900.0
    assert points[0].cache_hit_rate == pytest.approx(0.25)
    assert points[1].ttft_p50 is None and points[2].cache_hit_rate is None
    assert metrics.overall_ttft(points, 0.5) == 100.0


def test_window_ends_on_a_bucket_boundary_after_now():
    now = dt.datetime(2026, 1, 1, 12, 34, 56, tzinfo=dt.UTC)
    start, end, step = metrics.window("24h", now)
    assert end == dt.datetime(2026, 1, 1, 13, 0, tzinfo=dt.UTC) and end - start == dt.timedelta(days=1)
    assert step == dt.timedelta(hours=1)
    assert metrics.window("nonsense", now) == metrics.window(metrics.DEFAULT_RANGE, now)


def test_breakdown_splits_ttft_into_queueing_and_prefill():
    b = metrics.breakdown("m", "bf16", UsageNumbers(requests=4, avg_queue_ms=30.0, avg_ttft_ms=80.0,
                                                     avg_duration_ms=500.0), 41.5, {"load": 20.0})
    assert (b.queue_ms, b.prefill_ms, b.generation_ms) == (30.0, 50.0, 420.0)
    assert b.cold_start_s == 41.5
    empty = metrics.breakdown("m", "bf16", UsageNumbers(), None, {})
    assert empty.prefill_ms is None and empty.generation_ms is None


def test_csv_has_a_header_and_defuses_formulas():
    rows = [{c: None for c in metrics.CSV_COLUMNS} | {"bucket_start": "2026-01-01T00:00:00+00:00",
                                                      "model": "=HYPERLINK(1)", "requests": 3}]
    text = metrics.to_csv(rows)
    header, line = text.splitlines()
    assert header.split(",") == list(metrics.CSV_COLUMNS)
    assert "'=HYPERLINK(1)" in line and ",3," in line


def test_bar_chart_draws_one_bar_per_non_empty_bucket_and_says_so():
    times = [T0 + dt.timedelta(minutes=i) for i in range(4)]
    svg = str(charts.bar_chart("c", "Requests", times, [0, 3, 0, 7], dt.timedelta(minutes=1)))
    assert svg.count('<rect class="bar"') == 2 and 'data-points="2"' in svg
    assert 'role="img"' in svg and "total 10, peak 7" in svg
    heights = [float(h) for h in re.findall(r'class="bar"[^>]*height="([\d.]+)"', svg)]
    assert heights[1] > heights[0]  # 7 is drawn taller than 3
    assert 'data-points="0"' in str(charts.bar_chart("e", "Errors", times, [0] * 4, dt.timedelta(minutes=1)))


def test_line_chart_escapes_labels_and_handles_gaps():
    times = [T0 + dt.timedelta(hours=i) for i in range(3)]
    svg = str(charts.line_chart("l", "<TTFT>", times, [("p50", [10.0, None, 30.0])], dt.timedelta(hours=1)))
    assert "<TTFT>" not in svg and "&lt;TTFT&gt;" in svg
    assert svg.count("<circle") == 2 and "<polyline" in svg


@pytest.mark.parametrize(("value", "expected"), [(0, 1.0), (0.3, 0.5), (7, 10.0), (10, 10.0), (11, 20.0), (420, 500.0)])
def test_axis_tops_are_round_numbers(value, expected):
    assert charts.nice_ceiling(value) == expected


def test_playground_key_sealing_needs_the_browser_token():
    row = ConsoleSession(id=uuid.uuid4(), token_sha256="x", kind="tenant", csrf_token="c")
    live = sessions.Live(row, token="browser-token")
    blob = sessions.seal(live, "nmb_abcdefgh_secret")
    assert "secret" not in blob
    assert sessions.unseal(live, blob) == "nmb_abcdefgh_secret"
    with pytest.raises(InvalidTag):
        sessions.unseal(sessions.Live(row, token="another-token"), blob)
    other_row = ConsoleSession(id=uuid.uuid4(), token_sha256="y", kind="tenant", csrf_token="c")
    with pytest.raises(InvalidTag):  # bound to its session row too
        sessions.unseal(sessions.Live(other_row, token="browser-token"), blob)
