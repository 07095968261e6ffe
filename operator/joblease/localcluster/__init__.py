"""A real Kubernetes control plane on 127.0.0.1, built from upstream Go modules.

``build`` makes (or finds) the binaries, ``certs`` the certificates, ``process`` runs one
server, ``cluster`` composes them into :class:`LocalCluster`, ``cli`` exposes
``joblease build`` and ``joblease local-cluster up|down|env``.
"""
