"""Scheduled capacity windows (pure): parsing, overnight windows, time zones, the pre-warm lead."""

from __future__ import annotations

import datetime as dt

import pytest

from controlplane.autoscaler.schedule import ScheduleError, parse, scheduled_floor, zone

UTC = zone("UTC")


def at(*args, tz=dt.UTC) -> float:
    return dt.datetime(*args, tzinfo=tz).timestamp()


def test_weekday_window_applies_only_inside_it() -> None:
    w = parse([{"days": ["mon", "tue", "wed", "thu", "fri"], "start": "09:00", "end": "18:00", "min_replicas": 4}])
    assert scheduled_floor(w, UTC, at(2026, 11, 30, 12, 0)).min_replicas == 4  # Monday noon
    assert scheduled_floor(w, UTC, at(2026, 11, 30, 18, 0)).window is None  # end is exclusive
    assert scheduled_floor(w, UTC, at(2026, 11, 29, 12, 0)).window is None  # Sunday


def test_overnight_window_runs_into_the_next_day() -> None:
    w = parse([{"days": ["fri"], "start": "22:00", "end": "06:00", "min_replicas": 2}])
    assert scheduled_floor(w, UTC, at(2026, 12, 4, 23, 0)).min_replicas == 2  # Friday night
    assert scheduled_floor(w, UTC, at(2026, 12, 5, 5, 59)).min_replicas == 2  # early Saturday
    assert scheduled_floor(w, UTC, at(2026, 12, 5, 6, 0)).window is None
    assert scheduled_floor(w, UTC, at(2026, 12, 4, 5, 0)).window is None  # Friday morning: Thursday's night


def test_time_zone_and_the_highest_window_wins() -> None:
    berlin = zone("Europe/Berlin")
    w = parse([{"days": ["mon"], "start": "09:00", "end": "17:00", "min_replicas": 2},
               {"days": ["mon"], "start": "11:00", "end": "12:00", "min_replicas": 5}])
    # 08:30 UTC is 09:30 in Berlin in winter.
    assert scheduled_floor(w, berlin, at(2026, 11, 30, 8, 30)).min_replicas == 2
    assert scheduled_floor(w, berlin, at(2026, 11, 30, 10, 30)).min_replicas == 5


def test_lead_warms_a_window_before_it_opens() -> None:
    w = parse([{"days": ["mon"], "start": "09:00", "end": "10:00", "min_replicas": 3}])
    before = at(2026, 11, 30, 8, 58)
    assert scheduled_floor(w, UTC, before).window is None
    assert scheduled_floor(w, UTC, before, lead_s=180).min_replicas == 3


@pytest.mark.parametrize("window, field", [
    ({"days": [], "start": "09:00", "end": "10:00", "min_replicas": 1}, "schedule[0].days"),
    ({"days": ["xyz"], "start": "09:00", "end": "10:00", "min_replicas": 1}, "schedule[0].days"),
    ({"days": ["mon"], "start": "9am", "end": "10:00", "min_replicas": 1}, "schedule[0].start"),
    ({"days": ["mon"], "start": "09:00", "end": "09:00", "min_replicas": 1}, "schedule[0].end"),
    ({"days": ["mon"], "start": "09:00", "end": "24:30", "min_replicas": 1}, "schedule[0].end"),
    ({"days": ["mon"], "start": "09:00", "end": "10:00", "min_replicas": -1}, "schedule[0].min_replicas"),
    ({"days": ["mon"], "start": "09:00", "end": "10:00", "min_replicas": 1, "x": 1}, "schedule[0].x"),
])
def test_bad_windows_name_their_field(window, field) -> None:
    with pytest.raises(ScheduleError) as err:
        parse([window])
    assert err.value.field == field


def test_floor_above_max_replicas_is_refused() -> None:
    with pytest.raises(ScheduleError, match="max_replicas"):
        parse([{"days": ["mon"], "start": "09:00", "end": "10:00", "min_replicas": 5}], max_replicas=4)
    with pytest.raises(ScheduleError):
        zone("Not/AZone")
