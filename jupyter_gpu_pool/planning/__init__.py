"""The capacity planner: replays a pool's use, recorded or synthetic, through the pool's own decisions
in virtual time, and reports waits, refusals, culls, hibernations, GPU-hours and occupancy per GPU
count (``jupyter gpu-pool simulate``; docs/planning.md).

- ``workload``: what users do (sessions of cells, snoozes, readings), whatever its source;
- ``tracefile``: the activity trace's JSON-lines file (read with errors naming the line; written by
  ``jupyter gpu-pool trace export``) and the workload it describes;
- ``synthetic``: generated workloads (a teaching lab, a hub's week), deterministic with a seed;
- ``configuration``: the admin's settings as a replay uses them;
- ``virtual_pool`` and ``simulator`` (with ``agenda``, ``kernels``, ``waiters``, ``culler``): the
  discrete-event replay, calling the pool core's allocation, queue rules, budget accounting,
  ``pool.culling``, ``pool.policy.decide`` and ``pool.residency``, never a copy of them;
- ``metrics``, ``report``: what a replay found, as JSON and as an HTML page with plots.

Everything but ``report`` (matplotlib) and ``cli`` is pure: no file, socket or clock.
"""
