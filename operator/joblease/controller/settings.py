"""The operator's configuration: read once from flags and environment, validated, frozen.

Why one object: the settings used to be read in three places (``kube/api.py``,
``controller/handlers.py``, ``main.py`` setting a module global), each with its own idea of
a bad value (``int("4x")`` crashed with a bare ``ValueError`` long after start, ``0`` writers
silently became 1). Here every setting is parsed once, at start, by one table
(``SETTINGS``): a bad value stops the operator before it watches anything, with an error
that names the flag or environment variable and the value it was given. A typo never
silently means a default: an unparsable value, a value out of range, a flag and its
variable that disagree, and a ``JOBLEASE_…`` variable whose name is one typo away from a
setting's are all refused.

Where a setting comes from, first match wins: its command-line flag, its environment
variable (only the four that existed before the flags, kept for ``extraEnv`` users), the
default. The chart renders flags (``charts/joblease-operator``, ``operator.*`` values).
"""

from __future__ import annotations

import argparse
import difflib
import ipaddress
import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from joblease.domain.clock import ServerClock
from joblease.domain.errors import JobleaseError
from joblease.domain.time import DEFAULT_MARGIN
from joblease.kube.api import CLOCK_TRACK_TTL_ENV, DEFAULT_TRACK_TTL, MAX_SERVER_SKEW_ENV

MARGIN_ENV = "JOBLEASE_MARGIN_SECONDS"
WRITERS_ENV = "JOBLEASE_OPERATOR_WRITERS"
DISPATCH_POOLS_ENV = "JOBLEASE_DISPATCH_POOLS"
KUBECONFIG_ENV = "KUBECONFIG"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
MAX_WRITERS = 64
# 8, not 4: each expiry is a read and a conditional write, so the writers mostly wait on the
# API server; 500 due at once on a shared 2-CPU machine expired at 35-42/s with 4 and 51-79/s
# with 8 (p99 13.3-14.7 s against 6.4-9.2 s; docs/benchmarks.md, issue 28).
DEFAULT_WRITERS = 8
# A kopf namespace pattern: an exact name (a DNS-1123 label), or a glob with * and ?,
# optionally negated with a leading "!". Anything else watches nothing, silently.
_NAMESPACE = re.compile(r"^!?[a-z0-9*?]([-a-z0-9*?]{0,61}[a-z0-9*?])?$")
_HOST = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9.]{0,251}[A-Za-z0-9])?$")


class SettingsError(JobleaseError, ValueError):
    """A setting given on the command line or in the environment is not valid.

    Attributes:
        source: Where it came from: the flag (``--writers``) or the variable
            (``JOBLEASE_OPERATOR_WRITERS``).
        value: The value as given (text), so the message shows exactly what was typed.
        reason: What is wrong with it and what is accepted.
    """

    def __init__(self, source: str, value: str, reason: str) -> None:
        super().__init__(f"{source}={value!r}: {reason}")
        self.source, self.value, self.reason = source, value, reason


def _seconds(*, minimum: float, exclusive: bool = False) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError("not a number of seconds") from None
        if not math.isfinite(value):
            raise ValueError("must be a finite number of seconds")
        if value < minimum or (exclusive and value == minimum):
            raise ValueError(f"must be {'>' if exclusive else '>='} {minimum:g}")
        return value
    return parse


def _int_range(low: int, high: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError("not a whole number") from None
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}")
        return value
    return parse


def _host(raw: str) -> str:
    """An IP address or a host name (no port, no scheme)."""
    host = raw.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOST.match(host):
            raise ValueError("not an IP address or host name") from None
    return host


def _health_addr(raw: str) -> str:
    """``host:port`` of kopf's /healthz, or ``''`` for none; port 0 means any free port."""
    if raw == "":
        return ""
    host, sep, port = raw.rpartition(":")
    if not sep or not host:
        raise ValueError("must be HOST:PORT (e.g. 0.0.0.0:8081), or empty to turn it off")
    _host(host)
    _int_range(0, 65535)(port)
    return raw


def _health_file(raw: str) -> Path:
    if not raw.strip():
        raise ValueError("must be a file path (omit the flag for no heartbeat file)")
    return Path(raw)


def _namespace(raw: str) -> str:
    if not _NAMESPACE.match(raw):
        raise ValueError("not a namespace name (lowercase letters, digits and '-', at most "
                         "63) or a kopf pattern of one ('*', '?', a leading '!')")
    return raw


def _dispatch_pools(raw: str) -> str:
    """``NAMESPACE/SELECTOR;…``: the pools this operator dispatches (issue 30); kept as text."""
    for entry in filter(None, (part.strip() for part in raw.split(";"))):
        namespace, slash, selector = entry.partition("/")
        if not slash or not selector.strip():
            raise ValueError(f"{entry!r} is not NAMESPACE/SELECTOR (entries separated by ';')")
        _namespace(namespace)
    return raw


def dispatch_pools(raw: str) -> tuple[tuple[str, str], ...]:
    """The ``(namespace, selector)`` pairs of a valid ``--dispatch-pools`` value."""
    pairs = []
    for entry in filter(None, (part.strip() for part in _dispatch_pools(raw).split(";"))):
        namespace, _, selector = entry.partition("/")
        pairs.append((namespace, selector.strip()))
    return tuple(pairs)


