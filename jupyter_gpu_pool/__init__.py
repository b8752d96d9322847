"""jupyter-gpu-pool: elastic GPU kernels for Jupyter."""

__version__ = "0.1.0"


def _jupyter_server_extension_points():
    return [{"module": "jupyter_gpu_pool.server_extension", "app": _app()}]


def _app():
    from .server_extension.app import GPUPoolExtension

    return GPUPoolExtension
