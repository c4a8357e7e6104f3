"""Running logical shards in one process: the sharded service skeleton, the engine of a process's shards,
the deal at the sharding point, the merge, sub-shards, re-sharding saved states, tails and dispatchers."""
