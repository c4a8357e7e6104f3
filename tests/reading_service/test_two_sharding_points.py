"""Two sharding points feeding one pipe: ``SampleMultiplexer`` over two sharded sources.

Each worker runs its own copy of the part above the sharding points and reads the two at the
pace its own logical shards' multiplexers draw, so at a cut one worker can be behind on the
first source and another on the second. The restore then replays that part from the start of
the epoch and deals every logical shard only what it had not read: exact at every cut, onto the
same workers and onto others.
"""

from __future__ import annotations

from typing import Any

import pytest

import snapshot
from snapshot.testing import assert_resumes_exactly


def multiplexed() -> Any:
    import torchdata.datapipes.iter as td
    from torch.utils.data.datapipes.iter import IterableWrapper

    first = IterableWrapper(range(60)).shuffle(buffer_size=6).sharding_filter()
    second = IterableWrapper(range(1000, 1040)).sharding_filter()
    return td.SampleMultiplexer({first: 0.7, second: 0.3}, seed=3).map(lambda x: x + 1)


def workers(n: int) -> Any:
    return lambda: snapshot.MultiProcessingReadingService(n, logical_shards=2)


@pytest.mark.slow
@pytest.mark.parametrize("restore_on", [2, 1, 0])
def test_multiplexer_over_two_sharded_sources_resumes_at_every_cut(restore_on: int) -> None:
    report = assert_resumes_exactly(multiplexed, reading_service=workers(2), restore_service=workers(restore_on),
                                    seed=4, epochs=2)
    assert len(report.cuts) >= 8
