"""Running a graph: traversal and fingerprints, the restore plan, sharding, seeds, execution."""
