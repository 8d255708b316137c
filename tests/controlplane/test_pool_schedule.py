"""Scheduled capacity through the admin API: windows are validated field by field and shown."""

from __future__ import annotations

from tests.controlplane.factories import create_model, create_pool, import_catalog

NIGHTS = {"days": ["sat", "sun"], "start": "22:00", "end": "06:00", "min_replicas": 2}


async def test_schedule_is_stored_validated_and_shown(client, admin) -> None:
    await import_catalog(client, admin)
    model = await create_model(client, admin, tiers=("bf16",))
    pool = await create_pool(client, admin, model["variants"][0]["id"], max_replicas=3,
                             schedule=[NIGHTS], schedule_timezone="Europe/Berlin")
    assert pool["schedule"] == [NIGHTS] and pool["schedule_timezone"] == "Europe/Berlin"
    assert "scheduled_min_replicas" in pool
    got = (await client.get(f"/admin/v1/pools/{pool['id']}", headers=admin)).json()
    assert got["schedule"] == [NIGHTS]

    too_many = {**NIGHTS, "min_replicas": 9}
    r = await client.patch(f"/admin/v1/pools/{pool['id']}", json={"schedule": [NIGHTS, too_many]}, headers=admin)
    assert r.status_code == 422, r.text  # well-formed, but not a valid pool: the project's 422
    assert r.json()["errors"] == [{"field": "schedule[1].min_replicas",
                                   "message": "above the pool's max_replicas (3)"}]
    r = await client.patch(f"/admin/v1/pools/{pool['id']}", json={"schedule_timezone": "Mars/Olympus"},
                           headers=admin)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "schedule_timezone"
    r = await client.patch(f"/admin/v1/pools/{pool['id']}", json={"schedule": [{**NIGHTS, "start": "25:00"}]},
                           headers=admin)
    assert r.status_code == 400 and "start" in r.text, r.text  # malformed: rejected by the schema
    r = await client.patch(f"/admin/v1/pools/{pool['id']}", json={"schedule": []}, headers=admin)
    assert r.status_code == 200 and r.json()["schedule"] == [] and r.json()["scheduled_min_replicas"] is None
