"""Signing end to end: save with a key (or ``$SNAPSHOT_KEY``), refuse unsigned or tampered files
before anything is unpickled, on every way in (load, restore_snapshot, from_snapshot), and the
same verdicts from ``snapshot verify`` (see docs/threat-model.md).

A forged payload here is a pickle that creates a marker file when it is unpickled: the marker
existing means code from the file ran.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import snapshot
from snapshot import format as fmt
from tests import graphs
from tests.cli.test_cli import run_cli_batch

KEY = "our-key"
FLAGS_AT = len(fmt.MAGIC) + 2


class Touch:
    """Unpickling this runs code: it creates ``path``."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path(self.path),))


def saved_loader(samples: int = 4) -> snapshot.DataLoader2[Any]:
    """A loader 4 samples into its first epoch."""
    return running_loader(samples)[0]


def running_loader(samples: int = 4) -> tuple[snapshot.DataLoader2[Any], Any]:
    dl = snapshot.DataLoader2(graphs.linear())
    dl.seed(5)
    it = iter(dl)
    for _ in range(samples):
        next(it)
    return dl, it


def evil_payload(marker: Path) -> bytes:
    return b"P" + pickle.dumps({"state": Touch(str(marker))})


def forge_unsigned(data: bytes, payload: bytes) -> bytes:
    """Another payload, with digests and the manifest's record made to match: passes every checksum."""
    manifest = dict(fmt.unpack(data).manifest)
    manifest["payload"] = {**manifest["payload"], **fmt.payload_record(payload), "data": len(payload), "pickled": []}
    return fmt.pack(manifest, payload)


def forge_keeping_the_signature(signed: bytes, payload: bytes) -> bytes:
    """A signed file whose payload was swapped, digests recomputed and the old signature kept."""
    forged = bytearray(forge_unsigned(signed, payload))
    struct.pack_into("<H", forged, FLAGS_AT, 1)
    return bytes(forged) + signed[-32:]


Way = Callable[[Path, "str | None"], Any]
WAYS: dict[str, Way] = {
    "load": lambda path, key: snapshot.load(path, key=key),
    "restore_snapshot": lambda path, key: snapshot.DataLoader2(graphs.linear()).restore_snapshot(path, key=key),
    "from_snapshot": lambda path, key: snapshot.DataLoader2.from_snapshot(path, key=key),
    "restore": lambda path, key: snapshot.restore(snapshot.DataLoader2(graphs.linear()), path, key=key),
}


def test_save_with_a_key_signs_and_every_way_in_accepts_it(tmp_path) -> None:
    dl, it = running_loader()
    path = tmp_path / "signed.snap"
    dl.save_snapshot(path, key=KEY)
    expected = list(it)
    assert fmt.unpack(path.read_bytes(), key=KEY).signed
    fresh = snapshot.DataLoader2(graphs.linear())
    fresh.restore_snapshot(path, key=KEY)
    assert list(fresh) == expected
    assert list(snapshot.DataLoader2.from_snapshot(path, key=KEY.encode())) == expected
    assert snapshot.load(path, key=KEY).yielded == 4


def test_the_environment_variable_signs_and_checks(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fmt.KEY_ENV, KEY)
    path = tmp_path / "env.snap"
    saved_loader().save_snapshot(path)
    monkeypatch.delenv(fmt.KEY_ENV)
    assert fmt.unpack(path.read_bytes(), key=KEY).signed  # signed with the key from the environment
    unsigned = tmp_path / "unsigned.snap"
    saved_loader().save_snapshot(unsigned)
    assert not fmt.unpack(unsigned.read_bytes()).signed
    monkeypatch.setenv(fmt.KEY_ENV, KEY)
    snapshot.DataLoader2(graphs.linear()).restore_snapshot(path)  # checked with the key from the environment
    with pytest.raises(snapshot.SignatureError, match="not signed"):
        snapshot.DataLoader2(graphs.linear()).restore_snapshot(unsigned)
    monkeypatch.setenv(fmt.KEY_ENV, "another-key")
    with pytest.raises(snapshot.SignatureError, match="does not match this key"):
        snapshot.load(path)
    # an explicit key wins over the environment
    assert snapshot.load(path, key=KEY).yielded == 4


