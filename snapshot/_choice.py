"""Policy enums: trade-offs a user picks by name (``strategy="auto"``) and the manifest records."""

from __future__ import annotations

import enum
from typing import TypeVar

__all__ = ["Choice"]

C = TypeVar("C", bound="Choice")


class Choice(str, enum.Enum):
    """A ``str`` enum whose :meth:`parse` accepts a member or its value and names the choices."""

    @classmethod
    def label(cls) -> str:
        """What the choice is called in error messages."""
        return cls.__name__

    @classmethod
    def parse(cls: type[C], value: C | str) -> C:
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value))
        except ValueError:
            choices = ", ".join(repr(s.value) for s in cls)
            raise ValueError(f"unknown {cls.label()} {value!r}; choose one of {choices}") from None
