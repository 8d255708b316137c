"""Prometheus metrics under SGLang's names (``sglang:`` prefix, ``model_name`` label).

A few dozen lines of our own instead of prometheus_client: the scheduler observes one
inter-token latency per token per stream, hundreds of thousands a second at full load, and
a bisect into a list is several times cheaper than the library's locked histogram. The text
format written here is the one prometheus_client writes (a counter's HELP/TYPE lines and its
sample all carry the ``_total`` suffix).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable

# Bucket bounds as SGLang's collector declares them (seconds); python/sglang/srt/metrics/collector.py,
# TokenizerMetricsCollector / SchedulerMetricsCollector defaults (see dataplane/sim/CONFORMANCE.md).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
               0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800,
               2400)
QUEUE_BUCKETS = (0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100, 200, 300,
                 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000)


class Histogram:
    __slots__ = ("bounds", "count", "counts", "help", "name", "sum")

    def __init__(self, name: str, help_text: str, bounds: Iterable[float]):
        self.name, self.help = name, help_text
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def render(self, label: str) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            lines.append(f'{self.name}_bucket{{{label},le="{float(bound)}"}} {float(running)}')
        lines.append(f'{self.name}_bucket{{{label},le="+Inf"}} {float(self.count)}')
        lines.append(f"{self.name}_count{{{label}}} {float(self.count)}")
        lines.append(f"{self.name}_sum{{{label}}} {self.sum}")
        return lines


class SimMetrics:
    """Counters and histograms the engine updates; gauges are read from the engine at scrape."""

    def __init__(self, model_name: str):
        self.label = f'model_name="{model_name}"'
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.cached_tokens = 0
        self.num_requests = 0
        self.aborted = 0
        self.retracted = 0  # set from the engine at render time
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds",
                             "Histogram of End-to-end request latency in seconds", E2E_BUCKETS)
        self.queue = Histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", QUEUE_BUCKETS)

    def render(self, gauges: dict[str, tuple[str, float]], extra: Callable[[], list[str]] | None = None) -> str:
        lines: list[str] = []
        for name, (help_text, value) in gauges.items():
            lines += [f"# HELP sglang:{name} {help_text}", f"# TYPE sglang:{name} gauge",
                      f"sglang:{name}{{{self.label}}} {float(value)}"]
        for name, help_text, value in (
            ("prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens),
            ("generation_tokens", "Number of generation tokens processed.", self.generation_tokens),
            ("cached_tokens", "Number of cached prompt tokens.", self.cached_tokens),
            ("num_requests", "Number of requests processed.", self.num_requests),
            ("num_aborted_requests", "Number of requests aborted.", self.aborted),
            ("num_retracted_requests", "Total number of retracted requests.", self.retracted),
        ):
            lines += [f"# HELP sglang:{name}_total {help_text}", f"# TYPE sglang:{name}_total counter",
                      f"sglang:{name}_total{{{self.label}}} {float(value)}"]
        for histogram in (self.ttft, self.itl, self.e2e, self.queue):
            lines += histogram.render(self.label)
        if extra:
            lines += extra()
        return "\n".join(lines) + "\n"
