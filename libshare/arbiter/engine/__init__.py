"""The native engine: the data path in C on its own thread, and its binding."""