def _log_level(raw: str) -> str:
    level = raw.strip().upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
    return level


@dataclass(frozen=True)
class _Setting:
    """How one field of :class:`OperatorSettings` is given and parsed."""

    field: str
    flag: str
    parse: Callable[[str], Any]
    env: str | None = None
    help: str = ""
    metavar: str | None = None


SETTINGS: tuple[_Setting, ...] = (
    _Setting("metrics_addr", "--metrics-addr", _host,
             help="address for /metrics (0.0.0.0 in a pod; default 127.0.0.1)"),
    _Setting("metrics_port", "--metrics-port", _int_range(0, 65535),
             help="port for Prometheus /metrics (0 disables; default 8080)"),
    _Setting("health_addr", "--health-addr", _health_addr,
             help="host:port of the kopf liveness endpoint /healthz ('' turns it off; "
                  "default 127.0.0.1:8081)"),
    _Setting("health_file", "--health-file", _health_file,
             help="touch this file after every reconcile pass, for exec probes (replicas "
                  "sharing one host network cannot each own a port)"),
    _Setting("margin_seconds", "--margin-seconds", _seconds(minimum=0), MARGIN_ENV,
             help="expiry safety margin in seconds, added to the clock estimate's error "
                  f"bound (default {DEFAULT_MARGIN.total_seconds():g}; also ${MARGIN_ENV})",
             metavar="SECONDS"),
    _Setting("writers", "--writers", _int_range(1, MAX_WRITERS), WRITERS_ENV,
             help="threads that write one pass's due transitions (1 writes them in line; "
                  f"default {DEFAULT_WRITERS}; also ${WRITERS_ENV})", metavar="N"),
    _Setting("max_server_skew", "--max-server-skew", _seconds(minimum=0),
             MAX_SERVER_SKEW_ENV,
             help="assumed maximum difference between API servers' clocks in seconds, "
                  f"docs/ha.md (default 0; also ${MAX_SERVER_SKEW_ENV})", metavar="SECONDS"),
    _Setting("clock_track_ttl", "--clock-track-ttl", _seconds(minimum=0),
             CLOCK_TRACK_TTL_ENV,
             help="seconds a disagreeing server clock keeps widening the estimate, "
                  f"docs/ha.md (default {DEFAULT_TRACK_TTL:g}; also ${CLOCK_TRACK_TTL_ENV})",
             metavar="SECONDS"),
    _Setting("dispatch_pools", "--dispatch-pools", _dispatch_pools, DISPATCH_POOLS_ENV,
             help="dispatch these work pools, NAMESPACE/SELECTOR separated by ';' (one "
                  "replica at a time per pool, by a coordination Lease; docs/pools.md; also "
                  f"${DISPATCH_POOLS_ENV})", metavar="POOLS"),
    _Setting("log_level", "--log-level", _log_level, metavar="LEVEL",
             help=f"{', '.join(LOG_LEVELS)} (default INFO; --verbose means DEBUG)"),
)


