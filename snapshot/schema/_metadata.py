"""``save_snapshot(metadata=...)``: the user's plain JSON data, as the manifest keeps it."""

from __future__ import annotations

import json
import math
from typing import Any

from snapshot.schema._fields import _object

#: The most bytes ``save_snapshot(metadata=...)`` takes, as compact UTF-8 JSON: a step number, a run
#: name, the model file's name; not the model (which belongs in a file of its own beside the snapshot).
METADATA_LIMIT = 64 * 1024


def check_metadata(metadata: Any) -> dict[str, Any]:
    """``save_snapshot(metadata=...)`` as the manifest keeps it: a dict of plain JSON data (str keys; str,
    int, finite float, bool, ``None``, lists, tuples (kept as lists) and dicts of these), at most
    :data:`METADATA_LIMIT` bytes as compact JSON. A ``TypeError`` names the first value that is not such
    data, a ``ValueError`` says the size. Metadata describes its own save: a loader restored from a
    snapshot does not carry it into its later saves."""
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict of plain JSON data, not a {type(metadata).__name__}")
    plain = _plain(metadata, "metadata")
    size = len(json.dumps(plain, separators=(",", ":"), ensure_ascii=False).encode())
    if size > METADATA_LIMIT:
        raise ValueError(f"metadata is {size:,} bytes as JSON, over the limit of {METADATA_LIMIT:,} bytes: keep "
                         "small values there (a step, a run name, the model file's name), and large ones in a file "
                         "of your own beside the snapshot")
    return plain


def _plain(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"{where} is {value!r}, which JSON cannot hold: give a finite number or a string")
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"{where} has the key {key!r}: metadata keys are strings (JSON's)")
        return {key: _plain(item, f"{where}[{key!r}]") for key, item in value.items()}
    raise TypeError(f"{where} is a {type(value).__module__}.{type(value).__qualname__}: metadata holds plain JSON "
                    "data only (str, int, float, bool, None, lists and dicts of these); convert it (a tensor's "
                    ".item() or .tolist()), or save it in a file of your own")


def _metadata(value: Any, where: str) -> dict[str, Any]:
    return dict(_object(value, where))
