"""Snapshots on an object store that fails: 500s, 503 SlowDown, dropped connections, answers lost or too slow.

A fault-injecting proxy (:mod:`tests.fault_proxy`) stands between boto and the S3 test server (moto). Saves
and restores through a flaky store succeed (the retries and timeouts of ``snapshot.storage._fsspec``); a
store that keeps refusing is a ``StorageError`` (one file) or a ``RankError`` on every rank (a directory)
naming the URL and the HTTP status, and leaves the previous snapshot as it was: no partial index, no
parts of the failed save, and the previous snapshot restores exactly.
"""

from __future__ import annotations

import pytest

import snapshot
from tests.dist import RankFailure, run_ranks
from tests.fault_proxy import FaultProxy
from tests.storage.test_s3 import graph, s3  # noqa: F401 - s3: the module-scoped S3 server

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")


@pytest.fixture(scope="module")
def proxy(s3):  # noqa: F811 - the fixture imported above
    _, env = s3
    with FaultProxy(env["AWS_ENDPOINT_URL"], delay=3.0) as proxy:
        yield proxy


def configure(monkeypatch, **config) -> None:
    """boto's settings for S3, through fsspec's configuration (as a user sets them), on fresh clients."""
    import fsspec.config
    import s3fs

    monkeypatch.setitem(fsspec.config.conf, "s3", {"config_kwargs": config})
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def store(s3, proxy, monkeypatch):  # noqa: F811
    """The bucket, reached through the proxy; a read timeout of 1 s (the proxy's slow answers take 3 s)."""
    import s3fs

    bucket, _ = s3
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    configure(monkeypatch, read_timeout=1, connect_timeout=1)
    proxy.clear()
    yield bucket, proxy
    proxy.clear()
    s3fs.S3FileSystem.clear_instance_cache()


def read(url_or_none, steps: int = 0):
    """A loader seeded 2 (restored from ``url_or_none`` when given): the batches it yields after ``steps``."""
    with snapshot.DataLoader2(graph()) as dl:
        if url_or_none is None:
            dl.seed(2)
        else:
            dl.restore_snapshot(url_or_none)
        return list(dl)[steps:]


@pytest.mark.slow
@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "background"])
def test_saves_and_restores_go_through_a_flaky_store(store, blocking: bool) -> None:
    bucket, proxy = store
    url = f"s3://{bucket}/flaky/data-{blocking}.snap"
    proxy.flaky(0.4, seed=7)
    with snapshot.DataLoader2(graph()) as dl:
        dl.seed(2)
        it = iter(dl)
        for _ in range(4):
            next(it)
        result = dl.save_snapshot(url, blocking=blocking)
        if not blocking:
            assert result.result(timeout=120) == url
        rest = list(it)
    assert read(url) == rest == read(None, 4)
    assert len(proxy.faulted()) >= 3, proxy.log  # the faults landed: the retries carried the save and the restore


def test_the_retries_and_timeouts_are_explicit_and_fsspec_configuration_wins() -> None:
    from snapshot.storage import _fsspec

    assert _fsspec._options("s3://bucket/data.snap", {}) == {"config_kwargs": {
        "retries": {"mode": "standard", "total_max_attempts": 5}, "connect_timeout": 10, "read_timeout": 60}}
    assert _fsspec._options("s3://bucket/data.snap", {"s3": {"config_kwargs": {"read_timeout": 5}}}) == {
        "config_kwargs": {"retries": {"mode": "standard", "total_max_attempts": 5}, "connect_timeout": 10,
                          "read_timeout": 5}}
    assert _fsspec._options("memory://data.snap", {}) == {}
    _fsspec._options("s3://bucket/data.snap", {})["config_kwargs"]["retries"]["total_max_attempts"] = 1
    assert _fsspec.S3_CONFIG["retries"] == {"mode": "standard", "total_max_attempts": 5}  # each client its copy


@pytest.mark.slow
def test_a_store_slower_than_s3fs_default_timeout_still_takes_the_save(store, monkeypatch) -> None:
    """An answer 20 s late: s3fs's own read timeout (15 s) gave up on every try, the explicit 60 s waits."""
    bucket, proxy = store
    configure(monkeypatch)  # the library's settings, nothing from the user
    proxy.delay = 20.0
    url = f"s3://{bucket}/slow/data.snap"
    try:
        with snapshot.DataLoader2(graph()) as dl:
            dl.seed(2)
            it = iter(dl)
            for _ in range(4):
                next(it)
            with proxy.only("slow", method="PUT"):
                dl.save_snapshot(url)
                assert [fault for _, _, fault in proxy.faulted()] == ["slow"]  # once: no timeout, no retry
            rest = list(it)
    finally:
        proxy.delay = 3.0
    assert read(url) == rest


