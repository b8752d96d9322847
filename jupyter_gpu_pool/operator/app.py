"""``python -m jupyter_gpu_pool.operator``: the operator (``run``, the default), the node agent
(``agent``), or the CRDs as YAML (``crds``).

Settings: ``c.GPUPoolOperator.*`` and ``c.GPUPool.profiles`` in
``jupyter_gpu_pool_config.{py,json}`` on the Jupyter config path (in the
cluster: the ConfigMap mounted at ``/etc/jupyter``), then the command line
(``--GPUPoolOperator.sharing=mig``).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import sys

import yaml
from traitlets import Unicode
from traitlets.config import Application

from ..config import GPUPool, load_settings, read_config
from ..cluster.schema import crd_manifests
from .settings import GPUPoolOperator, operator_config, operator_settings

log = logging.getLogger("jupyter_gpu_pool.operator")


class OperatorApp(Application):
    name = "jupyter-gpu-pool-operator"
    description = __doc__
    classes = [GPUPoolOperator, GPUPool]
    kubeconfig = Unicode("", help="A kubeconfig file (default: in-cluster, else KUBECONFIG or ~/.kube/config).").tag(
        config=True)
    liveness_endpoint = Unicode("http://0.0.0.0:8080/healthz", help="kopf's liveness endpoint (empty: none).").tag(
        config=True)
    aliases = {"kubeconfig": "OperatorApp.kubeconfig", "sharing": "GPUPoolOperator.sharing",
               "log-level": "Application.log_level"}

    def initialize(self, argv=None):
        self.parse_command_line(argv)
        cli = copy.deepcopy(self.config)
        files, _ = read_config()
        self.update_config(files)
        self.update_config(cli)
        logging.basicConfig(level=self.log_level, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s %(message)s")
        if self.log_level > logging.DEBUG:  # kopf says "Handler ... succeeded" for every watch event
            logging.getLogger("kopf.objects").setLevel(logging.WARNING)

    def settings(self):
        return operator_settings(operator_config(self.config, parent=self), load_settings(self.config))

    def start(self):
        if self.kubeconfig:  # kopf's login reads it too: as kubernetes_asyncio's default, fixed at its import
            os.environ["KUBECONFIG"] = self.kubeconfig
        from .controller import Controller
        from .handlers import build_registry
        from ..cluster.client import api_client
        from .metrics import OperatorMetrics

        settings = self.settings()

        async def run() -> None:
            api = await api_client(self.kubeconfig)
            metrics = OperatorMetrics()
            if settings.metrics_port:
                from prometheus_client import start_http_server

                start_http_server(settings.metrics_port, registry=metrics.registry)
            controller = Controller(settings, api, metrics)
            log.info("jupyter-gpu-pool operator: sharing %s, profiles %s, %s", settings.sharing.backend,
                     ", ".join(settings.pool.profiles), f"namespaces {', '.join(settings.namespaces)}"
                     if settings.namespaces else "cluster-wide")
            try:
                await kopf_operator(build_registry(controller), settings.namespaces, self.liveness_endpoint)
            finally:
                await api.close()

        asyncio.run(run())


async def kopf_operator(registry, namespaces, liveness_endpoint: str) -> None:
    import kopf

    await kopf.operator(registry=registry, standalone=True, clusterwide=not namespaces,
                        namespaces=list(namespaces), liveness_endpoint=liveness_endpoint or None)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv and not argv[0].startswith("-") else "run"
    if command == "crds":
        print("# The jupyter-gpu-pool CRDs: written by `python -m jupyter_gpu_pool.operator crds`; edit jupyter_gpu_pool/cluster/schema.py, not this.")
        print(yaml.safe_dump_all(crd_manifests(), sort_keys=False), end="")
    elif command == "agent":
        from .agent import AgentApp

        AgentApp.launch_instance(argv)
    elif command == "run":
        app = OperatorApp()
        app.initialize(argv)
        try:
            app.start()
        except Exception as e:
            from ..config import ConfigError

            if isinstance(e, ConfigError):
                app.log.critical("%s", e)
                sys.exit(2)
            raise
    else:
        sys.exit(f"unknown command {command!r}: use run (default), agent or crds")
