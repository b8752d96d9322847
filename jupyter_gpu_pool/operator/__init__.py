"""The Kubernetes operator: each GPU kernel its own pod on a GPU slice.

``sharing`` (a profile as resources or a device claim, per GPU sharing backend),
``admission`` (quotas), ``manifests`` (Secret, Pod, NetworkPolicy, DRA claim
templates), ``diagnosis`` (pod state in the user's words), ``controller`` (the
reconcile, and the kernel-pod watch), ``handlers`` (kopf), ``agent`` (the node
agent), ``settings``, ``app`` (``python -m jupyter_gpu_pool.operator``).  The
custom resources themselves, shared with users' servers, are in
``jupyter_gpu_pool.cluster``.  See docs/kubernetes.md.
"""
