"""What clients, the CLI, the control daemon and the arbiter share: the wire format, control commands, paths."""
