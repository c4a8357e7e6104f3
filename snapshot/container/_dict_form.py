"""A snapshot as a plain dict (``DataLoader2.state_dict()``): the same manifest and payload as a file.

::

    {"snapshot_format": 2, "manifest": "<the manifest as JSON text>", "payload": b"..."}

The payload's digest is the one the manifest records (``payload.sha256``); signing puts an HMAC
of the manifest in it. The container's checks are :mod:`snapshot.format`'s.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from snapshot import schema
from snapshot.container.format import (
    FORMAT,
    FORMAT_VERSION,
    SIGNATURE,
    STATE_DICT_MARKER,
    Container,
    _check_version,
    _parse_json,
    _validate,
    resolve_key,
)
from snapshot.errors import CorruptSnapshotError, ForeignFileError, SignatureError

__all__ = ["from_state_dict", "read_manifest", "to_state_dict"]


def _state_dict_mac(secret: bytes, manifest: Mapping[str, Any]) -> str:
    """HMAC of a state dict's manifest (canonical JSON; it records the payload's digest)."""
    canonical = json.dumps({k: v for k, v in manifest.items() if k != SIGNATURE}, sort_keys=True,
                           separators=(",", ":"))
    return hmac.new(secret, canonical.encode(), hashlib.sha256).hexdigest()


def to_state_dict(manifest: Mapping[str, Any], payload: bytes | None, *,
                  key: bytes | str | None = None) -> dict[str, Any]:
    """The plain-dict form of a snapshot (survives ``torch.save``/``torch.load``).

    Always the same three keys, whatever the graph or position: frameworks that flatten nested
    dicts into keys (``torch.distributed.checkpoint``) need a loader's state to have the same keys
    when saved and when loaded. The manifest is JSON text. With a key (or ``$SNAPSHOT_KEY``) the
    manifest carries an HMAC of itself, which covers the payload through the digest it records.
    ``payload=None`` is the index of a distributed snapshot's state dict, which holds no payload (its
    parts are beside it: :mod:`snapshot.container._parts`): the marker and the manifest only.
    """
    manifest = dict(manifest)
    secret = resolve_key(key)
    if secret is not None:
        manifest[SIGNATURE] = _state_dict_mac(secret, manifest)
    state = {STATE_DICT_MARKER: manifest.get(FORMAT, FORMAT_VERSION), "manifest": json.dumps(manifest)}
    if payload is not None:
        state["payload"] = payload
    return state


def from_state_dict(state: Any, *, source: str = "<state_dict>", key: bytes | str | None = None) -> Container:
    """Verify a dict made by :func:`to_state_dict` (the payload digest is in the manifest).

    With a key (or ``$SNAPSHOT_KEY``) an unsigned or altered state dict is refused before
    anything is unpickled.
    """
    container = read_manifest(state, source=source, key=key)
    payload = state.get("payload")
    if not isinstance(payload, (bytes, bytearray)):
        raise CorruptSnapshotError("the state dict lacks its 'payload' bytes", source=source)
    recorded = container.info.payload.sha256 if container.info.payload is not None else None
    if recorded != hashlib.sha256(payload).hexdigest():
        raise CorruptSnapshotError(
            "the payload checksum does not match the manifest: the state dict was altered; "
            "nothing was unpickled", source=source,
        )
    return Container(container.manifest, bytes(payload), container.signed, len(payload), container.info)


def read_manifest(state: Any, *, source: str = "<state_dict>", key: bytes | str | None = None) -> Container:
    """The verified manifest of a state dict (its format, its signature with a key, its fields), in a
    :class:`Container` without a payload: all a distributed state dict's index is."""
    if not isinstance(state, Mapping) or STATE_DICT_MARKER not in state:
        keys = sorted(map(str, state.keys()))[:6] if isinstance(state, Mapping) else None
        hint = ""
        if isinstance(state, Mapping) and "serialized_datapipe" in state:
            hint = (" It looks like a torchdata 0.9 DataLoader2 state dict; those only restart "
                    "the epoch and cannot be converted. Save a new one with snapshot.DataLoader2.")
        raise ForeignFileError(
            f"this is not a snapshot state dict (keys: {keys}).{hint}", source=source,
        )
    version = schema.check_format(state[STATE_DICT_MARKER], source)
    manifest_text = state.get("manifest")
    if not isinstance(manifest_text, str):
        raise CorruptSnapshotError("the state dict lacks its 'manifest' JSON text", source=source)
    try:
        manifest_bytes = manifest_text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CorruptSnapshotError("the state dict's manifest is not valid text", source=source) from exc
    manifest = _parse_json(manifest_bytes, source)
    _check_version(manifest[FORMAT], version, source)
    secret = resolve_key(key)
    signed = isinstance(manifest.get(SIGNATURE), str)
    if secret is not None:
        if not signed:
            raise SignatureError(
                "a signing key was given but the state dict is not signed; refusing to unpickle it. Save "
                "it with $SNAPSHOT_KEY set (or key=...), or load it without a key if you trust its origin.",
                source=source)
        if not hmac.compare_digest(manifest[SIGNATURE].encode(), _state_dict_mac(secret, manifest).encode()):
            raise SignatureError(
                "the signature does not match this key: the state dict was signed with another key or "
                "altered after signing. Do not restore it.", source=source)
    return Container(manifest, None, signed, 0, _validate(manifest, source))
