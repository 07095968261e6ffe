"""What the CLI's ``run`` and ``work`` drive: commands run under leases, and their watcher.

* :mod:`joblease.engines.runner`: one command under one lease (``joblease run``): its token
  in the environment, renewed while it runs, stopped the moment the lease is lost;
* :mod:`joblease.engines.worker_pool`: a pool worker (``joblease work``): K slots claiming
  the next job of a selector and running each as ``run`` does;
* :mod:`joblease.engines.supervisor`: one watcher process per worker, which stops commands
  by their deadline when the worker itself cannot (SIGKILLed, paused).

Libraries below the CLI, not public API (that is ``joblease``, ``joblease.aio`` and
``joblease.pod``: docs/sdk.md). The CLI imports each only for the verb that needs it.
"""
