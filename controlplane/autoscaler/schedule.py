"""Scheduled capacity: minimum replicas by time of day and day of week (pure).

An operator who knows when the peaks come (business hours, a nightly batch) sets floors for
those windows. A window counts from ``lead_s`` before its start, the pool's pre-warm horizon (its
p90 model-ready time), so the replicas are ready when the peak arrives, not cold-starting into
it. Outside every window the pool's own ``min_replicas`` applies; a schedule never lowers it.

A window: ``{"days": ["mon", …], "start": "09:00", "end": "18:00", "min_replicas": 4}`` in the
pool's ``schedule_timezone`` (IANA name; UTC by default). ``end`` before ``start`` runs past
midnight into the next day; ``end == "24:00"`` is the end of the day.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
MAX_WINDOWS = 50


class ScheduleError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


@dataclass(frozen=True)
class Window:
    days: tuple[int, ...]  # 0 = Monday
    start_min: int  # minutes after midnight
    end_min: int  # 1..1440; ≤ start_min: past midnight
    min_replicas: int

    def describe(self) -> str:
        names = ",".join(DAYS[d] for d in self.days)
        return f"{names} {_hhmm(self.start_min)}–{_hhmm(self.end_min)} min {self.min_replicas}"

    def active(self, local: dt.datetime) -> bool:
        minute = local.hour * 60 + local.minute
        today, yesterday = local.weekday(), (local.weekday() - 1) % 7
        if self.start_min < self.end_min:
            return today in self.days and self.start_min <= minute < self.end_min
        # Overnight: from start today until midnight, or from midnight until end after a listed day.
        return (today in self.days and minute >= self.start_min) or (yesterday in self.days and minute < self.end_min)


def _hhmm(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def _minutes(value: object, field: str) -> int:
    if not isinstance(value, str) or len(value) != 5 or value[2] != ":":
        raise ScheduleError(field, "must be HH:MM")
    try:
        h, m = int(value[:2]), int(value[3:])
    except ValueError:
        raise ScheduleError(field, "must be HH:MM") from None
    if not (0 <= h <= 24 and 0 <= m < 60) or (h == 24 and m):
        raise ScheduleError(field, "must be a time of day between 00:00 and 24:00")
    return h * 60 + m


def parse(windows: Sequence[Mapping], *, max_replicas: int | None = None) -> tuple[Window, ...]:
    """Validated windows; raises ScheduleError naming the bad field (``schedule[2].start``)."""
    if len(windows) > MAX_WINDOWS:
        raise ScheduleError("schedule", f"at most {MAX_WINDOWS} windows")
    out = []
    for i, w in enumerate(windows):
        at = f"schedule[{i}]"
        unknown = set(w) - {"days", "start", "end", "min_replicas"}
        if unknown:
            raise ScheduleError(f"{at}.{sorted(unknown)[0]}", "unknown field")
        days = w.get("days") or []
        if not isinstance(days, list) or not days or any(d not in DAYS for d in days):
            raise ScheduleError(f"{at}.days", f"a non-empty list of {', '.join(DAYS)}")
        start, end = _minutes(w.get("start"), f"{at}.start"), _minutes(w.get("end"), f"{at}.end")
        if start == 1440:
            raise ScheduleError(f"{at}.start", "must be before 24:00")
        if start == end:
            raise ScheduleError(f"{at}.end", "must differ from start")
        n = w.get("min_replicas")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ScheduleError(f"{at}.min_replicas", "a whole number ≥ 0")
        if max_replicas is not None and n > max_replicas:
            raise ScheduleError(f"{at}.min_replicas", f"above the pool's max_replicas ({max_replicas})")
        out.append(Window(tuple(sorted({DAYS.index(d) for d in days})), start, end, n))
    return tuple(out)


def zone(name: str | None) -> ZoneInfo:
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError("schedule_timezone", "an IANA time zone name, e.g. Europe/Berlin") from None


@dataclass(frozen=True)
class ScheduledFloor:
    min_replicas: int
    window: Window | None  # the window that sets it; None: no window applies

    def reason(self) -> str | None:
        return None if self.window is None else f"schedule: {self.window.describe()}"


def scheduled_floor(windows: Sequence[Window], tz: ZoneInfo, now: float, lead_s: float = 0.0) -> ScheduledFloor:
    """The highest floor of the windows active now or within ``lead_s`` (so they are warm in time)."""
    best: ScheduledFloor = ScheduledFloor(0, None)
    times = [dt.datetime.fromtimestamp(now, tz)]
    if lead_s > 0:
        times.append(dt.datetime.fromtimestamp(now + lead_s, tz))
    for w in windows:
        if w.min_replicas > best.min_replicas and any(w.active(t) for t in times):
            best = ScheduledFloor(w.min_replicas, w)
    return best
