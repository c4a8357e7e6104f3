"""The snapshot file and what it holds: the format, the Snapshot, the encoding of states."""
