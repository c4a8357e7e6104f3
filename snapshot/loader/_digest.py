"""Digests of samples' content, stable across processes (``save_snapshot(verify=K)`` records them;
the manifest calls them ``verify.fingerprints``, a name kept by format version 1), and the digests of
the samples a loader has ahead, which saving records and restoring compares."""

from __future__ import annotations

import hashlib
import pickle
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from snapshot.loader._parts import LoaderParts

__all__ = ["digests_ahead", "sample_digest"]


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


def digests_ahead(loader: LoaderParts, count: int) -> dict[str, Any]:
    """Compute up to ``count`` samples ahead (kept for the loader) and digest them (the manifest's ``fingerprints``)."""
    pos = loader._position
    if pos.epoch < 0 or pos.epoch_finished:
        return {"count": 0, "fingerprints": [], "ends": True}
    it = pos.datapipe_iter
    while it is not None and len(pos.lookahead) < count:
        try:
            pos.lookahead.append(next(it))
        except StopIteration:
            break
    ahead = list(pos.lookahead)[:count]
    return {"count": count, "fingerprints": [sample_digest(x) for x in ahead],
            "ends": len(ahead) < count}
