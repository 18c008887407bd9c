"""``Frozen`` and ``Record``: records written by hand, for the hot classes a process imports at start.

``@dataclass(frozen=True)`` generates six methods per class by compiling source text at import, and edgetrain's
start imports a dozen such classes (with the rest, dataclasses took ~40% of importing ``edgetrain.api`` beyond
numpy). A subclass writes its ``__init__`` (fields stored in ``__dict__`` in declaration order, through
``_set``); equality, hashing, repr and the refusal to assign are those of a frozen dataclass, by field values.
``Record`` is the mutable form (a plain ``@dataclass``: equality by fields, unhashable). Instances keep a
``__dict__`` so they pickle and copy as dataclass instances do. Fields are the first ``len(_fields)`` entries of
``__dict__``; attributes set later (``Record`` only) are not compared or shown, as in a dataclass.
"""
from __future__ import annotations

from dataclasses import FrozenInstanceError


class Frozen:
    __slots__ = ()

    def _set(self, **fields) -> None:
        """Set the fields once, from ``__init__`` (keyword order is declaration order: it fixes hash and repr)."""
        self.__dict__.update(fields)

    def __setattr__(self, name, value):
        raise FrozenInstanceError(f"cannot assign to field '{name}'")

    def __delattr__(self, name):
        raise FrozenInstanceError(f"cannot delete field '{name}'")

    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return self.__dict__ == other.__dict__
        return NotImplemented

    def __hash__(self):
        return hash(tuple(self.__dict__.values()))

    def __repr__(self) -> str:
        return f"{type(self).__qualname__}({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


class Record:
    """A mutable record: ``_fields`` names the fields, which ``__init__`` assigns first and in that order."""
    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def _values(self) -> tuple:
        d = self.__dict__
        return tuple(d[f] for f in self._fields)

    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return self._values() == other._values()
        return NotImplemented

    __hash__ = None         # mutable and compared by value, as a dataclass with eq=True

    def __repr__(self) -> str:
        d = self.__dict__
        return f"{type(self).__qualname__}({', '.join(f'{k}={d[k]!r}' for k in self._fields)})"
