"""``in_memory_cache`` in a part of the graph that a restore replays.

The cache is filled by the first epoch and kept on the pipe across epochs (persistent state). A snapshot
taken at the end of that epoch holds it full; a replay of that epoch (``strategy="fast_forward"``, or a pipe
without a hook in the cached part) must start it as the epoch began, empty, and fill it again from its
input. It used to start full, so the replay read nothing from the input and was refused: "replaying the
graph did not reproduce the saved position" (the graph fuzz found it: its reproducers are these graphs).
"""

from __future__ import annotations

import functools
import io
from typing import Any

import pytest

import snapshot
from snapshot.testing import assert_resumes_exactly

td = pytest.importorskip("torchdata.datapipes.iter")


def cached_above() -> Any:
    """The cache above the sharding point (the fuzz's case 40)."""
    from torch.utils.data.datapipes.iter import IterableWrapper

    return td.InMemoryCacheHolder(IterableWrapper(range(9)).shuffle(buffer_size=4).batch(2)).sharding_filter()


def cached_below() -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    return td.InMemoryCacheHolder(IterableWrapper(range(12)).sharding_filter().shuffle(buffer_size=3)).batch(2)


@pytest.mark.parametrize("factory", [cached_above, cached_below], ids=lambda f: f.__name__)
def test_a_replay_of_the_epoch_that_filled_the_cache_fills_it_again(factory: Any) -> None:
    in_process = functools.partial(snapshot.InProcessReadingService, logical_shards=2)
    report = assert_resumes_exactly(factory, reading_service=in_process, epochs=3,
                                    strategies=("fast_forward", "auto"))
    assert any(cut.epoch == 0 and cut.finished for cut in report.cuts)  # the end of the filling epoch


@pytest.mark.slow
def test_with_a_worker_and_a_restore_of_a_restore() -> None:
    # the fuzz's reproducer: saved after the first epoch in-process, restored onto a worker by
    # fast-forward, saved again at once and restored again
    with snapshot.DataLoader2(cached_above(), reading_service=snapshot.InProcessReadingService(logical_shards=2)) \
            as loader:
        loader.seed(1)
        list(loader)
        data = loader.save_snapshot().to_bytes()
        following = [list(loader) for _ in range(2)]
    worker = functools.partial(snapshot.MultiProcessingReadingService, 1, timeout=60)
    with snapshot.DataLoader2(cached_above(), reading_service=worker()) as restored:
        restored.restore_snapshot(io.BytesIO(data), strategy="fast_forward")
        iter(restored)
        again = restored.save_snapshot().to_bytes()
    with snapshot.DataLoader2(cached_above(), reading_service=worker()) as twice:
        twice.restore_snapshot(io.BytesIO(again), strategy="fast_forward")
        assert [list(twice) for _ in range(2)] == following
