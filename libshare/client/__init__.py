"""The client side of a session, one concept a module (each imports only those listed before it).

- ``exchange.py``: the control socket, one request and its reply, and hello;
- ``attachment.py``: what a session holds of its arbiter (socket, ring, doorbell, the welcome's facts);
- ``gate.py``: the state a session's parts share, and the count of threads inside its ring (closing);
- ``buffers.py``: ``Buffer`` and ``Program``;
- ``completions.py``: ``Ticket``, and waiting for completions through the ticket book;
- ``reattach.py``: surviving an arbiter restart under the control daemon;
- ``submit.py``: numbering operations and pushing them onto this thread's lane;
- ``session.py``: ``Session``, the public calls, composed of the parts above;
- ``connect.py``: ``connect()``: the mode, dialing the daemon or starting an embedded arbiter.
"""
