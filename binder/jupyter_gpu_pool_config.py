# The demo pool of the Binder image (postBuild copies this file to <env>/etc/jupyter/).
#
# NO GPU IS NEEDED OR USED. The pool's GPUs are DECLARED: two 40 GiB "Demo GPU"s exist only
# in the ledger. Kernels take real slices of them (quota, placement, queue, idle policy and
# UI all work as on real GPUs) but hold no GPU memory, and no CUDA code can run. Idle kernels
# hibernate as on real GPUs, marked "declared: no GPU memory to move": the kernel keeps its
# variables and gives its slice back, and the next cell takes a slice again.

c = get_config()  # noqa: F821  (traitlets config file)

c.GPUPool.gpu_discovery = "declared"
c.GPUPool.inventory = [{"name": "Demo GPU", "memory": "40GiB", "sm_count": 108, "count": 2}]

c.GPUPool.profiles = {
    "gpu-10g": {"slice": "10GiB", "isolation": "soft", "display_name": "GPU 10 GiB",
                "description": "10 GiB of a declared demo GPU"},
    "gpu-20g": {"slice": "20GiB", "isolation": "soft", "display_name": "GPU 20 GiB",
                "description": "20 GiB of a declared demo GPU"},
}

# Each user may hold 30 GiB in at most 2 kernels: a third kernel is refused with a message.
c.GPUPool.default_user_quota = {"memory": "30GiB", "kernels": 2}
c.GPUPool.unix_groups = False

# A short idle policy, so that the demo shows a warning, Keep alive and a hibernation within
# minutes: warned after 90 s idle, hibernated after 3 min (run a cell to resume); one Keep alive of
# 3 min; a kernel hibernated for 30 min is shut down. The tour's kernel takes its slice when it starts
# (slice_at "start"), as the tour describes; "first-cell" (the default) would take it at its first cell.
c.GPUPool.policy = [{
    "name": "binder-demo",
    "idle_timeout": "3m",
    "gpu_idle_timeout": None,
    "warn": "90s",
    "snooze": "3m",
    "max_snoozes": 1,
    "max_hibernated": "30m",
    "action": "hibernate",
    "slice_at": "start",
}]

c.GPUPoolExtension.cull_interval = 5.0
c.GPUPoolExtension.telemetry_interval = 5.0
