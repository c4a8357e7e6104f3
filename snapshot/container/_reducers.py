"""Compact pickles of the random generators a graph holds.

A ``random.Random`` pickles its state as 625 ints, and unpickling draws a seed from the OS before
overwriting it; torch's ``Shuffler`` does the same in its ``__getstate__``/``__setstate__``. That was
two thirds of copying a small graph (0.14 of 0.19 ms). Here the state travels as 2,500 bytes and is
set on a generator that nothing seeded. The unpickled objects are the ones the stock pickle gives,
state for state.

The functions below the reducers are named in the pickles of graphs that snapshots keep: their
names and arguments stay as they are (a file saved with them loads wherever this module imports).
"""

from __future__ import annotations

import copyreg
import functools
import pickle
import random
import struct
import threading
from typing import Any

__all__ = ["dispatch_table", "random_from_bytes", "set_shuffler_state"]

#: The Mersenne Twister's state as ``getstate()`` gives it (version 3): 624 words and the index.
_WORDS = struct.Struct("<625I")
_VERSION = 3
#: What ``object.__reduce_ex__`` names for protocols 2 and above (the pickle's NEWOBJ).
_NEWOBJ = copyreg.__newobj__  # type: ignore[attr-defined]


def dispatch_table() -> dict[Any, Any]:
    """``copyreg``'s reducers as they are now (libraries register theirs at any time), and ours."""
    table = dict(copyreg.dispatch_table)
    table.update(_ours())
    return table


@functools.cache
def _ours() -> dict[type, Any]:
    from torch.utils.data.datapipes.iter.combinatorics import ShufflerIterDataPipe

    # exact types only: a subclass may keep more state, or other state, than these read and set
    return {random.Random: _reduce_random, ShufflerIterDataPipe: _reduce_shuffler}


def _packed(state: Any) -> bytes | None:
    """The words of a ``random.Random.getstate()`` as bytes (``None``: not a state this packs)."""
    if type(state) is tuple and len(state) == 3 and state[0] == _VERSION and type(state[1]) is tuple:
        try:
            words = _WORDS.pack(*state[1])
        except struct.error:  # not 625 words of 32 bits: left to the stock pickle
            return None
        _remember(words, state[1])
        return words
    return None


#: The words of the states packed last, by their bytes: a graph copied in this process is unpickled
#: right after it was pickled, and a state's 625 ints cost as much to make again as to pickle.
#: A state's words are what its bytes say, so any thread may take them from here.
_UNPACKED: dict[bytes, tuple[int, ...]] = {}
_REMEMBERED = 16
_remembering = threading.Lock()


def _remember(words: bytes, unpacked: tuple[int, ...]) -> None:
    with _remembering:
        if len(_UNPACKED) >= _REMEMBERED:
            del _UNPACKED[next(iter(_UNPACKED))]  # the oldest
        _UNPACKED[words] = unpacked


def _reduce_random(rng: random.Random) -> Any:
    state = rng.getstate()
    words = _packed(state)
    if words is None:
        return rng.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    return random_from_bytes, (words, state[2])


def _reduce_shuffler(pipe: Any) -> Any:
    cls = type(pipe)  # IterDataPipe's hooks, through the class
    if cls.getstate_hook is not None or cls.reduce_ex_hook is not None:
        return pipe.__reduce_ex__(pickle.HIGHEST_PROTOCOL)  # torch traverses or serializes the graph its own way
    # what object.__reduce_ex__ gives for protocol 2 and above, the generator's state packed
    state = pipe.__getstate__()
    words = _packed(state[5]) if type(state) is tuple and len(state) == 8 else None
    if words is None:
        return pipe.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    return (_NEWOBJ, (cls,), (*state[:5], (words, state[5][2]), *state[6:]), None, None,
            set_shuffler_state)


def random_from_bytes(words: bytes, gauss_next: float | None) -> random.Random:
    """A ``random.Random`` in the state that :func:`_reduce_random` packed (never seeded from the OS)."""
    rng = random.Random.__new__(random.Random)
    unpacked = _UNPACKED.get(words)
    rng.setstate((_VERSION, _WORDS.unpack(words) if unpacked is None else unpacked, gauss_next))
    return rng


def set_shuffler_state(pipe: Any, state: tuple[Any, ...]) -> None:
    """torch's ``Shuffler.__setstate__``, with the generator's state packed as :func:`_reduce_shuffler` packs it."""
    (pipe.datapipe, pipe.buffer_size, pipe._enabled, pipe._seed, pipe._buffer, rng,
     pipe._valid_iterator_id, pipe._number_of_samples_yielded) = state
    pipe._rng = random_from_bytes(*rng)
