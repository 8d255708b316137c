"""Nimbus edge proxy: auth, limits, validation, fair admission, predicted-TTFT routing, streaming.

The edge works only from snapshots (control plane or a static config file), never from Postgres,
so it keeps serving through a control-plane outage. See ``snapshot.py`` for the contracts.
"""
