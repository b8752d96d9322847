"""jupyter-gpu-pool: elastic GPU kernels for Jupyter."""

__version__ = "0.1.0"


def _jupyter_server_extension_points():
    return [{"module": "jupyter_gpu_pool.server_extension", "app": _app()}]


def _app():
    from .server_extension.app import GPUPoolExtension

    return GPUPoolExtension


def _jupyter_labextension_paths():
    """Where the prebuilt JupyterLab extension lies (``jupyter labextension develop`` links it)."""
    return [{"src": "labextension", "dest": "jupyter-gpu-pool"}]
