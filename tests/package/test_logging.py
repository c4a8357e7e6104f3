"""What the library says while it works: log records, and progress bars only where wanted."""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest
from torch.utils.data.datapipes.iter import Batcher, IterableWrapper

import snapshot
from snapshot import _progress, plan
from tests import graphs, helpers


def hookless(n: int) -> Any:
    return Batcher(graphs.Squares(IterableWrapper(range(n))), batch_size=2)


def saved_at(factory: Any, steps: int, path: Any) -> list[Any]:
    """Iterate ``steps`` batches of a fresh loader, save to ``path``; the rest of the epoch."""
    with helpers.loader_at(factory(), steps, seed=3) as (dl, it):
        dl.save_snapshot(path)
        return list(it)


def test_the_package_logger_has_a_null_handler() -> None:
    handlers = logging.getLogger("snapshot").handlers
    assert any(isinstance(h, logging.NullHandler) for h in handlers)


def test_save_logs_path_size_and_time(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "data.snap"
    with caplog.at_level(logging.INFO, logger="snapshot"):
        saved_at(graphs.linear, 5, path)
    [record] = [r for r in caplog.records if r.name == "snapshot.storage._io"]
    assert record.levelno == logging.INFO
    message = record.getMessage()
    assert str(path) in message and f"{path.stat().st_size:,} bytes" in message and " s" in message


def test_restore_logs_its_plan_and_warns_once_about_a_long_replay(
        tmp_path: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan, "REPLAY_WARNING", 100)
    monkeypatch.setattr(plan, "_warned", set())
    path = tmp_path / "data.snap"
    rest = saved_at(lambda: hookless(400), 80, path)   # 160 samples of the hookless pipe
    for attempt in range(2):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="snapshot"):
            dl = snapshot.DataLoader2(hookless(400))
            dl.restore_snapshot(path)
        assert list(dl) == rest
        dl.shutdown()
        plans = [m for m in caplog.messages if m.startswith("restore (auto)")]
        assert plans == ["restore (auto): replaying 160 samples of 0/datapipe (Squares()) through 2 node(s); "
                         "the others from their saved state"]
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        if attempt == 0:  # named, with the way out; then not again for the same node
            [warning] = warnings
            assert "0/datapipe (Squares())" in warning and "160 samples" in warning
            assert "state_dict()" in warning and "snapshot.register_state_hook(Squares, ...)" in warning
        else:
            assert warnings == []


def test_a_short_replay_or_an_explicit_fast_forward_does_not_warn(
        tmp_path: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan, "_warned", set())
    path = tmp_path / "data.snap"
    saved_at(lambda: hookless(400), 80, path)
    with caplog.at_level(logging.INFO, logger="snapshot"):
        snapshot.DataLoader2(hookless(400)).restore_snapshot(path)             # 160 < REPLAY_WARNING
        monkeypatch.setattr(plan, "REPLAY_WARNING", 100)
        snapshot.DataLoader2(hookless(400)).restore_snapshot(path, strategy="fast_forward")  # asked for
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert any("restore (fast_forward): replaying 80 samples of 0 (BatcherIterDataPipe(batch_size=2" in r.getMessage()
               for r in caplog.records)


def test_restoring_from_state_logs_that_nothing_is_replayed(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "data.snap"
    saved_at(graphs.linear, 5, path)
    with caplog.at_level(logging.INFO, logger="snapshot"):
        snapshot.DataLoader2(graphs.linear()).restore_snapshot(path)
    assert "restore (auto): every node from its saved state, nothing replayed" in caplog.messages


def test_restoring_onto_another_number_of_workers_logs_the_resharding(
        tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "data.snap"
    rest = saved_at(graphs.sharded, 4, path)
    with caplog.at_level(logging.INFO, logger="snapshot"):
        dl = snapshot.DataLoader2(graphs.sharded(), reading_service=snapshot.MultiProcessingReadingService(1))
        dl.restore_snapshot(path)
        assert list(dl) == rest
        dl.shutdown()
    assert any(m.startswith("re-sharding: 1 logical shard(s) saved with 0 worker(s) per rank now run on 1")
               for m in caplog.messages)


# -- progress bars ---------------------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("switch", "environ", "stream", "expected"), [
    (None, {}, Terminal(), True),                                   # a terminal
    (None, {}, io.StringIO(), False),                               # a pipe, a log file
    (None, {"CI": "true"}, Terminal(), False),                      # never in CI logs
    (None, {"CI": "0"}, Terminal(), True),
    (None, {"SNAPSHOT_PROGRESS": "0"}, Terminal(), False),          # switched off
    (None, {"SNAPSHOT_PROGRESS": "1"}, io.StringIO(), True),        # asked for
    (None, {"SNAPSHOT_PROGRESS": "1", "CI": "true"}, io.StringIO(), True),
    (False, {"SNAPSHOT_PROGRESS": "1"}, Terminal(), False),         # the code's switch wins
    (True, {"CI": "true"}, io.StringIO(), True),
])
def test_when_a_progress_bar_is_shown(switch: bool | None, environ: dict[str, str], stream: io.StringIO,
                                      expected: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_progress, "enabled", switch)
    assert _progress.wanted(environ, stream) is expected


def test_a_forced_bar_follows_a_long_replay(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    tqdm = pytest.importorskip("tqdm")
    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)  # no monitor thread
    path = tmp_path / "data.snap"
    saved_at(lambda: hookless(4000), 1000, path)
    counts: list[int] = []
    update = _progress.Bar.update

    def spy(self: _progress.Bar, n: int = 1) -> None:
        update(self, n)
        counts.append(self.count)

    monkeypatch.setattr(_progress.Bar, "update", spy)
    monkeypatch.setattr(_progress, "DELAY", 0.0)
    monkeypatch.setattr(_progress, "enabled", False)
    snapshot.DataLoader2(hookless(4000)).restore_snapshot(path, strategy="fast_forward")
    assert counts == [] and capsys.readouterr().err == ""             # switched off: no bar
    monkeypatch.setattr(_progress, "enabled", True)
    snapshot.DataLoader2(hookless(4000)).restore_snapshot(path, strategy="fast_forward")
    assert counts == list(range(256, 1001, 256))                     # 1000 batches replayed
    assert "snapshot: replaying" in capsys.readouterr().err


def test_a_forced_bar_follows_a_long_save(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    tqdm = pytest.importorskip("tqdm")
    from snapshot.storage import _atomic, _io

    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)
    monkeypatch.setattr(_io, "SAVE_PROGRESS", 1)
    monkeypatch.setattr(_atomic, "_CHUNK", 100)
    monkeypatch.setattr(_progress, "DELAY", 0.0)
    monkeypatch.setattr(_progress, "enabled", True)
    path = tmp_path / "data.snap"
    rest = saved_at(graphs.linear, 5, path)
    assert "snapshot: saving" in capsys.readouterr().err
    dl = snapshot.DataLoader2.from_snapshot(path)   # written whole, chunk by chunk
    assert list(dl) == rest
