"""The payload's typed state records (``snapshot.schema.state`` and ``snapshot.schema.saved``): each
reads what today's loaders write and writes it back unchanged, round-trips, and refuses a wrong
field by its path."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import snapshot
from snapshot import schema
from snapshot.errors import ManifestError
from tests import graphs

NODE = schema.NodeState(yielded=3, exhausted=False, state={"at": 3}, buffered=2, buffer_state="positions",
                        passes={"by": None, "key": [1]})
ROUTER = schema.RouterState(position=9, kept=9, ended=False, next={0: 10, 1: 11}, queues={0: [[8, "x"]], 1: []},
                            deal=[[2], [4, {0: 8}, {}]])
SHARD = schema.ShardState(produced=4, graph_exhausted=False, nodes={"0": NODE},
                          plan=schema.PlanState(drivers=(("0", 4),), replayed_nodes=("0",), reasons={"0": "no hook"}),
                          rng=[1, 2], persistent={"0": {"epoch": 1}}, shard=0, yielded=3, in_flight=["y"],
                          finished=False)
UPSTREAM = schema.UpstreamState(shards=[0, 1], nodes={"0/datapipe": NODE}, routers={"0/datapipe": ROUTER},
                                persistent={}, rng=None)
SEEDS = schema.SeedsState(shared={"0/datapipe": 7}, shards=[{"0": 1}, {"0": 2}], rng=[5, 6])
SERVICE = schema.ServiceState(service="MultiProcessingReadingService",
                              layout={"logical_shards": 2, "workers": 2, "ranks": 1, "owners": {"0": 0, "1": 1}},
                              shards=[SHARD, None], upstream=[UPSTREAM], seeds=SEEDS,
                              merge={"shards": [0], "turn": 0, "exhausted": [], "consumed": {0: 3}})
GENERATOR = {name: {"key": [1, 2], "counter": [0, 0, 0, 1], "cached": None, "spawn_key": [0, 0]}
             for name in ("shared", "shard")}
SAVED = schema.SavedState(position=schema.LoaderPosition(0, 3, False, 1), seed=3, seed_given=True,
                          pending_seed=None, generator=GENERATOR, service=SERVICE, lookahead=("z",),
                          ranks=[schema.RankState(0, 3, False, ["z"])])


@pytest.mark.parametrize("record", [NODE, ROUTER, SHARD, UPSTREAM, SEEDS, SERVICE, SAVED, SHARD.plan,
                                    schema.ShardState(), schema.NodeState(), schema.UpstreamState()],
                         ids=lambda r: type(r).__name__)
def test_a_record_round_trips(record: Any) -> None:
    assert type(record).from_dict(record.to_dict()) == record
    assert type(record).VERSION == 1


def _run(factory: Callable[[], Any], service: Any, take: int, epochs: int = 0) -> snapshot.Snapshot:
    with snapshot.DataLoader2(factory(), reading_service=service) as loader:
        loader.seed(5)
        for _ in range(epochs):
            list(loader)
        it = iter(loader)
        for _ in range(take):
            next(it)
        return loader.save_snapshot()


@pytest.mark.parametrize("factory, service, take, epochs", [
    (graphs.linear, None, 0, 0),
    (graphs.linear, None, 5, 0),
    (graphs.sharded, None, 7, 1),
    (graphs.sharded_batches, None, 3, 0),
    (graphs.combining, None, 4, 0),
    (graphs.sharded, "workers", 6, 0),
], ids=["fresh", "linear", "sharded-2nd-epoch", "batches", "combining", "workers"])
def test_the_records_read_what_a_loader_writes_and_write_it_back(factory: Any, service: Any, take: int,
                                                                 epochs: int) -> None:
    reading = snapshot.MultiProcessingReadingService(num_workers=2, timeout=60) if service == "workers" else None
    snap = _run(factory, reading, take, epochs)
    loaded = snapshot.load(snap.to_bytes())
    assert loaded.saved == snap.saved == schema.SavedState.from_dict(snap.state)
    assert snap.saved.to_dict() == snap.state  # the dict written today, key for key
    if take:
        assert snap.saved.service is not None and any(s is not None and s.nodes for s in snap.saved.service.shards)


FORMAT1 = Path(__file__).resolve().parents[1] / "fixtures" / "format1"


@pytest.mark.parametrize("name", ["workers0.snap", "workers2.snap"])
def test_files_written_in_format_1_read_into_the_records_and_back_unchanged(name: str) -> None:
    path = FORMAT1 / name
    if not path.exists():
        pytest.skip("the format-1 fixtures (tests/fixtures/format1) are not in this tree")
    snap = snapshot.load(path, allow_pickle=True)  # format 1 is a pickle: our own fixture, trusted
    assert snap.saved.to_dict() == snap.state
    assert snap.saved.service is not None and snap.saved.service.seeds is not None


def _set(*path: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(record: dict[str, Any]) -> None:
        for key in path[:-1]:
            record = record[key]
        record[path[-1]] = value
    return edit


def _drop(*path: Any) -> Callable[[dict[str, Any]], None]:
    def edit(record: dict[str, Any]) -> None:
        for key in path[:-1]:
            record = record[key]
        del record[path[-1]]
    return edit


MALFORMED = [
    (schema.NodeState, NODE, _set("yielded", value="3"), "node.yielded"),
    (schema.NodeState, NODE, _set("buffered", value=-1), "node.buffered"),
    (schema.NodeState, NODE, _set("exhausted", value=1), "node.exhausted"),
    (schema.RouterState, ROUTER, _set("queues", value=[]), "router.queues"),
    (schema.RouterState, ROUTER, _set("deal", value={}), "router.deal"),
    (schema.ShardState, SHARD, _set("nodes", "0", value=[]),
     "shard.nodes['0']"),
    (schema.ShardState, SHARD, _set("in_flight", value={}), "shard.in_flight"),
    (schema.ShardState, SHARD, _set("finished", value="yes"), "shard.finished"),
    (schema.ShardState, SHARD, _set("plan", "drivers", value=[{"replay": 3}]), "shard.plan.drivers[0].path"),
    (schema.UpstreamState, UPSTREAM, _set("shards", value=[0, -1]), "upstream.shards[1]"),
    (schema.UpstreamState, UPSTREAM, _set("routers", "0/datapipe", "position", value=1.5),
     "upstream.routers['0/datapipe'].position"),
    (schema.SeedsState, SEEDS, _set("shared", "0/datapipe", value=2**64), "seeds.shared['0/datapipe']"),
    (schema.SeedsState, SEEDS, _drop("shards"), "seeds.shards"),
    (schema.ServiceState, SERVICE, _drop("layout"), "state.service.layout"),
    (schema.ServiceState, SERVICE, _set("shards", value=[None]), "state.service.shards"),
    (schema.ServiceState, SERVICE, _set("shards", 0, "produced", value="4"), "state.service.shards[0].produced"),
    (schema.ServiceState, SERVICE, _set("upstream", 0, "nodes", "0/datapipe", "buffer_state", value=3),
     "state.service.upstream[0].nodes['0/datapipe'].buffer_state"),
    (schema.ServiceState, SERVICE, _set("seeds", "rng", value=[-1]), "state.service.seeds.rng[0]"),
    (schema.SavedState, SAVED, _set("service", "shards", 0, "yielded", value=-2), "state.service.shards[0].yielded"),
    (schema.SavedState, SAVED, _set("ranks", 0, "lookahead", value="z"), "state.ranks[0].lookahead"),
    (schema.SavedState, SAVED, _drop("generator"), "state.generator"),
]


@pytest.mark.parametrize("record_type, record, edit, where", MALFORMED, ids=[m[3] for m in MALFORMED])
def test_a_malformed_record_is_refused_by_its_field(record_type: Any, record: Any, edit: Any, where: str) -> None:
    value = copy.deepcopy(record.to_dict())
    edit(value)
    with pytest.raises(ManifestError) as caught:
        record_type.from_dict(value)
    assert caught.value.field == where


def test_unknown_fields_are_kept() -> None:
    value = SHARD.to_dict() | {"from_the_future": 1}
    assert schema.ShardState.from_dict(value).to_dict() == value


def test_the_two_ideas_of_exhausted_have_two_names() -> None:
    produced_all = schema.ShardState.from_dict({"exhausted": True, "finished": False, "yielded": 2})
    assert (produced_all.graph_exhausted, produced_all.finished, produced_all.taken_all) == (True, False, False)
    older = schema.ShardState.from_dict({"exhausted": True, "yielded": 2})  # written before ``finished``
    assert older.finished is None and older.taken_all and schema.shard_finished(older.to_dict())


def test_the_dict_alias_of_the_service_checkpoint_is_deprecated() -> None:
    import snapshot.reading_service as services

    with pytest.warns(DeprecationWarning, match="ServiceCheckpoint"):
        assert services.ServiceState is services.ServiceCheckpoint


def test_the_layout_is_read_once_and_again_when_it_changes() -> None:
    """``ServiceState.layout_record`` keeps the layout the record was checked with, and reads (and checks)
    a layout that changed since."""
    state = schema.ServiceState.from_dict(SERVICE.to_dict())
    assert state is not None
    assert state.layout_record() is state.layout_record()
    assert state.layout_record().logical_shards == SERVICE.logical_shards
    state.layout["units"] = 3  # not a multiple of the logical shards
    with pytest.raises(ManifestError, match=r"state\.service\.layout\.units"):
        state.layout_record()
    moved = schema.ServiceState.from_dict(SERVICE.to_dict())
    assert moved is not None
    moved.service = "InProcessReadingService"
    assert moved.layout_record().name == "InProcessReadingService"
