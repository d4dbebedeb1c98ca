"""The exceptions smelt raises, with the command line's messages.

Every one is a :class:`smelt.Error`. ``is_bug`` tells smelt's own bug
(:class:`InternalError`: please report it) from a problem with the model or
the arguments.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

__all__ = ["Error", "ModelError", "UnsupportedError", "UsageError", "MemoryLimitError", "InternalError"]


class Error(Exception):
    """Something smelt could not do; ``str(e)`` says what, as the CLI does."""

    is_bug: bool

    def __init__(self, message: str, is_bug: bool = False, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.is_bug = is_bug
        for k, v in fields.items():
            setattr(self, k, v)


class ModelError(Error):
    """The model cannot be read, imported or verified (a corrupt or invalid file)."""


class UnsupportedError(Error):
    """The model uses an op, attribute or dtype smelt does not support; the message names the node."""


class UsageError(Error, ValueError):
    """An argument does not apply or has a bad value (also a ``ValueError``)."""


class MemoryLimitError(Error):
    """The plan does not fit the memory limit.

    Attributes: ``limit`` and ``arena`` (bytes), ``smaller_batch`` (``(batch,
    arena_bytes)`` of the largest halved batch that fits, or ``None``),
    ``advice`` (what would help, one line each) and, from :meth:`Model.plan`,
    ``plan`` (the :class:`Plan` that did not fit) or, from :meth:`Model.fit`,
    ``fit`` (the :class:`Fit` with every candidate tried).
    """

    limit: Optional[int]
    arena: Optional[int]
    smaller_batch: Optional[Tuple[int, int]]

    def __init__(self, message: str, is_bug: bool = False, **fields: Any) -> None:
        fields.setdefault("limit", None)
        fields.setdefault("arena", None)
        fields.setdefault("smaller_batch", None)
        super().__init__(message, is_bug, **fields)
        if self.smaller_batch is not None:
            self.smaller_batch = tuple(self.smaller_batch)
        self.plan = None
        self.fit = None

    @property
    def advice(self) -> List[str]:
        """What would help, from the message's list."""
        lines = self.message.split("what would help:", 1)
        if len(lines) < 2:
            return []
        return [l.strip()[2:] for l in lines[1].splitlines() if l.strip().startswith("- ")]


class InternalError(Error):
    """A bug in smelt (a plan that failed its checker, an impossible state): please report it."""
