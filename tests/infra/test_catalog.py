"""Catalog loading and validation against the shared schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.catalog import CatalogError, load_catalog
from tests.infra.conftest import catalog_dict


def test_loads_typed_objects_from_dict_file_and_string(tmp_path: Path):
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(catalog_dict()))
    for source in (catalog_dict(), path, str(path), json.dumps(catalog_dict())):
        catalog = load_catalog(source)
        aws = catalog.cloud("aws")
        east = aws.regions[0]
        assert east.template.id == "lt-east"
        assert [z.subnet for z in east.zones] == ["subnet-a", "subnet-b", "subnet-c"]
        p5 = east.instance_types[2]
        assert (p5.gpu_count, p5.spot_price, p5.zones) == (8, None, ("us-east-1a",))
        assert p5.offered_in("us-east-1a") and not p5.offered_in("us-east-1b")
        assert catalog.cloud("gcp").project == "nimbus-test"
        assert catalog.cloud("azure") is None


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda d: d["clouds"][0].update(name="azure"), "clouds/0/name"),
        (lambda d: d["clouds"][0]["regions"][0]["instance_types"][0].update(gpu_count=0), "gpu_count"),
        (lambda d: d["clouds"][0]["regions"][0].pop("template"), "clouds/0/regions/0"),
        (lambda d: d.update(version=2), "version"),
        (lambda d: d["clouds"][0]["regions"][0]["zones"][0].update(extra=1), "zones/0"),
    ],
)
def test_invalid_catalogs_are_rejected_with_a_path(mutate, where):
    data = catalog_dict()
    mutate(data)
    with pytest.raises(CatalogError, match=where):
        load_catalog(data)
