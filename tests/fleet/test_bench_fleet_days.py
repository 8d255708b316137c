"""bench.fleet.days: how a day is named and how Nimbus's day is priced against the bound's curve.

The simulation itself is bench.fleet's (tested elsewhere); these are the pieces that turn its runs
into the ratio the issue's target is judged on, on cases worked out by hand."""

from __future__ import annotations

import argparse

import pytest

from bench.fleet.days import Day, bound_at, render, shortfall_price, summarize

# The bound's curve: $ and attainment at each demand factor.
CURVE = [{"demand_factor": 0.98, "cost": 960.0, "slo_attainment": 0.85},
         {"demand_factor": 1.0, "cost": 1000.0, "slo_attainment": 0.93},
         {"demand_factor": 1.02, "cost": 1020.0, "slo_attainment": 0.96},
         {"demand_factor": 1.05, "cost": 1050.0, "slo_attainment": 0.975}]


def test_a_day_is_catalog_seed_and_an_optional_load_scale():
    assert Day.parse("sample:3") == Day("sample", 3, 1.0)
    assert Day.parse("fine:2:0.5") == Day("fine", 2, 0.5)
    assert Day.parse("fine:2:0.5").name == "fine:2:0.5" and Day.parse("sample:3").name == "sample:3"
    for bad in ("sample", "cheap:1", "sample:x", "sample:1:half", "sample:1:0.5:2"):
        with pytest.raises(argparse.ArgumentTypeError):
            Day.parse(bad)


def test_the_bound_is_read_off_its_curve_at_nimbuss_attainment():
    # between f = 1 and 1.02: a third of the way up the attainment, a third of the $
    cost, basis = bound_at(CURVE, 0.94)
    assert cost == pytest.approx(1000.0 + 20.0 / 3)
    assert basis == "f = 1.007"
    # below f = 1's attainment the curve goes on below f = 1: a cheaper bound, a stricter ratio
    assert bound_at(CURVE, 0.89) == (pytest.approx(980.0), "f = 0.990")
    # below the lowest factor's attainment: its cost, never a cheaper (flattering) one
    assert bound_at(CURVE, 0.80) == (960.0, "f = 0.98")
    # above the highest factor there is nothing to read
    assert bound_at(CURVE, 0.99) is None


def test_the_attainment_nimbus_lacks_below_the_curve_is_priced_at_the_bounds_own_rate():
    # from f = 0.98 to 1 the bound pays $40 for 8 points: $5 a point
    assert shortfall_price(CURVE, 0.80) == pytest.approx(5 * 5.0)
    assert shortfall_price(CURVE, 0.845) == pytest.approx(0.5 * 5.0)
    # at or above the lowest factor's attainment nothing is short (bound_at compares at equal SLO)
    assert shortfall_price(CURVE, 0.85) == 0.0
    assert shortfall_price(CURVE, 0.97) == 0.0
    # the factors may come in any order
    assert shortfall_price(list(reversed(CURVE)), 0.80) == pytest.approx(25.0)


def test_the_summed_row_divides_summed_costs_and_names_the_worst_day():
    def runs(cost: float, attainment: float) -> dict:
        nimbus = {"cost": cost, "slo_attainment": attainment, "fragmentation": 0.02,
                  "slo_by_phase": {"burst": {"attainment": 0.4}}}
        return {"nimbus": nimbus, **{f"clairvoyant-x{b['demand_factor']:g}": b for b in CURVE}}

    rows = [summarize(Day("sample", 1), runs(1230.0, 0.80)),  # below the curve, against f = 0.98
            summarize(Day("fine", 1), runs(1190.0, 0.96)),  # against f = 1.02: 1190 / 1020
            summarize(Day("fine", 2), runs(1300.0, 0.99))]  # off the curve: not priced
    assert rows[0]["ratio"] == pytest.approx(1230.0 / 960.0)
    assert rows[0]["bound_attainment"] == 0.93  # the column shows f = 1's, the lowest factor aside
    assert rows[1]["ratio"] == pytest.approx(1190.0 / 1020.0)
    assert rows[2]["ratio"] is None
    # 5 points short of f = 0.98 at $5 a point: $25 more; at 0.96 nothing is short
    assert rows[0]["shortfall_priced_ratio"] == pytest.approx(1255.0 / 960.0)
    assert rows[1]["shortfall_priced_ratio"] == pytest.approx(rows[1]["ratio"])
    text = render(rows)
    assert (f"summed over 2 days: {(1230.0 + 1190.0) / 1980.0:.4f}x the bound at equal SLO "
            f"({(1255.0 + 1190.0) / 1980.0:.4f}x with the SLO shortfall priced)") in text
    assert "| sample:1 | 1,230 | 80.00 % | 40.0 % | 2.0 % | 93.00 % | 960 (f = 0.98) | 1.281 | 1.307 |" in text
    assert "worst day sample:1 1.281x" in text
    assert "days at or under 1.2x: 1 of 2" in text
    assert "— (above the bound's curve)" in text
