"""asyncio-native joblease: claim, renew, complete and release JobLeases, hold one, work a pool.

The same protocol as ``joblease.sdk`` (every decision is ``joblease.domain``'s, the
read–decide–write loop ``joblease.core.transaction``'s), on aiohttp (``AsyncKubeApi``): no
call blocks the event loop and no thread is started per lease. Reference: ``docs/sdk.md``,
"asyncio"::

    from joblease.aio import AsyncLeaseClient

    async with AsyncLeaseClient("default") as client:
        lease = await client.claim("nightly-report", holder="worker-a")
        async with client.hold(lease) as holding:   # renews; cancels this body on loss
            holding.check()
            await send_report(token=lease.token)
            await holding.complete("sent")
"""

from joblease.aio.client import AsyncLease, AsyncLeaseClient
from joblease.aio.hold import AsyncLeaseHolding
from joblease.aio.pool import AsyncPool
from joblease.domain.errors import PoolClosedError, RenewalStoppedError
from joblease.kube.aioapi import AsyncKubeApi

__all__ = ["AsyncKubeApi", "AsyncLease", "AsyncLeaseClient", "AsyncLeaseHolding", "AsyncPool",
           "PoolClosedError", "RenewalStoppedError"]
