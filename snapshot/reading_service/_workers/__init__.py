"""The worker runtime: the pool of worker processes, what runs in each, the messages between them, and
``worker_reset_fn``."""
