"""A simulated day of a multi-model GPU fleet: Nimbus's placement and consolidation against a
SkyServe-style fleet and a clairvoyant lower bound. Entry point: ``python -m bench.fleet``."""
