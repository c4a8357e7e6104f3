"""DistributedReadingService on real gloo process groups: shares, exactly-once elastic restores."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
from collections import Counter

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper, ShardingFilter, Shuffler

import snapshot
from snapshot import DistributedReadingService, InProcessReadingService, SequentialReadingService
from snapshot.reading_service import MultiProcessingReadingService as Workers
from tests import graphs
from tests.dist import RankFailure, run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def unique_graph(n: int = 96):
    """Samples are unique integers (so exactly-once is a multiset check)."""
    from torch.utils.data.datapipes.iter import IterableWrapper, Mapper, ShardingFilter, Shuffler

    dp = ShardingFilter(Shuffler(IterableWrapper(range(n)), buffer_size=10))
    return Shuffler(Mapper(dp, graphs.double), buffer_size=3)


def service(workers: int = 0, timeout: float = 60, **kwargs):
    if workers:
        return SequentialReadingService(DistributedReadingService(timeout, **kwargs), Workers(workers))
    return DistributedReadingService(timeout, **kwargs)


def read(loader, count):
    """The first ``count`` samples, and the iterator to continue the same epoch with."""
    it = iter(loader)
    return [next(it) for _ in range(count)], it


# -- rank functions (run in each rank's process) ----------------------------------------------

def epochs_on_rank(rank, world, workers, epochs, factory=unique_graph):
    with snapshot.DataLoader2(factory(), reading_service=service(workers)) as loader:
        loader.seed(11)
        return [list(loader) for _ in range(epochs)]


def save_at(rank, world, workers, steps, directory, state_path=None, logical_shards=None, policy=None):
    with snapshot.DataLoader2(unique_graph(), reading_service=service(workers, logical_shards=logical_shards,
                                                                      even_batches=policy)) as loader:
        loader.seed(11)
        seen, it = read(loader, steps)
        loader.save_snapshot(directory)
        state = loader.state_dict()
        if state_path is not None and rank == 0:
            import torch

            torch.save(state, state_path)
        rest = list(it)
        following = list(loader)
    return {"seen": seen, "rest": rest, "following": following, "manifest_keys": sorted(state)}


def restore_from(rank, world, workers, source, policy=None):
    """The rest of the epoch and the next one; ``policy=None``: each rank its whole share (the
    exactly-once checks below count every sample)."""
    with snapshot.DataLoader2(unique_graph(), reading_service=service(workers, even_batches=policy)) as loader:
        if source.endswith(".pt"):
            import torch

            loader.load_state_dict(torch.load(source, weights_only=True))
        else:
            loader.restore_snapshot(source)
        return {"rest": list(loader), "following": list(loader)}


# -- tests -----------------------------------------------------------------------------------

def test_each_rank_reads_its_share_of_one_stream() -> None:
    results = run_ranks(2, epochs_on_rank, 0, 2)
    with snapshot.DataLoader2(unique_graph(), reading_service=InProcessReadingService(logical_shards=2)) as loader:
        loader.seed(11)
        single = [list(loader) for _ in range(2)]
    for epoch in range(2):
        together = results[0][epoch] + results[1][epoch]
        assert Counter(together) == Counter(single[epoch])
        # the single-process stream interleaves shard 0 and 1, which the two ranks read
        assert results[0][epoch] == single[epoch][0::2][:len(results[0][epoch])]
    assert results[0][0] != results[0][1]


def test_workers_per_rank_give_the_same_share() -> None:
    plain = run_ranks(2, epochs_on_rank, 0, 1)
    with_workers = run_ranks(2, epochs_on_rank, 2, 1)
    assert Counter(plain[0][0] + plain[1][0]) == Counter(with_workers[0][0] + with_workers[1][0])


def check_exactly_once(before, after) -> None:
    """Counts only: every sample once in the interrupted epoch, and once in the next."""
    full = Counter(x for x in range(0, 192, 2))  # graphs.double of range(96)
    seen = Counter()
    for rank in before:
        seen.update(rank["seen"])
    for rank in after:
        seen.update(rank["rest"])
    assert seen == full, f"lost {full - seen}, repeated {seen - full}"
    following = Counter()
    for rank in after:
        following.update(rank["following"])
    assert following == full


def fresh_epochs(rank, world, shards, epochs):
    """``epochs`` epochs of a run that always had ``world`` ranks and ``shards`` logical shards."""
    with snapshot.DataLoader2(unique_graph(), reading_service=service(logical_shards=shards, even_batches=None)) \
            as loader:
        loader.seed(11)
        return [list(loader) for _ in range(epochs)]


@functools.cache
def fresh_run(world: int, shards: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Each rank's first two epochs on ``world`` ranks with ``shards`` logical shards (read once per session)."""
    return tuple(tuple(map(tuple, epochs)) for epochs in run_ranks(world, fresh_epochs, shards, 2))


