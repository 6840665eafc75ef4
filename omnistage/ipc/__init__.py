"""Inter-process plumbing: msgspec messages, tensor-aware serialisation, zmq sockets."""
