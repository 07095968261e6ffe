"""Who a client writes as: the default holder name and the random id of each claim.

Shared by the thread-based SDK and ``joblease.aio`` (the username the API server knows a
client by comes from ``whoami`` on either client).
"""

from __future__ import annotations

import os
import socket
import uuid


def default_holder() -> str:
    """The holder used when none is given: ``$JOBLEASE_HOLDER``, else ``host-pid``."""
    return os.environ.get("JOBLEASE_HOLDER") or f"{socket.gethostname()}-{os.getpid()}"


def new_claim_id() -> str:
    """A random id for one claim (128 bits: never repeats in practice)."""
    return uuid.uuid4().hex
