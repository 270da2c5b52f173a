"""The control thread beside the engine: ``drainer.py`` (Drainer: the loop, the engine's events,
clients and their objects), ``tasks.py`` (its task queue: call, post), ``planner.py`` (the engine's
policy and plans), ``containment.py`` (terminations, faults, the watchdog's verdict, recovery),
``quarantine.py`` (what ended an arbiter, remembered) and ``emergency.py`` (crash cleanup)."""
