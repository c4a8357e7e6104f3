"""Messages between the main process and its workers, with array data sent out of band.

Samples, and the states a restore sends to the workers or a snapshot takes from them, are pickled
with protocol 5; the bytes of CPU tensors and numpy arrays are not
copied into the pickle but written to the pipe straight from their memory, and read on the
other side (``os.readv``) straight into fresh writable buffers that the rebuilt arrays and
tensors use directly: a batch crosses with the one copy the kernel makes. A message is an
8-byte length, the pickle with a header of buffer sizes, then the buffers.
"""

from __future__ import annotations

import io
import os
import pickle
import queue
import select
import struct
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch

__all__ = ["Sender", "encode", "receive", "send", "send_within"]

_COUNT = struct.Struct("<I")
_SIZE = struct.Struct("<Q")


def _tensor_from_array(array: Any) -> torch.Tensor:
    return torch.from_numpy(array)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is torch.Tensor and obj.device.type == "cpu" and obj.layout is torch.strided \
                and not obj.requires_grad and obj.dtype not in _NO_NUMPY:
            return _tensor_from_array, (obj.detach().contiguous().numpy(),)
        return NotImplemented


_NO_NUMPY = {torch.bfloat16, torch.complex32, torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32,
             torch.uint64}


def encode(message: Any) -> list[Any]:
    """The frames of ``message``: length + pickle (with a header of buffer sizes), then each buffer.

    Raises the pickling error here, in the caller, before anything is sent.
    """
    buffers: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=buffers.append).dump(message)
    views = [b.raw() for b in buffers]
    header = _COUNT.pack(len(views)) + b"".join(_SIZE.pack(v.nbytes) for v in views)
    body = header + out.getbuffer()
    return [_SIZE.pack(len(body)) + body, *views]


def _write_all(fd: int, data: Any) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exact(fd: int, size: int, idle: Callable[[], None] | None = None) -> bytearray:
    buffer = bytearray(size)
    view = memoryview(buffer)
    waiting = None
    if idle is not None:
        waiting = select.poll()
        waiting.register(fd, select.POLLIN)
    while view:
        while waiting is not None and not waiting.poll(1000):
            assert idle is not None
            idle()
        got = os.readv(fd, [view])
        if got == 0:
            raise EOFError("the other process closed the connection")
        view = view[got:]
    return buffer


def send(connection: Connection, message: Any) -> None:
    """Send ``message`` on a pipe whose other end reads with :func:`receive`."""
    fd = connection.fileno()
    for frame in encode(message):
        _write_all(fd, frame)


def send_within(connection: Connection, frames: list[Any], timeout: float) -> None:
    """Write ``frames`` (from :func:`encode`) on a pipe, waiting at most ``timeout`` seconds for
    the other end to make room: ``TimeoutError`` if it does not (a large restore state does not
    fit in the pipe, and a worker that stopped reading must not hang the main process)."""
    fd = connection.fileno()
    os.set_blocking(fd, False)
    room = select.poll()
    room.register(fd, select.POLLOUT)
    deadline = time.monotonic() + timeout
    for frame in frames:
        view = memoryview(frame).cast("B")
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"the other process did not read the message within {timeout:g} s") from None
                room.poll(min(remaining, 1.0) * 1000)


def receive(connection: Connection, idle: Callable[[], None] | None = None) -> Any:
    """Inverse of :func:`send`: one message, its array buffers read in place. ``idle`` is called
    each second that the rest of a message does not come (it raises to give up: a worker whose
    main process died in the middle of a message must not wait for the rest)."""
    fd = connection.fileno()
    (length,) = _SIZE.unpack(_read_exact(fd, _SIZE.size, idle))
    body = _read_exact(fd, length, idle)
    (count,) = _COUNT.unpack_from(body)
    sizes = [_SIZE.unpack_from(body, _COUNT.size + i * _SIZE.size)[0] for i in range(count)]
    buffers = [_read_exact(fd, size, idle) for size in sizes]
    return pickle.loads(memoryview(body)[_COUNT.size + count * _SIZE.size:], buffers=buffers)


class Sender:
    """Sends messages from a background thread, so that the caller keeps computing while a
    large message drains through the pipe (the role of ``multiprocessing.Queue``'s feeder).

    Messages go out in the order :meth:`send` was called. A message that cannot be pickled
    raises in the caller.
    """

    def __init__(self, connection: Connection):
        self.connection = connection
        self._fd = connection.fileno()
        self._queue: queue.SimpleQueue[list[Any] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="snapshot-sender", daemon=True)
        self._thread.start()

    def send(self, message: Any) -> None:
        self._queue.put(encode(message))

    def _run(self) -> None:
        while True:
            frames = self._queue.get()
            if frames is None:
                return
            try:
                for frame in frames:
                    _write_all(self._fd, frame)
            except OSError:
                return  # the main process is gone

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, then stop the thread."""
        self._queue.put(None)
        self._thread.join(timeout)
