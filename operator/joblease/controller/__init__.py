"""The operator: marks expiry, initializes and garbage-collects JobLeases, posts Events.

It writes to a JobLease only for a real transition (initialize, expire, fail, TTL delete),
always as a compare-and-swap through ``joblease.kube.transact``: no kopf annotations,
finalizers or status fields, which would bump ``resourceVersion`` and fail workers'
conditional writes with 409 for no reason. Several replicas may run at once; CAS makes
their writes safe, so no leader election is needed for correctness.
"""
