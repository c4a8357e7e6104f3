"""The loader's restorer: it puts the loader where a snapshot was saved, and verifies the restored stream.

Everything is validated before the loader changes; if verification then fails, the loader's
position is put back as it was.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from snapshot.container import _serialization
from snapshot.container.capture import Snapshot
from snapshot.engine.plan import RestoreStrategy, check_graph, check_strategy
from snapshot.errors import LayoutError, RankError, SnapshotError, VerificationError
from snapshot.loader._graph_copy import GraphCopy
from snapshot.loader._position import LivePosition
from snapshot.loader._service import LoaderService
from snapshot.schema import RankState, SavedState, ServiceState, VerifyRecord

if TYPE_CHECKING:
    from snapshot.reading_service.base import ReadingServiceInterface
    from snapshot.storage.multipart import Select

__all__ = ["Restorer", "load_with_graph"]


def load_with_graph(src: Any, reading_service: ReadingServiceInterface | None,
                    key: bytes | str | None) -> tuple[Snapshot, ReadingServiceInterface | None]:
    """For ``from_snapshot``: the snapshot (refused without a graph), and the reading service
    to build the loader with (the one saved in it when none is given)."""
    from snapshot.storage._io import is_directory, load

    if reading_service is None and is_directory(src):  # the saved service says which parts to read
        head = load(src, key=key, allow_pickle=True, parts=lambda index: [0])
        if head.service is not None:
            reading_service = _serialization.loads(head.service, what="saved reading service")
    parts = None if reading_service is None else reading_service.parts_to_read
    snap = load(src, key=key, allow_pickle=True, parts=parts)  # from_snapshot trusts the file: it unpickles its graph
    if snap.graph is None:
        raise SnapshotError(
            "the snapshot was saved with include_graph=False, so it holds no graph: "
            "build the graph in code, pass it to DataLoader2(...) and call restore_snapshot()."
        )
    if reading_service is None and snap.service is not None:
        reading_service = _serialization.loads(snap.service, what="saved reading service")
    return snap, reading_service


class Restorer:
    """Puts the loader's position and reading service where a snapshot says they stood, adopting
    the snapshot's graph when the loader has none."""

    def __init__(self, graph: GraphCopy, service: LoaderService, position: LivePosition) -> None:
        self.graph, self.service, self.position = graph, service, position

    def read(self, load: Callable[[Select], Snapshot]) -> Snapshot:
        """``load(parts)``, reading only the parts of a distributed snapshot that this loader's service
        names (one rank's share); on one rank of many, a failure on any rank is raised on every rank
        (the rank that failed raises its own error, the others a :class:`RankError` naming it), so no
        rank waits for another that will not come."""
        service = self.service.service
        collective = self.service.collective()
        error: SnapshotError | None = None
        try:
            snap = load(service.parts_to_read)
        except SnapshotError as exc:
            error = exc
        if collective is not None:
            errors = collective.all_gather(None if error is None else f"{type(error).__name__}: {error}",
                                           "reading the snapshot")
            failed = [f"rank {rank}: {message}" for rank, message in enumerate(errors) if message]
            if failed and error is None:
                raise RankError("the snapshot could not be read on every rank, so no rank restores it (nothing "
                                "changed): " + "; ".join(failed))
        if error is not None:
            raise error
        return snap

    def restore(self, snap: Snapshot, strategy: RestoreStrategy) -> None:
        """Position the loader where ``snap`` was saved, after checking that it can be."""
        if self.service.terminated:
            raise RuntimeError("Cannot restore a DataLoader2 that has been shut down")
        if self.graph.graph is None:
            if snap.graph is None:
                raise SnapshotError(
                    "the snapshot does not include the graph (saved with include_graph=False) "
                    "and this loader has none: build the graph in code and pass it to "
                    "DataLoader2(...) before restoring."
                )
            self.graph.adopt(snap.graph)
        graph = self.graph.require()
        check_graph(snap.info.graph.nodes, graph, self.graph.code_changes)
        check_strategy(graph, strategy)  # refuses an impossible strategy up front
        saved = snap.take_saved()
        service = self.service.service
        problems = service.validate(saved.service if service.reads_records else saved.service.to_dict()) \
            if saved.service is not None else []
        collective = self.service.collective()
        rank_position = _rank_position(saved, collective)
        if rank_position is None and any(r.lookahead for r in saved.ranks):
            problems.append("the snapshot holds samples computed ahead for verification on some rank; it "
                            "restores only onto the same number of ranks")
        if problems:
            raise LayoutError("cannot restore onto this reading service:\n  " + "\n  ".join(problems))
        if collective is not None:
            identities = collective.all_gather(snap.identity, "checking that every rank restores the same snapshot")
            if len(set(identities)) != 1:
                differ = [r for r, i in enumerate(identities) if i != identities[0]]
                raise RankError(f"ranks {differ} restore a different snapshot than rank 0; every rank must "
                                "restore the same one")
        # Validated: now change the loader (and put it back if verification fails).
        before = self.position.copy()
        try:
            # node states arrive decoded (format 2: as data; format 1: unpickled when loaded)
            self._apply(saved, saved.service, strategy, rank_position)
            recorded = snap.info.verify if rank_position is not None else None
            if recorded is not None:
                self.verify(recorded)
        except BaseException as exc:
            self.graph.explain(exc)
            self.position.roll_back(before)
            raise

    def _apply(self, saved: SavedState, service: ServiceState | None, strategy: RestoreStrategy,
               rank_position: RankState | Literal[False] | None = False) -> None:
        pos, reading = self.position, self.service.service
        if pos.datapipe_iter is not None:
            reading.finalize_iteration()
            pos.datapipe_iter = None
        pos.take_saved(saved)
        if pos.epoch < 0:
            pos.datapipe_iter = None
            pos.reset_iter = True
            return
        if rank_position:
            pos.yielded = rank_position.yielded
            pos.epoch_finished = rank_position.epoch_finished
            pos.lookahead = deque(rank_position.lookahead)
        elif rank_position is None:  # another layout: this rank's share starts where its shards stand
            pos.lookahead = deque()
            pos.epoch_finished = all(r.epoch_finished for r in saved.ranks) and bool(saved.ranks)
        state = service if reading.reads_records or service is None else service.to_dict()
        if reading.takes_graph:  # the analysis the checks above used: the service does not walk the graph again
            pos.end = reading.restore(self.graph.datapipe, state or {}, strategy=strategy, graph=self.graph.graph)
        else:
            pos.end = reading.restore(self.graph.datapipe, state or {}, strategy=strategy)
        if rank_position is None:
            progress = getattr(reading, "progress", None)
            pos.yielded = progress()[0] if progress is not None else 0
        if pos.epoch_finished:
            pos.reset_iter = True
            pos.datapipe_iter = None
        else:
            pos.datapipe_iter = iter(pos.end)
            pos.reset_iter = False

    def verify(self, recorded: VerifyRecord) -> None:
        """Refuse a restored stream whose next samples differ from those recorded at saving."""
        pos = self.position
        count = recorded.count
        got: list[str] = pos.ahead(count)["fingerprints"] if count else []
        expected = list(recorded.fingerprints)
        for index, (want, have) in enumerate(zip(expected, got)):
            if want != have:
                sample = repr(pos.lookahead[index])
                sample = sample if len(sample) <= 100 else sample[:97] + "..."
                raise VerificationError(
                    f"the restored stream differs from the one recorded when the snapshot was saved, "
                    f"at sample {index} after the snapshot (sample {pos.yielded + index} of epoch "
                    f"{pos.epoch}): recorded fingerprint {want}, restored {have} = {sample}. The "
                    "graph's code or data changed since the snapshot (a map function?), or a pipe is "
                    "not deterministic. The loader was not restored."
                )
        if len(expected) != len(got):
            raise VerificationError(
                f"the restored stream has {len(got)} samples where the recorded one "
                f"had {len(expected)} before the end of epoch {pos.epoch}: the data changed since "
                "the snapshot. The loader was not restored."
            )


def _rank_position(saved: SavedState, collective: Any) -> RankState | Literal[False] | None:
    """This rank's saved loader position if the snapshot had the same ranks, ``None`` if it
    must be derived from the shards (another layout), ``False`` for a one-process snapshot."""
    world = collective.world if collective is not None else 1
    if not saved.ranks:
        return False if world == 1 else None
    rank = collective.rank if collective is not None else 0
    return saved.ranks[rank] if len(saved.ranks) == world else None