def check_restore(before, after, shards: int) -> None:
    """A restore of ``before``'s snapshot (``shards`` logical shards) onto ``len(after)`` ranks.

    The run that saved is, rank by rank, a run that never saved. The rest of the epoch: on as
    many ranks, each rank's rest of that run, in order; on another number, every sample the run
    that saved had not yielded, exactly once (no policy drops any). The next epoch: each rank's,
    in order, that of a run that always had ``len(after)`` ranks and ``shards`` logical shards.
    """
    check_exactly_once(before, after)
    uninterrupted = fresh_run(len(before), shards)
    for rank, (run, epochs) in enumerate(zip(before, uninterrupted)):
        assert tuple(run["seen"] + run["rest"]) == epochs[0], f"rank {rank}: saving changed the stream"
        assert tuple(run["following"]) == epochs[1], f"rank {rank}: saving changed the next epoch"
    if len(before) == len(after):
        for rank, (run, epochs) in enumerate(zip(after, uninterrupted)):
            assert tuple(run["rest"]) == epochs[0][len(before[rank]["seen"]):], f"rank {rank}: the rest of the epoch"
            assert tuple(run["following"]) == epochs[1], f"rank {rank}: the next epoch"
        return
    fresh = fresh_run(len(after), shards)
    for rank in range(len(after)):
        assert tuple(after[rank]["following"]) == fresh[rank][1], f"rank {rank} of {len(after)}: the next epoch"


@pytest.mark.parametrize("saved, restored, shards", [(4, 2, None), (2, 3, 6), (2, 2, None), (3, 1, None),
                                                        (2, 3, None), (3, 4, None)])
def test_restore_onto_another_world_size_is_exactly_once(tmp_path, saved: int, restored: int, shards) -> None:
    directory = str(tmp_path / "data.snap")
    before = run_ranks(saved, save_at, 0, 5, directory, None, shards)
    assert os.path.islink(directory)
    after = run_ranks(restored, restore_from, 0, directory)
    check_restore(before, after, shards or saved)


def test_ranks_with_workers_restore_onto_another_layout(tmp_path) -> None:
    directory = str(tmp_path / "data.snap")
    before = run_ranks(2, save_at, 2, 4, directory)  # L = 2 ranks x 2 workers
    after = run_ranks(3, restore_from, 1, directory)
    check_restore(before, after, 4)


def test_more_workers_per_rank_than_units_split_them(tmp_path) -> None:
    # L = 2 on 2 ranks, restored onto 2 workers per rank: each unit is split in two (it used to be refused)
    directory = str(tmp_path / "data.snap")
    before = run_ranks(2, save_at, 0, 4, directory)
    after = run_ranks(2, restore_from, 2, directory)
    check_exactly_once(before, after)


def test_the_distributed_snapshot_restores_in_one_process(tmp_path) -> None:
    directory = str(tmp_path / "data.snap")
    before = run_ranks(2, save_at, 0, 5, directory)
    with snapshot.DataLoader2(unique_graph(), reading_service=InProcessReadingService()) as loader:
        loader.restore_snapshot(directory)
        after = [{"rest": list(loader), "following": list(loader)}]
    check_exactly_once(before, after)
    with snapshot.DataLoader2(unique_graph(), reading_service=InProcessReadingService(logical_shards=2)) as loader:
        loader.seed(11)
        single = [list(loader) for _ in range(2)]
    # each rank had read its shard's first 5: one process goes on with the one stream of 2 shards
    assert after[0]["rest"] == single[0][10:]
    assert after[0]["following"] == single[1]
    manifest = snapshot.read_manifest(directory)  # the directory itself reads as its manifest
    assert manifest["service"]["ranks"] == 2 and len(manifest["parts"]) == 2
    assert manifest["service"]["owners"] == {"0": {"rank": 0, "worker": 0}, "1": {"rank": 1, "worker": 0}}
    assert manifest["loader"]["yielded"] == 10  # both ranks' samples, not rank 0's
    assert all(shard is not None for shard in manifest["shards"])


