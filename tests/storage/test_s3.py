"""Snapshots on an S3-compatible server (moto's server mode, started here on 127.0.0.1)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from tests.dist import free_port
from tests.helpers import kill_once_started, start_slow_save

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on a free port, a bucket, and the environment that points boto at it.

    Module-scoped, so that the server process and fsspec's process-wide I/O threads exist
    before each test's leak check starts (they are not the tests' leaks).
    """
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {name: os.environ.get(name) for name in env}
    import s3fs

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(endpoint, timeout=2).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "moto's server did not start"
                time.sleep(0.2)
        os.environ.update(env)
        s3fs.S3FileSystem.clear_instance_cache()
        bucket = f"snapshots-{uuid.uuid4().hex[:8]}"
        s3fs.S3FileSystem().mkdir(bucket)
        s3fs.S3FileSystem().exists(f"{bucket}/warm-up")
        yield bucket, env
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        s3fs.S3FileSystem.clear_instance_cache()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def graph():
    return IterableWrapper(list(range(40))).shuffle(buffer_size=8).batch(3)


@pytest.mark.parametrize("blocking", [True, False])
def test_save_load_and_restore_on_s3(s3, tmp_path, monkeypatch, blocking: bool) -> None:
    bucket, _ = s3
    monkeypatch.chdir(tmp_path)
    url = f"s3://{bucket}/run/data-{blocking}.snap"
    with snapshot.DataLoader2(graph()) as dl:
        dl.seed(2)
        it = iter(dl)
        for _ in range(4):
            next(it)
        result = dl.save_snapshot(url, blocking=blocking)
        if not blocking:
            assert result.result(timeout=120) == url
        rest = list(it)
    assert not (tmp_path / "s3:").exists()  # a real S3 write, not a local folder
    import s3fs

    assert s3fs.S3FileSystem().exists(url)
    assert snapshot.read_manifest(url)["loader"]["yielded"] == 4
    with snapshot.DataLoader2(graph()) as again:
        again.restore_snapshot(url)
        assert list(again) == rest


def test_a_kill_during_a_save_to_s3_leaves_the_previous_snapshot(s3, tmp_path) -> None:
    bucket, env = s3
    url = f"s3://{bucket}/run/kill.snap"
    marker = str(tmp_path / "started")
    kill_once_started(start_slow_save(tmp_path, "kill", url, marker, 600, env), marker)
    data = snapshot.storage._sources.read_container(url)  # verified, never unpickled (Slow lives in the script)
    assert data.manifest["loader"]["yielded"] == 1


def test_two_ranks_save_to_and_resume_from_s3_with_no_shared_filesystem(s3, tmp_path, monkeypatch) -> None:
    from tests.dist import run_ranks
    from tests.reading_service.test_distributed import check_restore, restore_from, save_at

    bucket, _ = s3
    url = f"s3://{bucket}/ckpt/data.snap"
    monkeypatch.chdir(tmp_path)
    run_ranks(2, save_at, 0, 3, url)  # a first snapshot, then a second one replaces it
    before = run_ranks(2, save_at, 0, 5, url)
    assert list(tmp_path.iterdir()) == []  # nothing written locally
    import s3fs

    store = s3fs.S3FileSystem()
    store.invalidate_cache()
    prefixes = [p for p in store.ls(f"{bucket}/ckpt/data.snap") if not p.endswith("manifest.snap")]
    assert len(prefixes) == 1  # the previous save's parts were removed after the commit
    manifest = snapshot.read_manifest(url)
    assert manifest["service"]["ranks"] == 2 and manifest["loader"]["yielded"] == 10
    after = run_ranks(2, restore_from, 0, url)
    check_restore(before, after, 2)  # each rank's own rest and next epoch, in order


def test_the_command_line_inspects_and_verifies_a_snapshot_on_s3(s3, tmp_path) -> None:
    bucket, env = s3
    url = f"s3://{bucket}/cli/data.snap"
    with snapshot.DataLoader2(graph()) as dl:
        dl.seed(2)
        next(iter(dl))
        dl.save_snapshot(url)
    for command in (["inspect", "--json", url], ["verify", url]):
        out = subprocess.run([sys.executable, "-m", "snapshot", *command], capture_output=True, text=True,
                             timeout=120, env={**os.environ, **env, "PYTHONPATH": ROOT})
        assert out.returncode == 0, out.stdout + out.stderr
