"""A real Kubernetes control plane on 127.0.0.1, built from upstream Go modules.

``build`` makes (or finds) the binaries, ``certs`` the certificates, ``process`` runs one
server, ``cluster`` composes them into :class:`LocalCluster`, ``cli`` is the
``joblease-localcluster`` command (``build``, ``up|down|env``, ``demo``), ``crd`` finds the
JobLease CRD shipped in this package.

A distribution of its own (``joblease-localcluster``), apart from the product the way
envtest lives apart from controller-runtime: the tests, the demo and the benchmarks depend
on it; the ``joblease`` package and the operator image never contain or import it.
"""
