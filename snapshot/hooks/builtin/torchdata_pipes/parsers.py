"""Hooks for torchdata 0.9's parsers of streams: ``readlines``, ``parse_csv``,
``parse_csv_as_dict``, ``parse_json_files`` and ``load_from_tfrecord`` (and ``lines_to_paragraphs``).

The line and record readers save the address of the stream they are reading and the byte
offset after the last line or record they yielded (plus a CSV file's header for
``parse_csv_as_dict``); a restore reopens the stream there. A compressed stream (through
``decompress``) is re-inflated from the start of the current file up to that offset, never
the files before it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from snapshot.hooks._base import ResumableIterator, Stateless
from snapshot.hooks.builtin._reader import KeepsAddresses, OffsetReading, StreamReading, reopenable
from snapshot.hooks.builtin._streams import address_of, reopen, reopen_many

__all__ = ["CSVParserIterator", "JsonParserIterator", "LineReaderIterator", "ParagraphAggregatorIterator",
           "TFRecordLoaderIterator"]

OFFSET = "offset"
FIELDNAMES = "fieldnames"


def _skip(stream: Any, count: int) -> None:
    """Skip the first ``count`` lines (as the pipes do before their first sample of a stream)."""
    for _ in range(count):
        if not stream.readline():
            return


def _lines(stream: Any, close: bool = True) -> Iterator[Any]:
    """The lines of ``stream`` (as iterating it gives them), read with ``readline`` so that
    ``tell()`` stays valid; the stream is closed at the end (with ``close``)."""
    readline = stream.readline
    try:
        while True:
            line = readline()
            if not line:
                return
            yield line
    finally:
        if close:
            stream.close()


class _LineBased(StreamReading):
    """A reader of lines whose position is the byte offset after the last line it used."""

    def start(self, path: str, stream: Any) -> Iterator[Any]:
        _skip(stream, self.datapipe._helper._skip_lines)
        return self.addressed(stream, self.samples(path, _lines(stream), None))

    def resume(self, path: str, address: dict[str, Any], position: Any) -> Iterator[Any]:
        stream = self.reopen(address, position[OFFSET])
        return self.addressed(stream, self.samples(path, _lines(stream), position))

    def parse(self, path: str, stream: Any, address: dict[str, Any]) -> Iterator[Any]:
        return self.samples(path, _lines(stream, close=False), address, live=False)

    def samples(self, path: str, lines: Iterator[Any], position: Any, live: bool = True) -> Iterator[Any]:
        """The samples made of ``lines``; ``position`` is a saved position or address (or ``None``
        at a stream's start); ``live=False`` for :meth:`fetch` (this iterator's position unchanged)."""
        raise NotImplementedError

    def position(self) -> Any:
        return {OFFSET: self._stream.tell()}


class LineReaderIterator(_LineBased):
    """``readlines``: the lines of each stream; state: the stream's address and the byte offset
    after the last line yielded."""

    def samples(self, path: str, lines: Iterator[Any], position: Any, live: bool = True) -> Iterator[Any]:
        helper = self.datapipe._helper
        return iter(helper.return_path(helper.decode(helper.strip_newline(lines)), path=path))


class CSVParserIterator(_LineBased):
    """``parse_csv`` and ``parse_csv_as_dict``: the rows of each stream; state: the stream's address,
    the byte offset after the last row yielded and (for dicts) the file's header."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._reader: Any = None

    def samples(self, path: str, lines: Iterator[Any], position: Any, live: bool = True) -> Iterator[Any]:
        dp, helper = self.datapipe, self.datapipe._helper
        params = dict(dp.fmtparams)
        if position is not None and position.get(FIELDNAMES) is not None:
            params["fieldnames"] = position[FIELDNAMES]
        reader = dp._csv_reader(helper.decode(lines), **params)
        if hasattr(reader, "fieldnames"):
            reader.fieldnames  # noqa: B018  (reads the header now: a row's offset is then its own)
        if live:
            self._reader = reader
        return iter(helper.return_path(helper.as_tuple(reader), path=path))

    def _fieldnames(self) -> list[str] | None:
        names = getattr(self._reader, "_fieldnames", None)
        return list(names) if names is not None else None

    def position(self) -> Any:
        return {OFFSET: self._stream.tell(), FIELDNAMES: self._fieldnames()}

    def address_extra(self) -> dict[str, Any]:
        return {FIELDNAMES: self._fieldnames()}


class ParagraphAggregatorIterator(ResumableIterator):
    """``lines_to_paragraphs``: consecutive non-empty lines of one file joined; state: the file and
    the lines of the paragraph being gathered."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._file: Any = None
        self._lines: list[Any] = []
        self._ended = False

    def next(self) -> Any:
        if self._ended:
            raise StopIteration
        for filename, line in self.inputs[0]:
            if self._file is None:
                self._file = filename
            if line and self._file == filename:
                self._lines.append(line)
                continue
            done, previous = self._lines, self._file
            self._lines, self._file = ([line] if line else []), filename
            if done:
                return previous, self.datapipe.joiner(done)
        self._ended = True
        if self._lines:
            done, self._lines = self._lines, []
            return self._file, self.datapipe.joiner(done)
        raise StopIteration

    def buffered(self) -> int:
        return len(self._lines)

    def get_state(self) -> dict[str, Any]:
        return {"file": self._file, "lines": list(self._lines), "ended": self._ended}

    def set_state(self, state: dict[str, Any]) -> None:
        self._file, self._lines, self._ended = state["file"], list(state["lines"]), bool(state["ended"])


class JsonParserIterator(KeepsAddresses, Stateless):
    """``parse_json_files``: ``(path, json.loads(stream.read()))`` per stream."""

    always_restorable = False

    @classmethod
    def replays_input(cls, node: Any, graph: Any) -> str | None:
        # what it reads is whole: nothing to read again, but a buffer above it may hold streams, which
        # a replay of its input (one item per stream) puts back where a state could not hold them
        why = reopenable(node, graph)
        return None if why is None else f"{why}: its input is replayed (one item per stream)"

    def next(self) -> Any:
        name, stream = next(self.inputs[0])
        if self._tracking:
            address = address_of(stream)
            self._last = None if address is None else {"name": name, "address": address}
        return self._parse(name, stream)

    def _parse(self, name: str, stream: Any) -> Any:
        data = stream.read()
        stream.close()
        return name, json.loads(data, **self.datapipe.kwargs)

    def fetch(self, address: Any) -> Any:
        return self._parse(address["name"], reopen(address["address"]))

    def fetch_many(self, addresses: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        for index, stream in reopen_many([a["address"] for a in addresses]):
            yield index, self._parse(addresses[index]["name"], stream)


class TFRecordLoaderIterator(OffsetReading):
    """``load_from_tfrecord``: the examples of each stream; state: the stream's address and the byte
    offset after the last record yielded."""

    def read(self, path: str, stream: Any) -> Iterator[Any]:
        from torchdata.datapipes.iter.util import tfrecordloader as tf
        from torchdata.datapipes.iter.util.protobuf_template import _tfrecord_example_pb2 as pb2

        for record in tf.iterate_tfrecord_file(stream):
            example = pb2.SequenceExample()
            example.ParseFromString(record)
            yield tf.parse_tfrecord_sequence_example(example, self.datapipe.spec)
