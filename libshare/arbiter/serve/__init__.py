"""Serving clients: the gate, hello and requests, share sockets, control commands, metrics."""
