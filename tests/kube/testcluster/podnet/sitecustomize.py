"""The test kubelet's stand-in for a pod's own network namespace (see ``kubelet.py``).

In a pod, binding the wildcard address binds the pod's own address.  Here pods
share the host's network, so binds to ``0.0.0.0`` / ``*`` become binds to the
pod's loopback address ``TESTCLUSTER_POD_IP``.  Nothing else changes.
"""

import os

_POD_IP = os.environ.get("TESTCLUSTER_POD_IP")

if _POD_IP:
    import socket

    _socket_bind = socket.socket.bind

    def _bind(self, address):
        if isinstance(address, tuple) and address and address[0] in ("", "0.0.0.0"):
            address = (_POD_IP, *address[1:])
        return _socket_bind(self, address)

    socket.socket.bind = _bind

    try:
        import zmq.sugar.socket as _zmq_socket
    except ImportError:
        _zmq_socket = None
    if _zmq_socket is not None:
        _zmq_bind = _zmq_socket.Socket.bind

        def _zbind(self, addr):
            for wildcard in ("tcp://0.0.0.0:", "tcp://*:"):
                if isinstance(addr, str) and addr.startswith(wildcard):
                    addr = f"tcp://{_POD_IP}:" + addr[len(wildcard):]
            return _zmq_bind(self, addr)

        _zmq_socket.Socket.bind = _zbind
