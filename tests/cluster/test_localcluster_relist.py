"""``LocalCluster.restart(..., while_down=etcd_compact)`` forces every watch to list again.

The benchmark's forced relist (bench/scale.py) relies on it: a watch resumed from a
resourceVersion taken before the restart must get 410 Gone, whichever client holds it.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

from joblease_localcluster.cluster import LocalCluster


def _get(cluster: LocalCluster, path: str) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    request = urllib.request.Request(
        f"{cluster.server}{path}",
        headers={"Authorization": f"Bearer {cluster.token_for('admin')}"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_a_watch_from_before_a_compacting_restart_is_gone() -> None:
    with LocalCluster() as cluster:
        status, body = _get(cluster, "/api/v1/namespaces/default/configmaps?limit=1")
        assert status == 200, body
        old = json.loads(body)["metadata"]["resourceVersion"]
        # before: the watch from that version is served (it ends after 1 s, no error event)
        status, body = _get(cluster, "/api/v1/namespaces/default/configmaps?watch=true"
                            f"&resourceVersion={old}&timeoutSeconds=1")
        assert status == 200 and b'"code":410' not in body, body
        compacted: list[int] = []
        before = next(p for p in cluster.processes if p.name == "kube-apiserver")
        cluster.restart("kube-apiserver",
                        while_down=lambda: compacted.append(cluster.etcd_compact()))
        assert compacted and compacted[0] > int(old)
        # a graceful restart: the old server exited on its SIGTERM, while the controllers'
        # watches were open (before its watch grace period it waited for them until the
        # stop timeout's SIGKILL, -9: 20 s of every restart)
        assert before.returncode == 0, before.returncode
        status, body = _get(cluster, "/api/v1/namespaces/default/configmaps?watch=true"
                            f"&resourceVersion={old}&timeoutSeconds=1")
        # 410 as the response, or as the stream's ERROR event (kube-apiserver does either)
        assert status == 410 or b'"code":410' in body, (status, body)
