"""Seasonal forecast of a pool's token rate, in plain Python.

Pre-warming has to start one cold start (the pool's p90 model-ready time) before the demand
arrives, so what matters is the *peak* rate over the next ``horizon`` seconds. The forecast
blends two views:

* seasonal-naive: how much the rate rose over the same stretch of time one season (a day) ago,
  added to today's level, so a ramp that happens every morning is met before it starts;
* recent trend: the least-squares slope of the last minutes, damped, for pools without a
  full season of history (a model's first day) and for growth that yesterday did not have.

The forecast rise is the larger of the two (never negative: shrinking is the reactive
part's job, with its hold window).

History is a sequence of ``(t, rate)`` points, oldest first, at any regular step.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

Series = Sequence[tuple[float, float]]

# How much of the recent slope we trust over the horizon (a slope over minutes rarely holds).
TREND_DAMPING = 0.5


@dataclass(frozen=True)
class Forecast:
    level: float
    trend_per_s: float
    seasonal_rise: float | None
    peak: float  # forecast maximum over [now, now + horizon], never below the level
    horizon_s: float


def _index(history: Series, t: float) -> int:
    return bisect_left(history, t, key=lambda point: point[0])


def window_values(history: Series, start: float, end: float) -> list[tuple[float, float]]:
    """Points with ``start < t <= end``."""
    lo = _index(history, start)
    if lo < len(history) and history[lo][0] == start:
        lo += 1
    hi = _index(history, end)
    if hi < len(history) and history[hi][0] == end:
        hi += 1
    return list(history[lo:hi])


def mean_rate(history: Series, start: float, end: float) -> float | None:
    points = window_values(history, start, end)
    if not points:
        return None
    return sum(v for _, v in points) / len(points)


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope (rate per second); 0 with fewer than three points."""
    if len(points) < 3:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var_t = sum((t - mean_t) ** 2 for t, _ in points)
    if var_t == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var_t


def seasonal_rise(history: Series, now: float, horizon_s: float, season_s: float,
                  level_window_s: float) -> float | None:
    """Rise from the level one season ago to the peak of the following ``horizon_s``."""
    then = now - season_s
    if not history or history[0][0] > then - level_window_s:
        return None  # less than a season of history
    base = mean_rate(history, then - level_window_s, then)
    # Smooth the season's peak so one noisy point does not pre-warm. The window is centred
    # (that day is all in the past) and the search reaches half a window further, so the
    # smoothing does not delay the ramp it announces.
    half = level_window_s / 2
    ahead = window_values(history, then, then + horizon_s + half)
    if base is None or not ahead:
        return None
    smoothed = []
    for t, _ in ahead:
        m = mean_rate(history, t - half, t + half)
        if m is not None:
            smoothed.append(m)
    return max(smoothed, default=base) - base


def forecast_peak(history: Series, now: float, horizon_s: float, *, season_s: float = 86400.0,
                  level_window_s: float = 120.0, trend_window_s: float = 900.0,
                  trend_cap: float = 0.25) -> Forecast:
    level = mean_rate(history, now - level_window_s, now) or 0.0
    trend = slope(window_values(history, now - trend_window_s, now))
    rise = seasonal_rise(history, now, horizon_s, season_s, level_window_s)
    trend_rise = min(max(0.0, trend) * horizon_s * TREND_DAMPING, trend_cap * level)
    # Either view may see growth the other misses (yesterday's ramp before it starts, today's
    # growth that yesterday did not have); pre-warming is for the larger of the two.
    expected_rise = trend_rise if rise is None else max(rise, trend_rise)
    return Forecast(level, trend, rise, level + expected_rise, horizon_s)
