"""Progress bars for long restores and saves: on a terminal only, or when asked.

Whether a bar is shown is decided, first rule that applies:

1. ``snapshot._progress.enabled`` (``True`` / ``False``), set by code;
2. the environment variable ``SNAPSHOT_PROGRESS`` (``1`` / ``0``, also ``true``/``false``,
   ``yes``/``no``, ``on``/``off``);
3. never under CI (``CI`` set to anything but ``0``/``false``), so CI logs stay clean;
4. otherwise only when standard error is a terminal.

Bars use tqdm, which is optional: without it there is simply no bar. A bar also waits
:data:`DELAY` seconds before it draws, so that short operations never show one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import IO, Any

__all__ = ["DELAY", "ENV", "Bar", "bar", "enabled", "wanted"]

#: Set to ``True`` or ``False`` to force bars on or off for this process; ``None`` decides.
enabled: bool | None = None
#: The environment variable that asks for (``1``) or refuses (``0``) bars.
ENV = "SNAPSHOT_PROGRESS"
#: Seconds an operation runs before its bar appears.
DELAY = 1.0

_YES = {"1", "true", "yes", "on"}
_NO = {"0", "false", "no", "off", ""}


def wanted(environ: Mapping[str, str] | None = None, stream: IO[str] | None = None) -> bool:
    """Whether a long operation should show a bar (see the module docstring for the rules)."""
    if enabled is not None:
        return enabled
    env = os.environ if environ is None else environ
    asked = env.get(ENV)
    if asked is not None and asked.strip().lower() in _YES:
        return True
    if asked is not None and asked.strip().lower() in _NO:
        return False
    if env.get("CI", "").strip().lower() not in _NO:
        return False
    out = sys.stderr if stream is None else stream
    isatty = getattr(out, "isatty", None)
    return bool(isatty is not None and isatty())


class Bar:
    """What :func:`bar` yields: ``update(n)`` advances the bar (a no-op when none is shown)."""

    def __init__(self, impl: Any = None):
        self._impl = impl
        self.count = 0

    @property
    def shown(self) -> bool:
        return self._impl is not None

    def update(self, n: int = 1) -> None:
        self.count += n
        if self._impl is not None:
            self._impl.update(n)


@contextmanager
def bar(total: int | None, description: str, *, minimum: int = 1, unit: str = "it",
        unit_scale: bool = False) -> Iterator[Bar]:
    """A bar of ``total`` steps if ``total >= minimum``, :func:`wanted` and tqdm is installed; else a silent one.

    ``total=None``: a count of unknown end (a save that streams), shown once it has run for ``DELAY`` seconds."""
    impl = None
    if (total is None or total >= minimum) and wanted():
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        if tqdm is not None:
            impl = tqdm(total=total, desc=description, unit=unit, unit_scale=unit_scale, leave=False,
                        delay=DELAY, file=sys.stderr, dynamic_ncols=True)
    try:
        yield Bar(impl)
    finally:
        if impl is not None:
            impl.close()
