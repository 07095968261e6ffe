"""The client protocol once, as sans-IO steps, and the two drivers that perform them.

Every operation a worker performs — claim, resume, wait for a claim, renew, complete,
release, a pool's choose-and-claim and its list+watch feed — is written here once, as a
generator that *yields* what it needs (:mod:`joblease.core.steps`: read, write, server
time, sleep, calibrate, who am I, one list page, one watch) and receives the answer, or
the exception the request raised. Nothing here performs I/O or waits.

Two small drivers perform those steps: :func:`~joblease.core.steps.drive` with the
thread-safe ``KubeApi``/``LeaseStore`` (``joblease.sdk``) and
:func:`~joblease.core.steps.adrive` with the asyncio ``AsyncKubeApi``/``AsyncLeaseStore``
(``joblease.aio``). Neither decides anything, so the sync and the asyncio client cannot
drift apart: what remains written twice is only how they wait (a thread and a condition
against a task and an event).
"""