def test_state_dict_has_fixed_keys_and_restores_elsewhere(tmp_path) -> None:
    directory = str(tmp_path / "data.snap")
    path = str(tmp_path / "state.pt")
    before = run_ranks(2, save_at, 0, 6, directory, path, 6)
    assert before[0]["manifest_keys"] == ["manifest", "parts", "snapshot_format"]
    after = run_ranks(3, restore_from, 0, path)
    check_restore(before, after, 6)


def test_a_second_save_replaces_the_directory_atomically(tmp_path) -> None:
    directory = str(tmp_path / "data.snap")
    run_ranks(2, save_at, 0, 3, directory)
    first = os.path.realpath(directory)
    run_ranks(2, save_at, 0, 7, directory)
    assert os.path.realpath(directory) != first and not os.path.exists(first)
    assert sorted(os.listdir(tmp_path)) == sorted(["data.snap", os.path.basename(os.path.realpath(directory))])


def dcp_round_trip(rank, world, checkpoint, steps):
    import torch
    import torch.distributed.checkpoint as dcp

    model = torch.nn.Linear(3, 1)
    with snapshot.DataLoader2(unique_graph(), reading_service=service()) as loader:
        loader.seed(11)
        seen, it = read(loader, steps)
        dcp.save({"model": model.state_dict(), "data": loader}, checkpoint_id=checkpoint)
        rest, following = list(it), list(loader)
    with snapshot.DataLoader2(unique_graph(), reading_service=service()) as fresh:
        state = {"model": torch.nn.Linear(3, 1).state_dict(), "data": fresh}
        dcp.load(state, checkpoint_id=checkpoint)
        return {"seen": seen, "rest_expected": rest, "following_expected": following, "rest": list(fresh),
                "following": list(fresh), "weights_equal": torch.equal(state["model"]["weight"], model.weight.detach())}


def test_torch_distributed_checkpoint_round_trip(tmp_path) -> None:
    results = run_ranks(2, dcp_round_trip, str(tmp_path / "dcp"), 5)
    for result in results:
        assert result["weights_equal"]
        assert result["rest"] == result["rest_expected"]
        assert result["following"] == result["following_expected"]
    check_exactly_once(results, results)


def fail_after_two_steps(rank, world, how, directory, released):
    """Rank 1 dies, or hangs: blocks until rank 0 releases it, after rank 0's save has failed."""
    with snapshot.DataLoader2(unique_graph(), reading_service=service(timeout=5)) as loader:
        loader.seed(1)
        read(loader, 2)
        if rank == 1 and how == "dies":
            os._exit(3)
        if rank == 1 and how == "hangs":
            return {"released": released.wait(30)}  # blocked in a call, as a stuck rank is
        try:
            loader.save_snapshot(directory)
        except snapshot.RankError as exc:
            return {"error": str(exc)}
        finally:
            released.set()
        return {"error": None}


@pytest.mark.parametrize("how", ["dies", "hangs"])
def test_a_dead_or_hung_rank_is_a_clear_error_on_the_others(tmp_path, how: str) -> None:
    import multiprocessing

    released = multiprocessing.get_context("fork").Event()
    results = run_ranks(2, fail_after_two_steps, how, str(tmp_path / "s"), released, timeout=90, allow_errors=True)
    survivor = results[0]
    assert survivor["error"] is not None and "another rank died, hung for more than 5 s" in survivor["error"]
    assert "restore from the last complete snapshot" in survivor["error"]
    if how == "hangs":  # rank 0 gave up while rank 1 was still blocked (for at most 30 s): rank 0 released it
        assert results[1] == {"released": True}
    else:
        assert isinstance(results[1], RankFailure) and "died (3)" in results[1].message
    assert os.listdir(tmp_path) == []  # nothing is published, no staging directory is left


def uneven(rank, world, policy):
    from torch.utils.data.datapipes.iter import IterableWrapper, ShardingFilter

    loader = snapshot.DataLoader2(ShardingFilter(IterableWrapper(range(9))),
                                  reading_service=DistributedReadingService(timeout=60, even_batches=policy))
    with loader:
        return list(loader)


