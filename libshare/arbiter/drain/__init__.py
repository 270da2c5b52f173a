"""The control thread beside the engine: events, tasks, containment, quarantine, crash cleanup."""
