"""The command's exit codes, and the error that carries one."""

from __future__ import annotations

__all__ = ["EXIT_INVALID", "EXIT_OK", "EXIT_PROBLEM", "EXIT_UNAVAILABLE", "CommandError"]

#: Success: printed; verify found no problem; diff found no difference.
EXIT_OK = 0
#: verify found a problem in the file; diff found differences.
EXIT_PROBLEM = 1
#: A usage error, or an input that cannot be read or is not a valid snapshot.
EXIT_INVALID = 2
#: A program the command needs (Graphviz's ``dot``) is missing or failed.
EXIT_UNAVAILABLE = 3


class CommandError(Exception):
    """A failure the command reports as ``snapshot: <message>`` with exit code ``code``."""

    def __init__(self, message: str, code: int = EXIT_INVALID):
        super().__init__(message)
        self.code = code
