"""save_snapshot(verify=K): the restored stream is checked against recorded fingerprints."""

from __future__ import annotations

import pytest

import snapshot
from tests import graphs


@pytest.fixture(autouse=True)
def reset_offset():
    graphs.MAP_OFFSET[0] = 0
    yield
    graphs.MAP_OFFSET[0] = 0


def run_to(samples: int, verify: int):
    dl = snapshot.DataLoader2(graphs.offset_graph())
    dl.seed(4)
    it = iter(dl)
    for _ in range(samples):
        next(it)
    return dl, it, dl.save_snapshot(verify=verify)


def reference():
    dl = snapshot.DataLoader2(graphs.offset_graph())
    dl.seed(4)
    return [list(dl) for _ in range(2)]


def test_verifying_save_loses_nothing() -> None:
    ref = reference()
    dl, it, snap = run_to(5, verify=4)
    assert len(snap.manifest["verify"]["fingerprints"]) == 4
    assert ref[0][:5] + list(it) == ref[0]
    assert list(dl) == ref[1]


def test_verified_restore_is_exact() -> None:
    ref = reference()
    _, _, snap = run_to(5, verify=4)
    fresh = snapshot.DataLoader2(graphs.offset_graph())
    fresh.restore_snapshot(snap)
    assert list(fresh) == ref[0][5:]
    assert list(fresh) == ref[1]


def test_a_changed_function_is_caught_and_the_loader_is_left_unrestored() -> None:
    ref = reference()
    _, _, snap = run_to(5, verify=4)
    graphs.MAP_OFFSET[0] = 1000  # same graph, different behaviour
    fresh = snapshot.DataLoader2(graphs.offset_graph())
    fresh.seed(4)
    with pytest.raises(snapshot.VerificationError) as info:
        fresh.restore_snapshot(snap)
    message = str(info.value)
    assert "at sample 0 after the snapshot (sample 5 of epoch 0)" in message
    assert "map function" in message and "not restored" in message
    # the loader is as it was: its seed, and a whole epoch 0 (of the changed function), not the rest from sample 5
    assert list(fresh) == [[x + 1000 for x in batch] for batch in ref[0]]


def test_verify_near_the_end_of_the_epoch() -> None:
    ref = reference()
    n = len(ref[0])
    _, _, snap = run_to(n - 2, verify=10)
    assert snap.manifest["verify"]["ends"] is True
    assert len(snap.manifest["verify"]["fingerprints"]) == 2
    fresh = snapshot.DataLoader2(graphs.offset_graph())
    fresh.restore_snapshot(snap)
    assert list(fresh) == ref[0][-2:]


def test_a_second_save_keeps_the_samples_computed_ahead() -> None:
    ref = reference()
    dl, it, _ = run_to(3, verify=6)
    next(it)
    snap = dl.save_snapshot()  # 5 samples are still computed ahead: saved by value
    assert snap.manifest["loader"]["lookahead"] == 5
    fresh = snapshot.DataLoader2(graphs.offset_graph())
    fresh.restore_snapshot(snap)
    assert list(fresh) == ref[0][4:]
