"""Re-adoption: a server killed and started again serves its running (or hibernated) cluster kernels again.

A server started with the same ``server_id`` finds its GPUKernels still running
(within the operator's heartbeat timeout) and puts each into jupyter_server's
``MappingKernelManager`` as ``start_kernel`` would have, with its state
(variables) intact: the provisioner takes the kernel over
(``load_provisioner_info``: heartbeat, connection from the Secret), and the
kernel manager's bookkeeping is filled in through ``jupyter_gpu_pool.compat``.
"""

from __future__ import annotations

from ...cluster.resources import HIBERNATED, HIBERNATING, LABEL_SERVER, RESUMING, RUNNING, label_value
from ...cluster.session import KernelSession
from ...cluster.settings import GPUPoolKubernetes, kubernetes_settings
from ... import compat


ALIVE = (RUNNING, HIBERNATING, HIBERNATED, RESUMING)  # a hibernated kernel's process lives on: adopted too


async def adopt_kernels(kernel_manager, settings: GPUPoolKubernetes | None = None) -> list[str]:
    """Adopt this server's running kernels (same ``server_id``) into ``kernel_manager``; their ids."""
    from jupyter_client.provisioning import KernelProvisionerFactory as KPF
    from jupyter_server._tz import utcnow

    settings = settings or kubernetes_settings(kernel_manager.config)
    session = await KernelSession.get(settings)
    adopted = []
    mine = label_value(settings.server_id)
    for name, body in list(session.kernels.items()):
        spec, st = body.get("spec") or {}, body.get("status") or {}
        kernel_id = spec.get("kernelId")
        if (body["metadata"].get("labels") or {}).get(LABEL_SERVER) != mine:
            continue  # another server's kernel
        if not kernel_id or kernel_id in kernel_manager or st.get("phase") not in ALIVE:
            continue
        km = kernel_manager.kernel_manager_factory(parent=kernel_manager, log=kernel_manager.log,
                                                   kernel_name=spec.get("kernelName") or "")
        km.kernel_id = kernel_id
        try:
            km.provisioner = KPF.instance(parent=kernel_manager.parent).create_provisioner_instance(
                kernel_id, km.kernel_spec, parent=km)
            await km.provisioner.load_provisioner_info(
                {"kernel_id": kernel_id, "connection_info": {},
                 "gpu_pool_kubernetes": {"name": name, "profile": spec.get("profile", "")}})
        except Exception as e:
            kernel_manager.log.warning("could not adopt GPU kernel %s: %s", kernel_id, e)
            continue
        km.load_connection_info(km.provisioner.connection_info)
        km.kernel_spec.interrupt_mode = "message"
        km.ready.set_result(None)
        km.last_activity = utcnow()
        km.execution_state = "idle"
        km.reason = ""
        km.start_restarter()
        compat.control_socket(km)
        compat.register_kernel(kernel_manager, kernel_id, km)
        compat.track_connections(kernel_manager, kernel_id, km.ports)
        kernel_manager.start_watching_activity(kernel_id)
        kernel_manager.add_restart_callback(kernel_id, compat.kernel_died_callback(kernel_manager, kernel_id), "dead")
        adopted.append(kernel_id)
        kernel_manager.log.info("adopted GPU kernel %s (GPUKernel %s/%s, pod %s)", kernel_id, session.namespace,
                                name, km.provisioner.pod)
    return adopted