@pytest.mark.parametrize("way", sorted(WAYS))
def test_a_forged_unsigned_file_is_refused_before_unpickling(tmp_path, way: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "code-ran"
    path = tmp_path / "forged.snap"
    path.write_bytes(forge_unsigned(saved_loader().save_snapshot().to_bytes(), evil_payload(marker)))
    with pytest.raises(snapshot.SignatureError, match="not signed; refusing to unpickle"):
        WAYS[way](path, KEY)
    assert not marker.exists()
    monkeypatch.setenv(fmt.KEY_ENV, KEY)
    with pytest.raises(snapshot.SignatureError):
        WAYS[way](path, None)
    assert not marker.exists()


@pytest.mark.parametrize("way", sorted(WAYS))
def test_a_tampered_signed_file_is_refused_before_unpickling(tmp_path, way: str) -> None:
    marker = tmp_path / "code-ran"
    signed = saved_loader().save_snapshot().to_bytes(key=KEY)
    path = tmp_path / "tampered.snap"
    path.write_bytes(forge_keeping_the_signature(signed, evil_payload(marker)))
    with pytest.raises(snapshot.SignatureError, match="signed with another key or altered after signing"):
        WAYS[way](path, KEY)
    assert not marker.exists()


def test_without_a_key_a_forged_payload_runs_no_code(tmp_path) -> None:
    """Checksums catch damage, not a forger; but the state decodes as data, so a pickle put in its
    place is refused as corrupt, and one claiming format 1 is refused for want of trust."""
    marker = tmp_path / "code-ran"
    path = tmp_path / "forged.snap"
    path.write_bytes(forge_unsigned(saved_loader().save_snapshot().to_bytes(), evil_payload(marker)))
    assert snapshot.read_manifest(path)["loader"]["yielded"] == 4  # inspecting is safe
    with pytest.raises(snapshot.CorruptSnapshotError):
        snapshot.load(path)  # no key: the checksums pass, and the data decoder refuses a pickle
    assert not marker.exists()
    manifest = dict(fmt.unpack(path.read_bytes(), with_payload=False).manifest, format=1)
    payload = evil_payload(marker)
    manifest["payload"] = fmt.payload_record(payload)
    old = tmp_path / "format1.snap"
    old.write_bytes(fmt.pack(manifest, payload))
    for way in ("load", "restore_snapshot", "restore"):
        with pytest.raises(snapshot.UntrustedStateError, match="format 1"):
            WAYS[way](old, None)
        assert not marker.exists(), way
    with pytest.raises(snapshot.SnapshotError):
        snapshot.load(old, allow_pickle=True)  # the threat trust lets in: the pickle runs (then is refused)
    assert marker.exists()


def test_the_signature_covers_the_manifest_too(tmp_path) -> None:
    signed = bytearray(saved_loader().save_snapshot().to_bytes(key=KEY))
    manifest = fmt.unpack(bytes(signed)).manifest
    manifest["loader"]["yielded"] = 0
    payload = fmt.unpack(bytes(signed)).payload or b""
    forged = bytearray(fmt.pack(manifest, payload))
    struct.pack_into("<H", forged, FLAGS_AT, 1)
    forged += signed[-32:]
    assert hashlib.sha256(forged[:-32]).digest() != hashlib.sha256(signed[:-32]).digest()
    with pytest.raises(snapshot.SignatureError):
        snapshot.load(bytes(forged), key=KEY)


def test_a_state_dict_is_refused_when_a_key_is_required() -> None:
    state = saved_loader().state_dict()
    with pytest.raises(snapshot.SignatureError, match="not signed"):
        snapshot.load(state, key=KEY)


def test_state_dicts_are_signed_with_the_environment_key(monkeypatch) -> None:
    import json

    monkeypatch.setenv(fmt.KEY_ENV, KEY)
    loader = saved_loader()
    state = loader.state_dict()
    assert sorted(state) == ["manifest", "payload", "snapshot_format"]  # still the same keys
    assert snapshot.load(state).manifest["signature"]
    fresh = snapshot.DataLoader2(graphs.linear())
    fresh.load_state_dict(state)  # verified with $SNAPSHOT_KEY
    other = dict(state, manifest=json.dumps({**json.loads(state["manifest"]), "loader": {"epoch": 9}}))
    with pytest.raises(snapshot.SignatureError, match="altered after signing"):
        snapshot.load(other)
    with pytest.raises(snapshot.SignatureError, match="another key"):
        snapshot.load(state, key="not the key")


def test_verify_gives_the_same_verdicts(tmp_path) -> None:
    marker = tmp_path / "code-ran"
    signed = saved_loader().save_snapshot().to_bytes(key=KEY)
    files = {"signed": signed, "tampered": forge_keeping_the_signature(signed, evil_payload(marker)),
             "forged": forge_unsigned(signed, evil_payload(marker))}
    for name, data in files.items():
        (tmp_path / f"{name}.snap").write_bytes(data)
    results = run_cli_batch(*(["verify", str(tmp_path / f"{name}.snap")] for name in files),
                            env={fmt.KEY_ENV: KEY})
    assert [proc.returncode for proc in results] == [0, 1, 1]
    assert "signed with another key or altered after signing" in results[1].stdout
    assert "the file is not signed" in results[2].stdout
    assert not marker.exists()
