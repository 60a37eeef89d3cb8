"""A decision that raises for one object stops that object only.

The controllers decide every object of a kind in one pure pass. A bug that one object's values
trigger (a stored object may have been written by anyone, or by a newer SC) used to raise out of
the whole pass: the task came back with a full pass, met the same object, and raised again, so
one object stopped its controller for every other one (Kubernetes' controllers requeue the one
object instead). Each per-object step of a pass now hands its exception to a ``Faults``:

- the controllers' loops give an isolating one: the object is left as it is for this pass (no
  action, no answer), and the loop logs it with its name and counts it
  (``sc_reconcile_faults_total{controller,kind}``); it is decided again when it or what it depends
  on changes, or at the next full pass;
- everywhere else (the pure decisions called directly, as the tests and property tests do) the
  default re-raises, so a decision's bug is never hidden from them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str  # the object's kind ("topics", "partitions", ...)
    name: str
    error: Exception


class Faults:
    def __init__(self, isolate: bool = False) -> None:
        self.isolate = isolate
        self._raised: list[Fault] = []

    def record(self, kind: str, name: str, error: Exception) -> None:
        """Called from the ``except`` of one object's step: keeps the fault when isolating, else
        raises ``error`` again."""
        if not self.isolate:
            raise error
        self._raised.append(Fault(kind, name, error))

    def take(self) -> list[Fault]:
        """The faults recorded since the last call."""
        raised, self._raised = self._raised, []
        return raised


# What a decision called outside a controller loop is given: nothing is isolated.
RAISE = Faults()
