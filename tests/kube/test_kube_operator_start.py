"""The operator as an admin starts it outside the cluster: ``python -m jupyter_gpu_pool.operator run
--kubeconfig FILE``, with no ``KUBECONFIG`` in its environment (``OperatorProcess`` starts it so)."""

from __future__ import annotations

import asyncio

from kube_helpers import operator_ready


async def test_an_operator_given_only_kubeconfig_watches_the_cluster_that_file_names(cluster, operator_factory):
    """kopf's login reads the default kubeconfig of kubernetes_asyncio, fixed when that library is imported: the
    operator must name its file before then, or kopf logs in to another cluster (the user's ~/.kube/config) or to
    none, and its watches never run.  With a sweep only every 300 s, a new GPUKernel is taken up at once only
    through the watch."""
    await operator_factory(cluster, **{"GPUPoolOperator.reconcile_interval": 300.0})  # its first sweep is past
    await asyncio.wait_for(operator_ready(cluster), 20)  # a new probe: the watch takes it up, not a sweep
