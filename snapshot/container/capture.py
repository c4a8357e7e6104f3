"""The :class:`Snapshot` and :func:`capture` (saving and loading are in :mod:`snapshot.storage._io`).

A snapshot has two halves. The *manifest* is plain JSON that describes everything a person
or a tool needs to see (versions, the graph as a tree of node paths, positions, seeds,
layout, sizes, checksums) and is readable without unpickling. The *payload* holds what
a restore needs as Python objects: the loader and reading-service state (node states,
buffered samples), and optionally the pickled graph and reading-service configuration.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from snapshot import schema
from snapshot.container import _dict_form, _parts, _payload, _readers, format
from snapshot.container._manifest_of import manifest_of, node_states
from snapshot.errors import CorruptSnapshotError, ManifestError, SnapshotFileError

__all__ = ["LoaderState", "Snapshot", "capture", "capture_source", "encode", "snapshot_of"]


@dataclass
class LoaderState:
    """What a loader reports for a capture (see ``snapshot.loader._save.Saver.source``)."""

    epoch: int
    yielded: int
    epoch_finished: bool
    seed: int | None
    seed_given: bool
    pending_seed: int | None
    generator: dict[str, Any] | None
    service: dict[str, Any]
    service_name: str
    graph_nodes: list[dict[str, Any]]
    graph_fingerprint: str
    graph_bytes: bytes | None
    service_bytes: bytes | None
    lookahead: list[Any] = field(default_factory=list)
    verify: dict[str, Any] | None = None
    code_changes: str = "refuse"
    metadata: dict[str, Any] | None = None  # save_snapshot(metadata=...): in the manifest, not the payload
    readers: dict[str, Any] = field(default_factory=dict)  # per node path, a reader's hook: see _readers

    def restore_state(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "yielded": self.yielded,
            "epoch_finished": self.epoch_finished,
            "seed": self.seed,
            "seed_given": self.seed_given,
            "pending_seed": self.pending_seed,
            "generator": self.generator,
            "service": self.service,
            "lookahead": list(self.lookahead),
        }


class Snapshot:
    """A captured data position: a JSON ``manifest`` plus the payload a restore needs.

    The payload (``state``, ``graph``, ``service``) is decoded when first used: a snapshot that
    was just written to a file reads its payload back from there only if asked. A distributed
    snapshot (a directory, or a state dict with ``parts``) loads as one snapshot whose ``parts``
    are the ranks' own snapshots.
    """

    def __init__(self, manifest: dict[str, Any] | schema.Manifest, state: dict[str, Any] | None = None,
                 graph: bytes | None = None, service: bytes | None = None,
                 payload: bytes | Callable[[], bytes] = b"", parts: list[Snapshot] | None = None):
        if isinstance(manifest, schema.Manifest):
            #: The manifest, typed (see :mod:`snapshot.schema`).
            self.info = manifest
        else:
            self.info = schema.Manifest.from_dict(manifest)
            self.__dict__["manifest"] = manifest
        self._body: dict[str, Any] | None = None
        if state is not None:
            self._body = {"state": state, "graph": graph, "service": service}
        self._payload_source = payload
        self._handed_out = False
        self.parts = parts

    @functools.cached_property
    def manifest(self) -> dict[str, Any]:
        """The manifest as JSON-able dicts, as written in the file (made when first asked for: a save's
        snapshot may never be)."""
        return self.info.to_dict()

    @functools.cached_property
    def saved(self) -> schema.SavedState:
        """The loader's state, typed and validated (read once; a loaded snapshot's is read when loaded)."""
        return schema.SavedState.from_dict(self.state)

    @property
    def _payload(self) -> bytes:
        if callable(self._payload_source):
            self._payload_source = self._payload_source()
        return self._payload_source

    def _decoded(self) -> dict[str, Any]:
        if self._body is None:  # our own capture, or a load that already checked trust
            assert self.info.payload is not None
            self._body = _payload.read(self._payload, self.info.payload, trusted=True, source="<snapshot>")
        return self._body

    def take_saved(self) -> schema.SavedState:
        """:attr:`saved` for a restore to consume (a fresh copy after the first: see :meth:`take_state`)."""
        if not self._handed_out:
            self._handed_out = True
            return self.saved
        return schema.SavedState.from_dict(self.take_state())

    def take_state(self) -> dict[str, Any]:
        """The saved state for a restore to consume: pipes may keep and change what they are given
        (a buffer list), so each call after the first decodes a fresh copy."""
        if not self._handed_out:
            self._handed_out = True
            return self.state
        if self.parts is None and self.info.payload is not None and self.info.payload.size:
            fresh = _payload.read(self._payload, self.info.payload, trusted=True, source="<snapshot>")
            state: dict[str, Any] = fresh["state"]
            return state
        return copy.deepcopy(self.state)

    @property
    def state(self) -> dict[str, Any]:
        """The loader's saved state (position, randomness, the reading service's checkpoint)."""
        state: dict[str, Any] = self._decoded()["state"]
        return state

    @property
    def graph(self) -> bytes | None:
        """The graph's dill pickle (``None``: saved with ``include_graph=False``)."""
        return self._decoded()["graph"] if self.info.graph.included else None

    @property
    def service(self) -> bytes | None:
        """The reading service's pickle."""
        service: bytes | None = self._decoded()["service"]
        return service

    @property
    def epoch(self) -> int:
        """The epoch the snapshot was taken in (``-1`` before the first)."""
        return self.info.loader.epoch

    @property
    def yielded(self) -> int:
        """Samples the loader had yielded in that epoch."""
        return self.info.loader.yielded

    @property
    def seed(self) -> int | None:
        return self.info.randomness.seed

    @property
    def metadata(self) -> dict[str, Any]:
        """What ``save_snapshot(metadata=...)`` recorded with this save (``{}``: nothing); a copy."""
        return copy.deepcopy(self.info.metadata or {})

    def __repr__(self) -> str:
        return (f"Snapshot(epoch={self.epoch}, yielded={self.yielded}, "
                f"nodes={len(self.info.graph.nodes)}, "
                f"graph={'included' if self.info.graph.included else 'not included'})")

    @property
    def identity(self) -> str:
        """A digest that differs between any two snapshots (used to check ranks agree)."""
        return hashlib.sha256(json.dumps(self.manifest, sort_keys=True).encode()).hexdigest()

    def to_bytes(self, *, key: bytes | str | None = None) -> bytes:
        """The snapshot file's bytes (signed when a key is given or ``$SNAPSHOT_KEY`` is set)."""
        if self.parts is not None:
            raise SnapshotFileError(
                "a distributed snapshot is a directory of parts, not one file: save it with "
                "save_snapshot(directory) on every rank, or use state_dict()")
        return format.pack(self.manifest, self._payload, key=key)

    def state_dict(self, *, key: bytes | str | None = None) -> dict[str, Any]:
        """The plain-dict form ``{"snapshot_format", "manifest", "payload"}``, or a distributed snapshot's
        ``{"snapshot_format", "manifest", "parts"}``, signed with ``key``/``$SNAPSHOT_KEY``."""
        if self.parts is not None:
            if len(self.parts) != len(self.info.parts):
                raise SnapshotFileError("read for one rank's restore (some parts): load all of it to write it again")
            blobs = [part.to_bytes(key=key) for part in self.parts]  # each part signed like the whole
            infos = [_parts.part_info(rank, p.manifest, blob) for rank, (p, blob) in enumerate(zip(self.parts, blobs))]
            return _parts.parts_state_dict(_parts.distributed_manifest(infos, save=self.info.save),
                                           {info["file"]: blob for info, blob in zip(infos, blobs)}, key=key)
        return _dict_form.to_state_dict(self.manifest, self._payload, key=key)

    @classmethod
    def from_container(cls, container: format.Container, *, source: str, trusted: bool = False) -> Snapshot:
        """The snapshot in a verified container, decoded; its state is checked against the schema.

        A payload that would unpickle something from the file (format 1, or values that are not
        data) is refused with an :class:`~snapshot.errors.UntrustedStateError` unless ``trusted``.
        """
        assert container.payload is not None
        _refuse_index(container.info, source)
        record = container.info.payload or schema.PayloadRecord(len(container.payload), "")
        body = _payload.read(container.payload, record, trusted=trusted, source=source)
        return cls._decoded_from(container.info, body, container.payload, source)

    @classmethod
    def from_stream(cls, container: format.Container, reader: format.PayloadReader, *, source: str,
                    payload: Callable[[], bytes]) -> Snapshot:
        """The snapshot in a container whose payload (format 3, no pickled values) ``reader`` reads: decoded
        as it is read, so that its bytes are never held twice, and refused unless their digest matches.
        ``payload`` reads the payload's bytes again if they are asked for (``to_bytes``, a second restore)."""
        _refuse_index(container.info, source)
        record = container.info.payload
        assert record is not None and record.encoding == _payload.ENCODING and not record.pickled
        try:
            body, failure = _payload.read_data(reader, record, source=source), None
        except CorruptSnapshotError as error:  # a damaged payload says so (its digest) before its decoding does
            body, failure = {}, error
        reader.verify()
        if failure is not None:
            raise failure
        return cls._decoded_from(container.info, body, payload, source)

    @classmethod
    def _decoded_from(cls, info: schema.Manifest, body: dict[str, Any], payload: bytes | Callable[[], bytes],
                      source: str) -> Snapshot:
        try:
            saved = schema.SavedState.from_dict(body["state"])
        except ManifestError as exc:
            raise exc.at(source) from None
        snap = cls(info, payload=payload)
        snap._body = body
        snap.__dict__["saved"] = saved  # validated once: see Snapshot.saved
        return snap


