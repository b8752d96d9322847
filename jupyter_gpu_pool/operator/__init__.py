"""The Kubernetes operator: each GPU kernel its own pod on a GPU slice.

``crds`` (the custom resources as data), ``sharing`` (a profile as resources,
per GPU sharing backend), ``admission`` (quotas), ``manifests`` (Secret, Pod,
NetworkPolicy), ``diagnosis`` (pod state in the user's words), ``controller``
(the reconcile), ``handlers`` (kopf), ``agent`` (the node agent), ``app``
(``python -m jupyter_gpu_pool.operator``).  See docs/kubernetes.md.
"""
