"""The worker-side fleet loop: reconcile, placement and consolidation, the launch and terminate
executors, sweeps, leases, the node state machine, the failover blocklist and the clouds.

API request handlers import nothing from here but what they enqueue; everything in this package
runs in Celery workers (or in tests that drive a tick by hand).
"""
