"""Where a client's configuration comes from: credentials, and the server-clock settings.

Why a module of its own: both clients read their credentials from one loader
(:func:`kubernetes_configuration`: a kubeconfig, else the pod's ServiceAccount), and both
build their server-clock estimate from the same environment (:func:`clock_from_env`).
Nothing here talks HTTP. (The CLI's light transport, ``joblease.kube.lite``, reads static
kubeconfig files itself, to avoid importing the ``kubernetes`` package.)
"""

from __future__ import annotations

import os
from typing import Any

from joblease.domain.clock import ServerClock
from joblease.kube.errors import ConfigError
from joblease.kube.requests import MAX_SERVER_SKEW_ENV

CLOCK_TRACK_TTL_ENV = "JOBLEASE_CLOCK_TRACK_TTL"
DEFAULT_TRACK_TTL = 60.0


def clock_from_env(environ: dict[str, str] | None = None) -> ServerClock:
    """Build the server-clock estimate from the environment (``docs/ha.md``).

    ``JOBLEASE_MAX_SERVER_SKEW`` (seconds, default 0): the assumed maximum difference between
    any two API servers' clocks; it is added to every error bound, hence to every margin.
    ``JOBLEASE_CLOCK_TRACK_TTL`` (seconds, default 60): how long a clock that disagreed
    with the others keeps widening the estimate after it was last seen. Why a default
    above zero: after an unexplained disagreement the safe reading is "either may be
    right" for a while, not "the last response is right".

    Raises:
        ValueError: a value is not a number >= 0 (a typo must not silently mean 0).
    """
    env = os.environ if environ is None else environ

    def seconds(name: str, default: float) -> float:
        raw = env.get(name, "").strip()
        try:
            value = float(raw) if raw else default
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
        if value < 0:
            raise ValueError(f"{name}={raw!r} must be >= 0")
        return value

    return ServerClock(max_skew=seconds(MAX_SERVER_SKEW_ENV, 0.0),
                       track_ttl=seconds(CLOCK_TRACK_TTL_ENV, DEFAULT_TRACK_TTL))


def kubernetes_configuration(path: str | None = None, context: str | None = None) -> Any:
    """A ``kubernetes.client.Configuration`` from a kubeconfig, else the pod's ServiceAccount.

    ``path`` (default ``$KUBECONFIG``, then ``~/.kube/config``) and ``context``; only when no
    path was given and no kubeconfig exists, the in-cluster configuration. The one place
    both clients (``KubeApi`` and ``joblease.kube.aioapi``) read their credentials from.
    Blocking (files, and an exec plugin if the kubeconfig names one).

    Raises:
        ConfigError: neither a kubeconfig nor an in-cluster configuration exists, or the
            named one is unusable (the message names what was tried and why it failed).
    """
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    configuration = k8s_client.Configuration()
    try:
        k8s_config.load_kube_config(config_file=path, context=context,
                                    client_configuration=configuration)
    except (k8s_config.ConfigException, OSError, ValueError) as err:
        if path is not None:
            raise ConfigError(f"cannot use the kubeconfig {path!r}"
                              f"{f' (context {context!r})' if context else ''}: {err}") from err
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException as incluster:
            raise ConfigError(f"no Kubernetes configuration: no usable kubeconfig ($KUBECONFIG"
                              f" or ~/.kube/config: {err}) and not in a pod ({incluster})"
                              ) from incluster
    return configuration
