"""Loaded (via PYTHONPATH) only by processes the fault suite runs under libfaketime.

Two work-arounds, neither touching the lease protocol:

* libfaketime 0.9.10 makes ``clock_nanosleep`` (what ``time.sleep`` uses since Python 3.11)
  fail with EINVAL when ``DONT_FAKE_MONOTONIC=1``; sleep with ``select`` instead.
* The local control plane's certificates are minted when it starts, so a process whose wall
  clock is set back by minutes sees them as "not yet valid". TLS needs roughly right wall
  clocks whatever the lease protocol does; the skew runs are about the protocol, so
  certificate *time* checks are switched off (X509_V_FLAG_NO_CHECK_TIME) in these processes
  only; the chain and host name are still verified.
"""

from __future__ import annotations

import os
import select
import ssl
import time

NO_CHECK_TIME = 0x200000  # X509_V_FLAG_NO_CHECK_TIME

if os.environ.get("FAKETIME"):
    def _sleep(seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            select.select([], [], [], left)

    time.sleep = _sleep


    _load = ssl.SSLContext.load_verify_locations

    def _load_verify_locations(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        result = _load(self, *args, **kwargs)
        self.verify_flags |= NO_CHECK_TIME
        return result

    ssl.SSLContext.load_verify_locations = _load_verify_locations  # type: ignore[method-assign]
