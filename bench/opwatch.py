"""Watching the operator from outside, the same way for every version of it.

The scale section (bench/scale.py) and ``bench.opmem`` must measure today's operator (which
initializes every new JobLease with a status write) and one whose JobLeases are born with a
defaulted status (which writes nothing per creation). So nothing here reads a counter that
only one of them moves:

* **caught up** = every JobLease in the namespace has a visible ``status.phase`` (judged by
  kube-apiserver: a ``status.phase=`` field selector finds none without one) *and* the
  operator knows all of them (the sum of its ``joblease_leases`` gauge, which both versions
  export);
* **idle** = the operator's process used less than :data:`IDLE_CPU` CPU-seconds per second
  over :data:`QUIET_WINDOWS` consecutive windows of :data:`WINDOW` seconds (``/proc``);
* **time to a visible status** = for a sample of the JobLeases (labelled
  :data:`SAMPLE_LABEL`, about :data:`SAMPLES` of them), the time from the creating POST's
  answer to the first read that shows ``status.phase``: 0 when the POST's answer itself
  shows it (a status defaulted by the CRD), else the arrival of the first watch event with
  it (a label-selected watch, so the bench decodes only the samples' events).

CPU comes from ``/proc/PID/stat`` and RSS from ``/proc/PID/status``: reading them costs the
operator nothing, unlike a scrape of its ``/metrics`` (whose overdue gauge walks every
lease), so scrapes are kept to one per window and only where a phase needs one.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from tests.support.operator_process import OperatorProcess

from bench.common import (
    proc_cpu_seconds,
    proc_rss_mb,
    progress,
    reset_peak_rss,
    summary,
)
from joblease.kube.api import ApiError, KubeApi
from joblease.kube.leases import lease_path

IDLE_CPU = 0.2  # CPU-s per s: below this the operator counts as idle (a pass at 100,000
# cost 0.075 s today; the bound is generous on purpose, it only ends a wait)
WINDOW = 2.0  # seconds per idle window
QUIET_WINDOWS = 2  # consecutive idle windows that make "idle"
SAMPLES = 500  # JobLeases whose time to a visible status is measured
SAMPLE_LABEL = "bench-visible"
REQUEST_RESOURCES = ("jobleases", "events", "pods")  # what the operator reads and writes


class Operator(OperatorProcess):
    """The operator process (``tests/support``'s) plus what the bench reads from it."""

    def __init__(self, kubeconfig: str, log: Path, namespace: str,
                 extra_env: dict[str, str] | None = None) -> None:
        super().__init__(kubeconfig, log, namespaces=[namespace], extra_env=extra_env)
        self.started = 0.0
        self.peak_rss_mb = 0.0

    def launch(self, timeout: float = 180) -> float:
        """Start a new process and wait for its /healthz; the seconds that took."""
        self.peak_rss_mb = 0.0
        self.started = time.monotonic()
        self.start(wait=True, timeout=timeout)
        return time.monotonic() - self.started

    def metrics(self) -> dict[str, float]:
        """The operator's metrics, or nothing while it does not answer."""
        try:
            return super().metrics()
        except OSError:
            return {}

    def rss_mb(self) -> tuple[float, float]:
        """(VmRSS, VmHWM) in MB; the peak seen since :meth:`new_peak` is kept."""
        rss, hwm = proc_rss_mb(self.pid)
        self.peak_rss_mb = max(self.peak_rss_mb, hwm, rss)
        return rss, hwm

    def new_peak(self) -> bool:
        """Start a phase's own peak: reset ``VmHWM`` (see ``reset_peak_rss``)."""
        reset = reset_peak_rss(self.pid)
        self.peak_rss_mb = 0.0
        self.rss_mb()
        return reset

    def cpu(self) -> float:
        """CPU seconds the current process has used."""
        return proc_cpu_seconds(self.pid)

    def writes(self, kind: str | None = None) -> float:
        """Its ``joblease_operator_writes_total`` (of one kind, or all)."""
        return sum(v for k, v in self.metrics().items()
                   if k.startswith("joblease_operator_writes_total{")
                   and (kind is None or f'kind="{kind}"' in k))

    def known(self) -> float | None:
        """How many JobLeases it knows (its ``joblease_leases`` gauge), ``None`` if unread."""
        values = self.metrics()
        known = [v for k, v in values.items() if k.startswith("joblease_leases{")]
        return sum(known) if known else None

    def phase_count(self, phase: str) -> float | None:
        """How many JobLeases in ``phase`` it knows (``None`` if unread)."""
        return self.metrics().get(f'joblease_leases{{phase="{phase}"}}')

    def alive(self) -> None:
        """Raise if the process has exited (a wait must not outlive it)."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"the operator exited {self.proc.returncode}: "
                               f"{self.output(2000)}")


def wait_idle(op: Operator, leases: int, timeout: float, what: str) -> dict[str, Any]:
    """Wait until ``op`` knows ``leases`` JobLeases and has been idle; what it took.

    Returns the seconds waited, whether it got there, the CPU-s/s of the last window and the
    RSS. Progress every 10 s. The last :data:`QUIET_WINDOWS` windows are part of the wait.
    """
    began = time.monotonic()
    deadline = began + timeout
    quiet, rate, known = 0, float("nan"), None
    last_cpu, last_t, last_report = op.cpu(), began, began
    while time.monotonic() < deadline:
        time.sleep(WINDOW)
        op.alive()
        cpu, now = op.cpu(), time.monotonic()
        rate = (cpu - last_cpu) / max(now - last_t, 1e-9)
        last_cpu, last_t = cpu, now
        rss, _ = op.rss_mb()
        if rate < IDLE_CPU:
            if known is None or known < leases:
                known = op.known()
            quiet = quiet + 1 if known is not None and known >= leases else 0
        else:
            quiet = 0
        if now - last_report >= 10:
            last_report = now
            progress(f"scale: {what}: waiting for idle, {now - began:.0f}s, CPU {rate:.2f} "
                     f"CPU-s/s, RSS {rss:.0f} MB, knows {known if known is None else int(known)}"
                     f"/{leases}")
        if quiet >= QUIET_WINDOWS:
            break
    return {"seconds": time.monotonic() - began, "idle": quiet >= QUIET_WINDOWS,
            "last_cpu_per_s": rate, "known": known, "rss_mb": op.rss_mb()[0]}


def idle_cpu(op: Operator, seconds: float) -> dict[str, float]:
    """The operator's CPU over ``seconds`` of nothing to do (no scrape meanwhile).

    Two figures: the whole process's CPU per second (feed, kopf, heartbeat and passes) and
    the mean CPU of one reconcile pass from the operator's own
    ``joblease_reconcile_pass_cpu_seconds`` (scraped just before and just after the
    window, outside the process-CPU reading).
    """
    before = _pass_cpu(op)
    cpu0, t0 = op.cpu(), time.monotonic()
    time.sleep(seconds)
    op.alive()
    cpu, elapsed = op.cpu() - cpu0, time.monotonic() - t0
    after = _pass_cpu(op)
    passes = after[0] - before[0]
    return {"seconds": elapsed, "cpu_s": cpu, "cpu_ms_per_s": 1000 * cpu / elapsed,
            "passes": passes,
            "pass_cpu_ms": 1000 * (after[1] - before[1]) / passes if passes else float("nan")}


def _pass_cpu(op: Operator) -> tuple[float, float]:
    """(passes, CPU-seconds in them) so far, from the operator's histogram."""
    values = op.metrics()
    return (values.get("joblease_reconcile_pass_cpu_seconds_count", 0.0),
            values.get("joblease_reconcile_pass_cpu_seconds_sum", 0.0))


def unstatused(api: KubeApi, namespace: str) -> bool:
    """Whether kube-apiserver still has a JobLease without ``status.phase`` in ``namespace``.

    A ``status.phase=`` field selector (the CRD's selectable field; a missing field
    selects as empty) with ``limit=1``: one request, one object at most. Should the selector
    see the stored object and not its defaulted reading (a status defaulted by the CRD, never
    written), the object it finds shows a phase as served: that one counts as visible.
    """
    body = api.request("GET", lease_path(namespace),
                       query={"fieldSelector": "status.phase=", "limit": "1"}, timeout=60).body
    return any(not (item.get("status") or {}).get("phase") for item in body.get("items", []))


class VisibleSampler:
    """Times, for the labelled sample, creation → first read showing ``status.phase``.

    A thread keeps one label-selected watch open (re-opened when the server ends it) and
    notes when each sample first shows a status. :meth:`created` is told the POST's answer.
    """

    def __init__(self, kubeconfig: str, namespace: str, timeout: float) -> None:
        self._api = KubeApi.from_kubeconfig(kubeconfig)
        self._namespace = namespace
        self._created: dict[str, float] = {}
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stream: Any = None
        self._deadline = time.monotonic() + timeout
        self.lists = 0  # its own LISTs, subtracted from the operator's requests
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="visible-sampler", daemon=True)
        self._thread.start()

    def created(self, name: str, visible: bool) -> None:
        """A sample's POST answered now; ``visible``: its answer already showed a status."""
        now = time.monotonic()
        with self._lock:
            self._created[name] = now
            if visible:
                self._seen[name] = now

    def pending(self) -> int:
        """Samples created but not yet seen with a status."""
        with self._lock:
            return sum(1 for n in self._created if n not in self._seen)

    def stop(self) -> dict[str, Any]:
        """Stop the watch; the lags (s) of the samples, and how many were never seen."""
        self._stop.set()
        if self._stream is not None:
            self._stream.close()
        self._thread.join(30)
        self._api.close()
        with self._lock:
            lags = [max(0.0, self._seen[n] - t) for n, t in self._created.items()
                    if n in self._seen]
            return {"samples": len(self._created), "unseen": len(self._created) - len(lags),
                    "lag_s": summary(lags), "at_creation": sum(1 for x in lags if x == 0.0),
                    "errors": self.errors[:5]}

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            try:
                if not version:
                    self.lists += 1
                    body = self._api.request("GET", lease_path(self._namespace), query={
                        "labelSelector": SAMPLE_LABEL}).body  # the samples only
                    self._note(body.get("items", []))
                    version = body["metadata"]["resourceVersion"]
                self._stream = self._api.watch(lease_path(self._namespace), {
                    "labelSelector": SAMPLE_LABEL, "resourceVersion": version,
                    "timeoutSeconds": "30"}, timeout=45)
                for event in self._stream:
                    obj = event.get("object", {})
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    self._note([obj])
                    if self._stop.is_set():
                        return
            except ApiError as err:  # 410 or the server went away: list again
                self.errors.append(repr(err))
                version = ""
                self._stop.wait(0.5)

    def _note(self, items: list[dict[str, Any]]) -> None:
        now = time.monotonic()
        with self._lock:
            for obj in items:
                name = obj.get("metadata", {}).get("name", "")
                if (obj.get("status") or {}).get("phase") and name not in self._seen:
                    self._seen[name] = now


def operator_requests(before: dict[tuple[str, str, str, str], float],
                      after: dict[tuple[str, str, str, str], float]) -> dict[str, float]:
    """kube-apiserver's requests between two readings, as ``"VERB resource[/sub]"`` counts.

    Only :data:`REQUEST_RESOURCES` (the bench subtracts its own). ``WATCH`` is counted by
    kube-apiserver when a watch *ends*, so it says little; it is left out.
    """
    out: dict[str, float] = {}
    for (verb, resource, sub, _code), value in after.items():
        if resource not in REQUEST_RESOURCES or verb in ("WATCH", "WATCHLIST"):
            continue
        key = f"{verb} {resource}" + (f"/{sub}" if sub else "")
        delta = value - before.get((verb, resource, sub, _code), 0.0)
        if delta:
            out[key] = out.get(key, 0.0) + delta
    return out
