"""jupyter_server extension of the GPU pool (see ``app.GPUPoolExtension``)."""
