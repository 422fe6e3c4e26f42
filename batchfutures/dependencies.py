"""Futures as arguments: a call's inputs can be other calls' results, read in the worker.

    client                                              worker
    ------                                              ------
    ex.submit(g, fut)   fut -> FutureRef(job_url, child, item)   resolve(args): GET results/<child>
                        + dependsOn upstream job (N_TO_N when        of the upstream job (once per
                          child i needs only upstream child i)       child), item's outcome:
                                                                   ok    -> the value
                                                                   error -> UpstreamFailed: the item's
                                                                            outcome is "dependency",
                                                                            carrying the upstream outcome

Values never travel through the client: the worker reads them from storage. Batch starts the
dependent job only once its dependencies ended; a dependency that failed as a container makes
Batch fail the dependent job ("Dependent Job failed"), one whose function raised makes only the
items that use it fail, each with `DependencyFailedError` whose `__cause__` is that exception.

A FutureRef is found as an argument itself, or inside a list or tuple argument (one level), as
the contract says; futures nested deeper travel as they are and are refused (not picklable).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import wire
from .errors import IntegrityError, JobFailedError

if TYPE_CHECKING:
    from .storage import Storage

MAX_DEPENDENCIES = 20  # Batch's limit of dependsOn entries per job


@dataclass(frozen=True)
class FutureRef:
    """Where one item's outcome lives: child ``child`` of the job at ``job_url``, item ``item``.

    ``nodes > 1``: the call of a multi-node job, whose value is the list of every node's return
    value in node order; node k's outcome is results/k (child k, item 0)."""

    job_url: str
    child: int
    item: int
    job_id: str  # the upstream call's Batch job id (for messages)
    nodes: int = 1


class UpstreamFailed(Exception):
    """An argument's upstream item did not succeed; carries its encoded outcome."""

    def __init__(self, ref: FutureRef, outcome: bytes) -> None:
        super().__init__(ref.job_id)
        self.ref = ref
        self.outcome = outcome


def substitute(value: Any, replace: Callable[[Any], Optional[Any]]) -> Any:
    """``value`` with each future in it (itself, or in a list/tuple) replaced by ``replace``."""
    direct = replace(value)
    if direct is not None:
        return direct
    if isinstance(value, (list, tuple)):
        replaced = [replace(item) for item in value]
        if any(r is not None for r in replaced):
            items = [item if r is None else r for item, r in zip(value, replaced)]
            return items if isinstance(value, list) else tuple(items)
    return value


def substitute_call(args: tuple, kwargs: Dict[str, Any],
                    replace: Callable[[Any], Optional[Any]]) -> Tuple[tuple, Dict[str, Any]]:
    return (tuple(substitute(a, replace) for a in args),
            {k: substitute(v, replace) for k, v in kwargs.items()})


# -- the worker's side ---------------------------------------------------------------------
class Resolver:
    """Reads upstream results for a child's items, one GET per upstream child, kept.

    ``preload(items)`` reads every one the items refer to before any code runs (a bad seal is
    the job's IntegrityError then); afterwards ``resolve`` reads nothing, so it may run in the
    inner pool's forked sub-processes, which must do no storage I/O (pool.py).
    """

    def __init__(self, storage: Optional[Storage],
                 redirects: Optional[List[List[Any]]] = None) -> None:
        """``storage``: None in the inner pool's sub-processes (everything was preloaded).
        ``redirects``: [first job_url, child, current job_url, child] of upstream results
        that moved since the FutureRefs were made (a rerun's header, see reruns.py)."""
        self._storage = storage
        # per upstream child: its outcomes, or the outcome saying it wrote no result
        self._outcomes: Dict[Tuple[str, int], Union[List[bytes], bytes]] = {}
        self._moved = {(str(a), int(b)): (str(c), int(d)) for a, b, c, d in redirects or ()}

    def _outcome(self, ref: FutureRef) -> bytes:
        key = self._moved.get((ref.job_url, ref.child), (ref.job_url, ref.child))
        if key not in self._outcomes:
            if self._storage is None:
                raise RuntimeError(f"{ref.job_id or 'an upstream result'} was not preloaded")
            data = self._storage.read_result(*key) if key[0] else None
            if data is None:  # failed as a container, or cancelled: it wrote no result
                self._outcomes[key] = wire.encode_error(JobFailedError(
                    f"{ref.job_id or 'an upstream call'} ended without a result (it failed, or "
                    f"was cancelled)", job_id=ref.job_id or None))
            else:
                self._outcomes[key] = wire.unpack_result(data)[1]
        found = self._outcomes[key]
        if isinstance(found, bytes):
            raise UpstreamFailed(ref, found)
        return found[ref.item]

    def preload(self, items: Sequence[Tuple[int, tuple, Dict[str, Any]]]) -> None:
        """Read (and check the seal of) every upstream result the items' arguments refer to.
        IntegrityError and MemoryError propagate; a missing result or item is kept for the
        item's own outcome."""
        refs: List[FutureRef] = []

        def collect(value: Any) -> None:
            if isinstance(value, FutureRef):
                refs.append(value)
            return None

        for _, args, kwargs in items:
            if has_refs(args, kwargs):
                substitute_call(args, kwargs, collect)
        for ref in refs:
            for child in range(ref.nodes) if ref.nodes > 1 else (ref.child,):
                try:
                    self._outcome(FutureRef(ref.job_url, child, 0 if ref.nodes > 1 else ref.item,
                                            ref.job_id))
                except (MemoryError, IntegrityError):
                    raise
                except Exception:  # a missing result or item: that item's outcome says so
                    pass

    def value(self, ref: FutureRef) -> Any:
        if ref.nodes > 1:  # as the client's jobs.combine_node_results: each node's, in order
            return [self.value(FutureRef(ref.job_url, node, 0, f"{ref.job_id}#{node}"))
                    for node in range(ref.nodes)]
        outcome = self._outcome(ref)
        if wire.outcome_kind(outcome) != wire.OK:
            raise UpstreamFailed(ref, outcome)
        ok, value = wire.outcome_result(outcome)
        if not ok:  # it succeeded but cannot be loaded here
            raise UpstreamFailed(ref, outcome)
        return value

    def resolve(self, args: tuple, kwargs: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
        """The call's arguments with every FutureRef replaced by its value (UpstreamFailed)."""

        def replace(value: Any) -> Optional[Any]:
            return _Found(self.value(value)) if isinstance(value, FutureRef) else None

        def unwrap(value: Any) -> Any:
            if isinstance(value, _Found):
                return value.value
            if isinstance(value, (list, tuple)) and any(isinstance(v, _Found) for v in value):
                items = [unwrap(v) for v in value]
                return items if isinstance(value, list) else tuple(items)
            return value

        new_args, new_kwargs = substitute_call(args, kwargs, replace)
        return tuple(unwrap(a) for a in new_args), {k: unwrap(v) for k, v in new_kwargs.items()}


@dataclass
class _Found:
    value: Any


def has_refs(args: tuple, kwargs: Dict[str, Any]) -> bool:
    def is_ref(value: Any) -> bool:
        return isinstance(value, FutureRef) or (
            isinstance(value, (list, tuple)) and any(isinstance(v, FutureRef) for v in value))

    return any(is_ref(a) for a in args) or any(is_ref(v) for v in kwargs.values())