def _refuse_index(info: schema.Manifest, source: str) -> None:
    if info.is_index:
        raise SnapshotFileError(
            "this is the index of a distributed snapshot (its manifest.snap): pass the directory that "
            "holds it and the ranks' parts", source=source)


class _Memory:
    """A payload written into memory (pieces joined once), hashed as it goes."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> None:
        # a large piece is a view of a captured array or bytes: joined once, not copied twice
        keep = isinstance(data, bytes) or memoryview(data).nbytes >= 1 << 20
        self.pieces.append(data if keep else bytes(data))
        self._hash.update(data)
        self.size += memoryview(data).nbytes

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()


def capture(loader: Any, *, include_graph: bool = True, verify: int = 0) -> Snapshot:
    """Capture the current position of ``loader`` (a :class:`~snapshot.DataLoader2`).

    With ``verify=K`` the next K samples are computed ahead (and then served by the loader
    from a buffer, so nothing is lost), and their fingerprints are recorded: a restore
    compares them with the samples it produces and refuses a stream that diverges.
    """
    return snapshot_of(capture_source(loader, include_graph=include_graph, verify=verify))


def capture_source(loader: Any, *, include_graph: bool = True, verify: int = 0) -> LoaderState:
    """What :func:`capture` encodes (``verify`` as there): the loader's state as it reports it, not yet encoded."""
    if not callable(getattr(loader, "_snapshot_source", None)):
        raise TypeError(f"snapshot.capture() takes a snapshot.DataLoader2, not a {type(loader).__name__}")
    if isinstance(verify, bool) or not isinstance(verify, int) or verify < 0:
        raise TypeError(f"verify must be a non-negative int (samples to fingerprint ahead), not {verify!r}")
    # the loader refuses a graph it cannot restore exactly before anything is computed ahead
    source: LoaderState = loader._snapshot_source(include_graph=include_graph, verify=verify)
    return source


