"""The custom-resource contract between users' Jupyter servers and the operator.

One package that the ``gpu-pool-kubernetes`` provisioner, the server
extension's cluster backend and the operator all import (and which imports
none of them):

- ``resources``: the API group, kinds, labels, annotations, phases, reasons and
  object names (a kernel's pod, Secret, NetworkPolicy);
- ``schema``: the CustomResourceDefinitions (``deploy/base/crds.yaml``);
- ``kernels``: reading a GPUKernel, and a kernel as the pool core's ``Lease``;
- ``quotas``: GPUQuota objects as the pool core's ``QuotaBook``;
- ``client``: API clients that keep response bodies (a Secret is a key) out of logs;
- ``watch``: list + watch that survives any transport error, with back-off;
- ``settings`` and ``session``: a server's settings, and its shared watch of
  its namespace's GPUKernels with the heartbeat on its own.

See docs/kubernetes.md.
"""
