"""The client side of a session: connecting, buffers, tickets, completions and reattach."""
