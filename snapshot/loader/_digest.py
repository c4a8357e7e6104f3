"""Digests of samples' content, stable across processes (``save_snapshot(verify=K)`` records them;
the manifest calls them ``verify.fingerprints``, a name kept by format version 1). The loader's
position digests the samples it has ahead (``LivePosition.ahead``); saving records them and
restoring compares."""

from __future__ import annotations

import hashlib
import pickle
from typing import Any

import torch

__all__ = ["sample_digest"]


def _feed(h: Any, obj: Any, depth: int = 0) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif type(obj).__module__ == "numpy" and hasattr(obj, "tobytes"):
        h.update(f"N{getattr(obj, 'dtype', '')}{getattr(obj, 'shape', '')}".encode())
        h.update(obj.tobytes())
    elif isinstance(obj, (str, bytes, int, float, bool, type(None))):
        h.update(f"{type(obj).__name__}:".encode())
        h.update(obj if isinstance(obj, bytes) else repr(obj).encode())
    elif isinstance(obj, (list, tuple)) and depth < 32:
        h.update(f"{type(obj).__name__}[{len(obj)}](".encode())
        for item in obj:
            _feed(h, item, depth + 1)
        h.update(b")")
    elif isinstance(obj, dict) and depth < 32:
        h.update(f"dict[{len(obj)}](".encode())
        for key, value in obj.items():
            _feed(h, key, depth + 1)
            _feed(h, value, depth + 1)
        h.update(b")")
    else:
        try:
            h.update(pickle.dumps(obj, protocol=4))
        except Exception:  # noqa: BLE001 - an unpicklable sample still gets a (weaker) print
            h.update(f"{type(obj).__qualname__}:{obj!r}".encode())


def sample_digest(sample: Any) -> str:
    """A short hex digest of a sample's content (tensors by dtype, shape and bytes)."""
    h = hashlib.sha256()
    _feed(h, sample)
    return h.hexdigest()[:16]
