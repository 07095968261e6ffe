"""The operator: marks expiry, garbage-collects JobLeases, holds delegated ones, posts Events.

It writes to a JobLease only for a real transition (expire, fail, TTL delete, and the
claims and renewals of pod-delegated leases), never for a new one (the CRD's default
status makes it Available without a write), and always as a compare-and-swap through
``joblease.kube.transact``: no kopf annotations,
finalizers or status fields, which would bump ``resourceVersion`` and fail workers'
conditional writes with 409 for no reason. Several replicas may run at once; CAS makes
their writes safe, so no leader election is needed for correctness.
"""
