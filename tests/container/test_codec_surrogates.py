"""A str with lone surrogates met in the middle of a value: the encoder packs strs by msgpack's fast UTF-8
path, which refuses them, and packs that value again by Python's codec from there on; what it had set
aside for the failed attempt (values not data, array bytes) is not kept twice."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from snapshot.container import _payload
from snapshot.container._codec import Encoder, Pickled, decode, encode

LONE = "\udc80 lone"


def test_a_lone_surrogate_after_fast_packed_values_round_trips() -> None:
    rows = [(f"/data/{i}", i, 3) for i in range(20)] + [(LONE, 20, 3)]
    value = {"first": ["plain"] * 50, "rows": rows, "key \ud800": {LONE: (LONE, 1)}, "after": "plain again"}
    data, pickled = encode(value)
    assert decode(data) == value and pickled == []


def test_what_the_failed_attempt_set_aside_is_kept_once() -> None:
    array = np.arange(8, dtype="<i4")
    value = [object, array, LONE, array + 1]  # a value not data, then arrays around the surrogate
    data, pickled = encode(value)
    assert pickled == [("state[0]", object)]
    got = decode(data, pickled=lambda index: Pickled(index))
    assert got[0] == Pickled(0) and got[2] == LONE
    assert np.array_equal(got[1], array) and np.array_equal(got[3], array + 1)


def test_the_payload_frame_measures_and_names_places_after_the_switch() -> None:
    out = io.BytesIO()
    encoder = Encoder(out.write)
    body = {"state": {"nodes": {"a": {"state": ["x"] * 10, "seen": {1, 2}}, LONE: {"state": [LONE, object]}}},
            "graph": None, "service": None}
    encoder.encode(body, "payload")
    assert [where for where, _ in encoder.pickled] == [f"payload.state.nodes[{LONE!r}].state[1]"]
    decoded = decode(out.getvalue(), pickled=lambda index: Pickled(index))
    assert decoded["state"]["nodes"][LONE]["state"] == [LONE, Pickled(0)]
    assert decoded["state"]["nodes"]["a"] == body["state"]["nodes"]["a"]


def test_a_payload_with_a_lone_surrogate_reads_back() -> None:
    out = io.BytesIO()
    body: dict[str, Any] = {"state": {"ids": {LONE, "b"}, "where": [(LONE, i) for i in range(30)]},
                            "graph": b"g", "service": None}
    record, _ = _payload.write(body, out.write)
    from snapshot import schema

    info = schema.PayloadRecord(len(out.getvalue()), "", encoding=record["encoding"], data=record["data"])
    assert _payload.read(out.getvalue(), info, trusted=False, source="<test>") == body
