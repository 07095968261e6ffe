"""What a pod runs when the operator holds its lease for it (pod delegation).

:mod:`joblease.pod.downward` reads the token the operator writes on the pod as annotations
(``joblease.kube.pods`` names them, ``joblease.domain.token.HeldToken`` is their codec), as
the kubelet shows them in a downward API volume. It needs neither the SDK nor the API
server: a pod's worker reads a file and presents the token to its target's fencing check.
"""