def test_a_save_the_store_keeps_refusing_is_a_storage_error_and_changes_nothing(store, monkeypatch) -> None:
    bucket, proxy = store
    configure(monkeypatch, read_timeout=1, connect_timeout=1, retries={"mode": "standard", "total_max_attempts": 2})
    url = f"s3://{bucket}/refused/data.snap"
    with snapshot.DataLoader2(graph()) as dl:
        dl.seed(2)
        it = iter(dl)
        for _ in range(4):
            next(it)
        dl.save_snapshot(url)
        next(it)
        with proxy.only("503", method="PUT"):
            with pytest.raises(snapshot.StorageError) as info:
                dl.save_snapshot(url)
            future = dl.save_snapshot(url, blocking=False)
            assert isinstance(future.exception(timeout=120), snapshot.StorageError)
            refused = [entry for entry in proxy.faulted() if entry[0] == "PUT"]
        rest = list(it)
    error = info.value
    assert error.cause == "HTTP 503 SlowDown" and error.source == url
    assert str(error).startswith(f"{url}: the snapshot was not written: the object store answered HTTP 503 SlowDown"), \
        str(error)
    assert f"The object at {url} is unchanged" in str(error) and "after its retries" in str(error)
    assert len(refused) >= 4  # each save tried again before giving up
    assert rest == read(None, 5)  # the live stream went on unchanged
    assert snapshot.read_manifest(url)["loader"]["yielded"] == 4 and read(url) == read(None, 4)


def test_a_restore_the_store_keeps_refusing_is_a_storage_error(store, monkeypatch) -> None:
    bucket, proxy = store
    url = f"s3://{bucket}/unreadable/data.snap"
    with snapshot.DataLoader2(graph()) as dl:
        dl.seed(2)
        next(iter(dl))
        dl.save_snapshot(url)
    configure(monkeypatch, read_timeout=1, connect_timeout=1, retries={"mode": "standard", "total_max_attempts": 2})
    with snapshot.DataLoader2(graph()) as dl:
        dl.seed(2)
        with proxy.only("500", method="GET"), pytest.raises(snapshot.StorageError) as info:
            dl.restore_snapshot(url)
        assert list(dl) == read(None)  # nothing was restored: the loader is as it was
    message = str(info.value)  # the first read: whether the URL holds a directory snapshot's index
    assert info.value.cause == "HTTP 500 InternalError", message
    assert message.startswith(f"{url}/manifest.snap: cannot look up the snapshot: the object store answered HTTP 500 "
                              "InternalError"), message
    assert "Nothing was changed." in message


def save_at(rank, world, steps, url):
    from tests.reading_service.test_distributed import save_at

    return save_at(rank, world, 0, steps, url)


def restore_from(rank, world, url):
    from tests.reading_service.test_distributed import restore_from

    return restore_from(rank, world, 0, url)


def parts_prefixes(url: str) -> list[str]:
    import s3fs

    store = s3fs.S3FileSystem()
    store.invalidate_cache()
    return sorted(p.rsplit("/", 1)[1] for p in store.ls(url.removeprefix("s3://")))


@pytest.mark.slow
def test_two_ranks_save_and_restore_through_a_flaky_store(store) -> None:
    from tests.reading_service.test_distributed import check_exactly_once

    bucket, proxy = store
    url = f"s3://{bucket}/ranks-flaky/data.snap"
    proxy.flaky(0.3, seed=11)
    before = run_ranks(2, save_at, 5, url, timeout=240)
    after = run_ranks(2, restore_from, url, timeout=240)
    check_exactly_once(before, after)
    assert len(proxy.faulted()) >= 3, proxy.log


@pytest.mark.slow
def test_an_index_the_store_refuses_publishes_nothing_and_leaves_no_parts(store, monkeypatch) -> None:
    """Every part is written, then the index is refused: the previous index and its parts are what a restore
    reads, and the new parts are removed."""
    from tests.reading_service.test_distributed import check_exactly_once

    bucket, proxy = store
    configure(monkeypatch, read_timeout=1, connect_timeout=1, retries={"mode": "standard", "total_max_attempts": 2})
    url = f"s3://{bucket}/ranks-refused/data.snap"
    before = run_ranks(2, save_at, 3, url, timeout=240)
    published = parts_prefixes(url)
    with proxy.only("503", method="PUT", path=r"/manifest\.snap$"):
        failed = run_ranks(2, save_at, 5, url, timeout=240, allow_errors=True)
    assert parts_prefixes(url) == published  # the previous index and prefix; the failed save's parts removed
    for result in failed:
        assert isinstance(result, RankFailure), result
        message = result.message.splitlines()[0]
        assert message.startswith(f"RankError: {url}: the snapshot was not saved: rank 0 could not publish it: "
                                  "StorageError: "), message
        assert "HTTP 503 SlowDown" in message and f"The object at {url}/manifest.snap is unchanged" in message
    assert snapshot.read_manifest(url)["loader"]["yielded"] == 6
    check_exactly_once(before, run_ranks(2, restore_from, url, timeout=240))