@pytest.mark.parametrize("policy, length", [(None, None), ("drop", 4), ("pad", 5)])
def test_even_batches(policy, length) -> None:
    results = run_ranks(2, uneven, policy)
    if policy is None:
        assert [len(r) for r in results] == [5, 4]
    else:
        assert [len(r) for r in results] == [length, length]
    if policy == "pad":
        assert results[1][-1] == results[1][-2]


def different_seeds(rank, world):
    from torch.utils.data.datapipes.iter import IterableWrapper, ShardingFilter, Shuffler

    with snapshot.DataLoader2(Shuffler(ShardingFilter(IterableWrapper(range(20)))), reading_service=service()) \
            as loader:
        loader.seed(100 + rank)  # only rank 0's seed counts
        first = list(loader)
        return first, loader.save_snapshot().manifest["randomness"]["seed"]


def test_rank_zero_decides_the_seed() -> None:
    results = run_ranks(2, different_seeds)
    assert [seed for _, seed in results] == [100, 100]
    with snapshot.DataLoader2(Shuffler(ShardingFilter(IterableWrapper(range(20)))),
                              reading_service=InProcessReadingService(logical_shards=2)) as loader:
        loader.seed(100)
        single = list(loader)
    assert Counter(results[0][0] + results[1][0]) == Counter(single)
    assert results[0][0] == single[0::2][:len(results[0][0])]


def different_graphs(rank, world):
    from torch.utils.data.datapipes.iter import IterableWrapper, ShardingFilter

    loader = snapshot.DataLoader2(ShardingFilter(IterableWrapper(range(10 + rank))), reading_service=service())
    with loader:
        return next(iter(loader))


def test_ranks_with_different_graphs_are_refused() -> None:
    results = run_ranks(2, different_graphs, allow_errors=True)
    assert all(isinstance(r, RankFailure) and "different graph" in r.message for r in results)


@pytest.mark.slow
def test_torchrun_smoke(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {ROOT!r})
        import torch.distributed as dist
        import snapshot
        from tests.reading_service.test_distributed import unique_graph
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        loader = snapshot.DataLoader2(unique_graph(),
            reading_service=snapshot.DistributedReadingService(timeout=60))
        loader.seed(3)
        it = iter(loader)
        head = [next(it) for _ in range(4)]
        loader.save_snapshot({str(tmp_path / 'snap')!r})
        rest = list(it)
        restored = snapshot.DataLoader2(unique_graph(),
            reading_service=snapshot.DistributedReadingService(timeout=60))
        restored.restore_snapshot({str(tmp_path / 'snap')!r})
        assert list(restored) == rest
        print(f"rank {{rank}} OK {{len(head) + len(rest)}}")
        loader.shutdown(); restored.shutdown()
        dist.destroy_process_group()
    """))
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    proc = subprocess.run([torchrun, "--nproc_per_node=2", "--master_addr=127.0.0.1",
                           f"--master_port={functools.partial(__import__('tests.dist').dist.free_port)()}",
                           str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0 OK 48" in proc.stdout and "rank 1 OK 48" in proc.stdout


def test_a_manifest_naming_files_outside_the_directory_is_refused(tmp_path) -> None:
    from snapshot import format as fmt

    directory = tmp_path / "evil.snap"
    directory.mkdir()
    (tmp_path / "secret").write_bytes(b"not yours")
    manifest = {"format": 1, "parts": [{"rank": 0, "file": "../secret", "sha256": "0" * 64, "size": 9}]}
    (directory / "manifest.snap").write_bytes(fmt.pack(manifest, b""))
    with pytest.raises(snapshot.CorruptSnapshotError, match="not a part file name"):
        snapshot.load(str(directory))


def save_in_background_at(rank, world, steps, directory):
    with snapshot.DataLoader2(unique_graph(), reading_service=service(0)) as loader:
        loader.seed(11)
        seen, it = read(loader, steps)
        future = loader.save_snapshot(directory, blocking=False)  # a collective: synchronous across ranks
        done = future.done()
        path = future.result(timeout=60)
        return {"seen": seen, "rest": list(it), "following": list(loader), "done": done, "path": path}


def test_a_background_save_across_ranks_is_a_done_future(tmp_path) -> None:
    directory = str(tmp_path / "data.snap")
    before = run_ranks(2, save_in_background_at, 4, directory)
    assert all(r["done"] and r["path"] == directory for r in before)
    after = run_ranks(2, restore_from, 0, directory)
    check_restore(before, after, 2)
