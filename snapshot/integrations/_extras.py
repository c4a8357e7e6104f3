"""Import a tool an integration needs, or say which extra installs it."""

from __future__ import annotations

import importlib
from types import ModuleType

from snapshot._version import DISTRIBUTION

__all__ = ["require"]


def require(module: str, extra: str, what: str) -> ModuleType:
    """``import module``; if it is missing, an ``ImportError`` that names the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{what} needs the {module!r} package, which is not installed: "
            f"pip install '{DISTRIBUTION}[{extra}]'") from exc
