"""A Kubernetes test cluster in one process, for this project's tests only.

No kube-apiserver can be installed where our tests run, so this package stands
in for one: an API server (``apiserver.py`` + ``store.py``, ``schemas.py``, ``watches.py``,
``garbage.py``) that speaks the Kubernetes REST and watch protocol closely enough for
``kubernetes_asyncio`` and kopf to run against it unchanged, a scheduler (``scheduler.py``), a kubelet
(``kubelet.py``) that "runs" a pod by starting its container's command as a
local process, and hollow nodes (``hollow.py``) whose kubelet marks pods Running without running them,
for hundreds or thousands of kernels.  Run it with ``python -m testcluster`` (see ``__main__.py``).

Why not KMock: its ``KubernetesEmulator`` stores objects and streams watches,
but has no resource versions (lists answer ``"..."``, so a watch cannot resume),
no status subresource, no label or field selectors, no owner-reference garbage
collection, no generation, uid or timestamps, and no validation.  The operator
and provisioner lean on every one of those, and a server that quietly accepts
what a real one refuses would let bugs through.  Extending it would have meant
replacing most of it, so this is a small server of our own on aiohttp.

What it does as a real API server does:

- REST paths for core/v1 and ``/apis/<group>/<version>``, namespaced and
  cluster-wide; discovery (``/api``, ``/apis``, resource lists with
  subresources); ``kind: Status`` errors with the real reasons and codes
  (404 NotFound, 409 AlreadyExists / Conflict, 410 Expired, 415, 422 Invalid).
- One resourceVersion counter; list + watch with ``resourceVersion`` resume,
  ``410 Gone`` past the kept history, ``timeoutSeconds``, bookmarks,
  ``sendInitialEvents``; objects moving in or out of a watch's selectors arrive
  as ADDED / DELETED.
- Label selectors (``=``, ``!=``, ``in``, ``notin``, exists) and field selectors,
  refusing fields the real server does not index for the kind.
- Merge patch and JSON patch (with ``test``), ``metadata.resourceVersion``
  preconditions (409 Conflict on an older one: in a merge patch, in what a JSON
  patch leaves, in a replace; on ``/status`` too), uid / creationTimestamp /
  generation, ``generateName``;
  Secrets' ``stringData`` folded into ``data``; a namespace must exist.
- CustomResourceDefinitions are served as soon as they are created; custom
  objects are pruned and validated against the CRD's ``openAPIV3Schema``, and the
  status subresource splits writes as a real server does (status is dropped on
  create and on main-resource writes, and only status is written through
  ``/status``).
- Built-in objects are validated against the real Kubernetes schemas
  (``kubernetes-validate``, strict: an unknown field is refused), and stored as
  a real server's encoding stores them: without empty lists (``omitempty``), with
  every ``Quantity`` in its canonical form (``10240Mi`` is stored as ``10Gi``), and
  without the fields of a feature gate that is off (``--feature-gates``, 1.34's
  defaults: DRAConsumableCapacity off drops consumable capacity).
- The ResourceQuota admission of pods (``quota.py``): a pod that would take its
  namespace over a quota's ``spec.hard`` (``pods``, ``count/pods``, cpu and
  memory, ``requests.nvidia.com/gpu``) is refused with 403 Forbidden in the
  real server's words ("exceeded quota: ..."), and ``status.used`` follows.
- Lists are paged (``limit``, ``continue``, ``remainingItemCount``).
- Enough kinds (Deployments, DaemonSets, Services, RBAC) and discovery for the
  real ``kubectl apply -k`` of the deployment.
- Dynamic Resource Allocation (``resource.k8s.io/v1``): see ``dra.py``.
- An audit log of every resource request, by bearer token
  (``GET /testcluster/audit``), to compare what each client does with the
  RBAC it is granted; each entry says when it came (``at``) and how long the
  server took to answer it once its loop took it up (``took``; none for a watch).
- Deletion: finalizers and ``deletionTimestamp``; graceful deletion of running
  pods (the kubelet stops them); propagation ``Background`` / ``Foreground`` /
  ``Orphan`` through owner references by a garbage collector (owners matched by uid), after a delay
  where one is set (``--gc-delay``: a real collector acts seconds after the owner went); terminating
  namespaces empty themselves.  A pod's ``eviction`` subresource (what
  ``kubectl drain`` sends after cordoning the node) deletes it gracefully; no
  PodDisruptionBudgets are modelled.  An object on its way out (a pod in its grace period, a dependent
  the collector has not reached) still holds its name: a POST of that name answers 409 AlreadyExists.
- With ``--pid1``, a container's process is treated as its PID 1: a SIGTERM it has no handler for does
  nothing, so its pod takes its whole grace period and is killed (137), as a kernel pod is on a node.
- A restart with its state kept (the ``restart`` fault): connections closed, nothing listening for a
  while, then the same address with a compacted history (a watch resuming from before gets a 410).

Where it differs (and so what these tests cannot show):

- No authentication and no authorization: RBAC is not enforced.  The RBAC
  manifests are checked against the real schemas, and what they grant is
  compared with the audit log of what each client asked.
- Validation is the OpenAPI schema only: none of the server's hand-written
  validation (immutability of pod specs, name formats beyond the schema, CEL
  ``x-kubernetes-validations``), no admission plugins but ResourceQuota for pods
  (``quota.py``), no defaulting beyond a
  pod's ``restartPolicy``, ``terminationGracePeriodSeconds``, ``schedulerName``,
  ``dnsPolicy``, and a custom object's pruning.
- A strategic merge patch is applied as a JSON merge patch (lists replaced,
  not merged by key); server-side apply and ``dryRun`` are refused; no
  OpenAPI documents are served (``kubectl`` runs with ``--validate=false``).
- A ``continue`` token lists the current state from an offset, not the
  snapshot of the first page.
- The history kept for watch resumption is the last 100,000 writes, not a time window.
- The garbage collector sweeps every 0.25 s (plus its delay); the real one reacts to events.
- Scheduling, the kubelet and DRA are simplified; see ``scheduler.py``,
  ``kubelet.py`` and ``dra.py`` for exactly how.  Killed, the server keeps no
  state: started again on its address (``--port``), it is a fresh cluster (the ``restart`` fault keeps it).
  ``--reusable``: a test suite runs cluster after cluster in one process (``__main__.py``), each run a new state
  on a new port, the last run's pods killed and its connections closed before it.
  The scheduler and kubelets read and write the store in-process, not over HTTP (their writes still bump
  resource versions and reach every watch), and go on working while a ``restart`` has the HTTP face down.
- The store keeps every object in memory, indexed by resource, uid and owner; the cluster's own
  components (scheduler, kubelets, claim controller) read stored objects without copying them, and
  built-in schemas are compiled once per kind, so that thousands of pods do not make the cluster the
  bottleneck of what is measured against it (``benchmarks/operator_burst.py`` reports its CPU).
"""