def encode(source: LoaderState, writer: Any) -> schema.Manifest:
    """Write ``source``'s payload into ``writer`` (``write``, ``size``, ``sha256``: a
    :class:`snapshot.format.Writer` or one in memory) as it is encoded; the manifest that records it.

    Node states and samples are written as data straight from the captured objects, so a save
    adds little memory above the state itself (see :mod:`snapshot.container._payload`).
    """
    body = {"state": source.restore_state(), "graph": source.graph_bytes, "service": source.service_bytes}
    service = schema.ServiceState.from_dict(source.service or {})
    sections, sizes = _payload.write(body, writer.write, measure=node_states(service))
    graph_size, service_size = len(source.graph_bytes or b""), len(source.service_bytes or b"")
    parts = {"graph": graph_size, "service": service_size, "state": writer.size - graph_size - service_size}
    manifest = manifest_of(source, service, {**sections, "size": writer.size, "sha256": writer.sha256,
                                             "parts": parts}, sizes)
    return _readers.with_readers(manifest, service, source.readers)


def snapshot_of(source: LoaderState) -> Snapshot:
    """The :class:`Snapshot` of a captured loader state, its payload encoded in memory."""
    memory = _Memory()
    manifest = encode(source, memory)
    return Snapshot(manifest, payload=b"".join(memory.pieces))