@dataclass(frozen=True)
class OperatorSettings:
    """Everything one operator run is configured with; valid by construction.

    Build it with :meth:`from_args` (flags + environment) or directly (tests); either way
    ``__post_init__`` checks every value, naming the flag that sets it.

    Attributes:
        namespaces: Watch only these (kopf patterns); empty means every namespace.
        metrics_addr: Address of the Prometheus endpoint.
        metrics_port: Its port; 0 serves no metrics.
        health_addr: ``host:port`` of kopf's /healthz; ``''`` for none.
        health_file: File touched after every reconcile pass (exec probes), or None.
        margin_seconds: Expiry safety margin, before the clock estimate's error is added.
        writers: Threads writing one pass's due transitions.
        max_server_skew: Assumed maximum difference between API servers' clocks, seconds.
        clock_track_ttl: How long a disagreeing server clock widens the estimate, seconds.
        log_level: One of ``LOG_LEVELS``.
        dispatch_pools: The work pools this operator dispatches (``NAMESPACE/SELECTOR;…``,
            :func:`dispatch_pools`); empty: none, their workers take turns.
        kubeconfig: Kubeconfig file (``$KUBECONFIG``); None: the default, or in-cluster.
    """

    namespaces: tuple[str, ...] = ()
    metrics_addr: str = "127.0.0.1"
    metrics_port: int = 8080
    health_addr: str = "127.0.0.1:8081"
    health_file: Path | None = None
    margin_seconds: float = DEFAULT_MARGIN.total_seconds()  # the holders' default too
    writers: int = DEFAULT_WRITERS
    max_server_skew: float = 0.0
    clock_track_ttl: float = DEFAULT_TRACK_TTL
    log_level: str = "INFO"
    dispatch_pools: str = ""
    kubeconfig: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for setting in SETTINGS:
            value = getattr(self, setting.field)
            if value is None:
                continue
            raw = str(value)
            try:
                parsed = setting.parse(raw)
            except ValueError as err:
                raise SettingsError(setting.flag, raw, str(err)) from None
            if setting.field == "log_level" and parsed != value:
                raise SettingsError(setting.flag, raw, f"must be one of {', '.join(LOG_LEVELS)}")
        for namespace in self.namespaces:
            try:
                _namespace(namespace)
            except ValueError as err:
                raise SettingsError("--namespace", namespace, str(err)) from None
        if len(set(self.namespaces)) != len(self.namespaces):
            raise SettingsError("--namespace", ",".join(self.namespaces),
                                "a namespace is given more than once")

    @classmethod
    def from_args(cls, args: argparse.Namespace,
                  environ: Mapping[str, str] | None = None) -> OperatorSettings:
        """Build the settings from parsed flags (:func:`add_arguments`) and the environment.

        Args:
            args: The parsed command line; a flag left out is ``None``.
            environ: The environment (default ``os.environ``), read here and nowhere else.

        Raises:
            SettingsError: A value is invalid, a flag and its variable disagree, or a
                ``JOBLEASE_…`` variable looks like a misspelt setting.
        """
        env = os.environ if environ is None else environ
        _refuse_misspelt(env)
        values: dict[str, Any] = {}
        for setting in SETTINGS:
            flag_raw: str | None = getattr(args, setting.field, None)
            env_raw = env.get(setting.env, "").strip() if setting.env else ""
            from_flag = None if flag_raw is None else _parse(setting, setting.flag, flag_raw)
            from_env = (_parse(setting, setting.env, env_raw)
                        if setting.env and env_raw else None)
            if from_flag is not None and from_env is not None and from_flag != from_env:
                raise SettingsError(
                    setting.flag, str(flag_raw),
                    f"disagrees with {setting.env}={env_raw!r}; set only one of them")
            chosen = from_flag if from_flag is not None else from_env
            if chosen is not None:
                values[setting.field] = chosen
        if getattr(args, "verbose", False):
            if values.get("log_level", "DEBUG") != "DEBUG":
                raise SettingsError("--log-level", str(args.log_level),
                                    "contradicts --verbose (which means DEBUG); give one")
            values["log_level"] = "DEBUG"
        namespaces = tuple(getattr(args, "namespace", None) or ())
        kubeconfig = env.get(KUBECONFIG_ENV) or None
        return cls(namespaces=namespaces, kubeconfig=kubeconfig, **values)

    @property
    def margin(self) -> timedelta:
        """The configured margin (the clock estimate's error is added at start)."""
        return timedelta(seconds=self.margin_seconds)

    @property
    def clusterwide(self) -> bool:
        """Whether kopf watches every namespace (no ``--namespace`` given)."""
        return not self.namespaces

    @property
    def liveness_endpoint(self) -> str | None:
        """The URL of kopf's liveness endpoint, or None when ``--health-addr=''``."""
        return f"http://{self.health_addr}/healthz" if self.health_addr else None

    @property
    def logging_level(self) -> int:
        """``log_level`` as a ``logging`` constant."""
        return int(logging.getLevelName(self.log_level))

    def server_clock(self) -> ServerClock:
        """A fresh server-clock estimate with this run's skew allowance and track TTL."""
        return ServerClock(max_skew=self.max_server_skew, track_ttl=self.clock_track_ttl)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the operator's flags (``joblease operator`` and ``python -m joblease``).

    Every flag is read as text and parsed by :meth:`OperatorSettings.from_args`, so that a
    bad value gets the same precise error from a flag as from its environment variable,
    and a flag left out (``None``) can fall back to the variable.
    """
    for setting in SETTINGS:
        parser.add_argument(setting.flag, dest=setting.field, default=None, action=_Once,
                            metavar=setting.metavar, help=setting.help)
    parser.add_argument("--namespace", action="append", default=[],
                        help="watch only this namespace (repeatable; default: all)")
    parser.add_argument("--verbose", action="store_true", help="the same as --log-level=DEBUG")


class _Once(argparse.Action):
    """Store a flag's value, refusing a second, different one (argparse keeps the last).

    Why: ``--writers=4 … --writers=8`` (a chart value plus an extra argument) would
    otherwise mean 8 without a word.
    """

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        previous = getattr(namespace, self.dest, None)
        if previous is not None and previous != values:
            raise argparse.ArgumentError(self, f"given twice: {previous!r}, then {values!r}")
        setattr(namespace, self.dest, values)


def _parse(setting: _Setting, source: str, raw: str) -> Any:
    try:
        return setting.parse(raw)
    except ValueError as err:
        raise SettingsError(source, raw, str(err)) from None


def _refuse_misspelt(env: Mapping[str, str]) -> None:
    """Refuse a ``JOBLEASE_…`` variable one typo away from a setting's (it would be ignored)."""
    known = [s.env for s in SETTINGS if s.env]
    for name in env:
        if name in known or not name.upper().startswith("JOBLEASE_"):
            continue
        close = difflib.get_close_matches(name.upper(), known, n=1, cutoff=0.8)
        if close:
            raise SettingsError(name, env[name], f"not a setting (ignored if allowed); "
                                f"did you mean {close[0]}?")
