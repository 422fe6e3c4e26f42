"""The two wire formats between client and worker: a job's inputs object (a header and each
child's items) and a child's result object (its items' outcomes). Pickling itself (cloudpickle,
the client's own modules by value, the version stamp) is serialization.py's; storage.py writes
and reads these bytes, sealing and checking them; layout.py names them.

    client                                       worker
    ------                                       ------
    serialization.dumps(fn) -> functions/<sha>.pkl   serialization.loads(data) -> fn
    pack_items(calls)    -> inputs, child blob   unpack_items(blob, encoding)
    pack_arguments(args) -> inputs, child blob       -> [(fn index, args, kwargs)]
                                                 run each item -> encode_ok(value)
                                                                | encode_error(exc, tb)
                                                                | encode_unpicklable(...)
                                                                | encode_mismatch(message)
    unpack_result(data)  <- results/<i>          pack_result(outcomes, meta)
    outcome_result(o)    -> (ok, value or exception): the poller sets it on a future
    decode_outcome(o)    -> value, or raises the exception

A child blob is one cloudpickle of a list, in one of three encodings named by the inputs header's
"encoding" (so map pays for its arguments only, not for a function index and a kwargs dict per
item):

    "calls"  [(function index, args tuple, kwargs dict), ...]   submit: calls coalesced into a job
    "args"   [args tuple, ...]                                    map over several iterables
    "arg"    [argument, ...]                                      map over one iterable

A "calls" blob starts with the function indices its items use, outside the pickle, so the worker
fetches those functions and checks their seals before it unpickles anything, the arguments
included (item_functions; "args" and "arg" items all call function 0):

    b"BFCALLS1" | uint64 LE n | n uint64 LE function indices, ascending | the pickle

Inputs object (``<job>/inputs``), so a child reads its own byte range and nothing
else (the MACs are computed and checked by storage.Storage with its key):

    offset 0      8 bytes         magic b"BFINPUT3"
    offset 8      uint64 LE       H, the length of the JSON header
    offset 16     H bytes         JSON header (UTF-8); "children" holds n. It is the writer's JSON
                                  text B with one more field appended, ``,"hmac":"<64 hex>"}``:
                                  the MAC of exactly B (the bytes up to that field, with "}"), so
                                  a reader checks and parses the very bytes that were signed
    offset 16+H   (n+1) uint64 LE offsets from the start of the object:
                                  child i's range is bytes [offset[i], offset[i+1]); offset[n] = size
                  zero padding    when n > 1, up to PREFIX_READ, so the first read (the prefix)
                                  never holds another child's blob
    offset[0]     the child ranges in order, each a 32-byte tag then the child's blob; the tag is
                  the MAC of (the object's name, i, the header MAC, the blob), so a child checks
                  its own range without reading any other, and a range moved to another child,
                  job or header fails

A child's first read is the fixed prefix [0, PREFIX_READ): the header and, unless there are more
than ~8,000 children, its index entries. Its second read is its blob. (A header longer than the
prefix, or an index entry past it, costs one more read each.) A plain job (n = 1) is not padded:
its one read usually holds its blob too.

Result object (``results/<i>``), one per child, one outcome per item:

    b"BFRESLT1" | uint64 LE M | M bytes JSON meta | uint64 LE K | K uint64 LE outcome lengths
    | the K outcomes, concatenated | the output section (meta["output"] bytes; absent if 0)

The output section (BatchExecutor(echo_output=True)) is what the items printed, one
JSON object for the child, holding only the items that printed something:
``{"<item position>": [stdout, stderr, stdout chars cut, stderr chars cut]}`` (the end of each
stream, at most calls.OUTPUT_LIMIT characters), and a fifth entry, the call's logging records
(worker/logrecords.py), when it logged any (echo_output replays them: logforward.py), and a
sixth, when more than one of the three has something: their order, runs of ``[source, count]``
(outputorder.py: 0 stdout, 1 stderr, 2 records; characters or records, covering the end of each),
so echo_output writes and replays them interleaved as the call made them. It is
read apart from the outcomes (result_output), so decoding an outcome costs what it did; an
object without meta["output"] (written before echo_output existed, or by a child that printed
nothing) has none.

The meta's "usage" (docs/usage.md) is what each item used in its container, measured by the worker
(calls.Meter): one entry per item, in item order, ``[wall_s, cpu_s, peak_mib]`` (peak_mib null
where memory is not measured: the emulator's thread launcher), or null for an item not measured
(its function did not load). Absent when no item was measured: an object written before usage was measured,
a refused job, an initializer that failed. Read apart from the outcomes (result_usage), at no
extra request: it travels in the object the client reads anyway.

Each outcome is its own pickle, so one the client cannot load fails only its own item. An
outcome is a plain pickle of a tuple of builtins; the user's value or exception is a cloudpickle
nested in it as bytes, so the kind, type name, repr and traceback text survive even when the
value itself cannot be loaded on the client:

    ("ok", payload)
    ("error", payload, type name, repr, traceback text)
    ("unpicklable", message, type name, repr, traceback text)
    ("mismatch", message)
    ("dependency", upstream job id, the upstream's outcome)
    ("initializer", the initializer described, its error's outcome)

A remote exception comes back as itself (same type, same args) with ``__cause__`` holding the
remote traceback text, as ``concurrent.futures.process`` does.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import struct
import sys
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

import cloudpickle

from . import logforward, outputorder
from .errors import (
    DependencyFailedError,
    EnvironmentMismatchError,
    InitializerFailedError,
    RemoteError,
    add_note,
)
from .serialization import (
    PROTOCOL,
    Buffer,
    argument_error,
    describe,
    dumps_exception,
    reason,
    try_dumps,
)
from .signing import TAG_SIZE
from .tracebacks import with_source_lines

__all__ = [
    "RemoteTraceback", "pack_items", "pack_arguments", "unpack_items", "item_functions", "CALLS",
    "ARGS", "ARG", "encode_ok", "encode_error", "encode_unpicklable", "encode_mismatch",
    "encode_dependency_failure", "encode_initializer_failure", "pack_result", "unpack_result",
    "outcome_result", "decode_outcome", "outcome_kind", "result_output", "result_usage",
    "echo_output", "INPUTS_MAGIC", "PREFIX_READ", "inputs_header_body", "pack_inputs",
    "index_offset", "split_signed_header", "index_entry", "child_range", "child_number",
]

RESULT_MAGIC = b"BFRESLT1"
OK, ERROR, UNPICKLABLE, MISMATCH = "ok", "error", "unpicklable", "mismatch"
INITIALIZER, DEPENDENCY = "initializer", "dependency"
CALLS, ARGS, ARG = "calls", "args", "arg"  # child blob encodings (the header's "encoding")
CALLS_MAGIC = b"BFCALLS1"
REPR_LIMIT = 2000
_U64 = struct.Struct("<Q")
_PAIR = struct.Struct("<2Q")

INPUTS_MAGIC = b"BFINPUT3"
INPUTS_PREAMBLE = 16  # the magic, then the header's length
HEADER_MAC_FIELD = "hmac"
# the header's last field: ,"hmac":"<64 hex>"} (the "," is absent when it is the only field)
_HEADER_MAC_SUFFIX = re.compile(rb'"hmac":"([0-9a-f]{64})"\}\Z')
PREFIX_READ = 64 * 1024  # a child's first read of the inputs object: bytes [0, PREFIX_READ)
INDEX_ENTRY = 16  # a child's two offsets in the index: where its range starts and ends


class RemoteTraceback(Exception):
    """Holds the remote traceback text; the ``__cause__`` of a re-raised remote exception."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


# -- the inputs object ------------------------------------------------------------------------
def inputs_header_body(header: Dict[str, Any], children: int) -> bytes:
    """The header's JSON as signed: ``header`` with "children" set, keys sorted, no spaces."""
    if HEADER_MAC_FIELD in header:
        raise ValueError(f"the inputs header field {HEADER_MAC_FIELD!r} is the signature's")
    return json.dumps(dict(header, children=children), sort_keys=True,
                      separators=(",", ":")).encode()


def child_number(index: int) -> bytes:
    """Child ``index`` as its range's tag binds it."""
    return _U64.pack(index)


def pack_inputs(body: bytes, header_mac: bytes, tags: Sequence[bytes],
                blobs: Sequence[bytes]) -> bytes:
    """The inputs object: ``body`` (inputs_header_body) with its MAC appended, the index, and
    each child's range (its tag, then its blob); the layout is in the module docstring."""
    header_bytes = b"".join([body[:-1], b"," if body != b"{}" else b"",
                             b'"%s":"%s"}' % (HEADER_MAC_FIELD.encode(), header_mac.hex().encode())])
    table_end = INPUTS_PREAMBLE + len(header_bytes) + 8 * (len(blobs) + 1)
    data_start = max(table_end, PREFIX_READ) if len(blobs) > 1 else table_end
    offsets = [data_start]
    ranges: List[bytes] = []
    for tag, blob in zip(tags, blobs):
        assert len(tag) == TAG_SIZE
        ranges += (tag, blob)
        offsets.append(offsets[-1] + TAG_SIZE + len(blob))
    return b"".join([INPUTS_MAGIC, _U64.pack(len(header_bytes)), header_bytes,
                     struct.pack(f"<{len(offsets)}Q", *offsets),
                     bytes(data_start - table_end), *ranges])


def index_offset(prefix: bytes) -> Optional[int]:
    """Where the index starts (the header ends), from the object's first bytes; None when they
    are not an inputs object's."""
    if len(prefix) < INPUTS_PREAMBLE or prefix[:len(INPUTS_MAGIC)] != INPUTS_MAGIC:
        return None
    (length,) = _U64.unpack_from(prefix, len(INPUTS_MAGIC))
    return INPUTS_PREAMBLE + int(length)


def split_signed_header(stored: bytes) -> Optional[Tuple[bytes, bytes]]:
    """(the exact JSON bytes the header's MAC covers, that MAC) of a stored header; None when
    the header carries no MAC as its last field."""
    match = _HEADER_MAC_SUFFIX.search(stored)
    before = stored[:match.start()] if match else b""
    if match is None or not (before == b"{" or before.endswith(b",")):
        return None
    body = before[:-1] + b"}" if before != b"{" else b"{}"
    return body, bytes.fromhex(match.group(1).decode())


def index_entry(index_start: int, child: int) -> int:
    """Where child ``child``'s index entry (INDEX_ENTRY bytes) starts."""
    return index_start + 8 * child


def child_range(data: bytes, entry: int) -> Tuple[int, int]:
    """[start, stop) of a child's range (its tag, then its blob), from its index entry."""
    start, stop = _PAIR.unpack_from(data, entry)
    return int(start), int(stop)


# -- a child's items (the inputs object's child blobs) ------------------------------------------
def pack_items(items: Sequence[Tuple[int, tuple, dict]], *, first_item: Optional[int] = None,
               by_value: bool = True) -> bytes:
    """A child's blob in the "calls" encoding: (function index, args, kwargs) per item.

    The whole chunk is one pickle (fast). When it fails, the culprit is looked for argument by
    argument so the SerializationError names it; ``first_item`` numbers the items in the
    message (the map position of the chunk's first item).
    """
    items = list(items)
    data, error = try_dumps(items, by_value)
    if data is not None:
        used = sorted({int(function_index) for function_index, _, _ in items})
        return b"".join([CALLS_MAGIC, struct.pack(f"<{len(used) + 1}Q", len(used), *used), data])
    assert error is not None
    raise argument_error([(args, kwargs) for _, args, kwargs in items], error, first_item)


def _calls_header(blob: Buffer) -> Optional[Tuple[List[int], int]]:
    """(function indices, where the pickle starts) of a "calls" blob; None for one written
    without them (before the prefix existed)."""
    view = memoryview(blob)
    if bytes(view[:len(CALLS_MAGIC)]) != CALLS_MAGIC:
        return None
    (count,) = _U64.unpack_from(view, len(CALLS_MAGIC))
    start = len(CALLS_MAGIC) + 8 + 8 * count
    if start > len(view):
        raise ValueError("a corrupt calls blob: its function indices run past its end")
    return list(struct.unpack_from(f"<{count}Q", view, len(CALLS_MAGIC) + 8)), start


def item_functions(blob: Buffer, encoding: str = CALLS) -> Optional[List[int]]:
    """The function indices a child's items call, read without unpickling anything; None when
    the blob does not say (a "calls" blob written without them: every function may be used)."""
    if encoding in (ARGS, ARG):
        return [0]
    found = _calls_header(blob)
    return None if found is None else found[0]


def pack_arguments(chunk: List[Any], *, single: bool, first_item: int,
                   by_value: bool = True) -> bytes:
    """A map child's blob: the "arg" encoding (``single``: one argument per item) or "args".

    A failure names the argument and the map's item number, as pack_items does.
    """
    data, error = try_dumps(chunk, by_value)
    if data is not None:
        return data
    assert error is not None
    raise argument_error([((value,) if single else value, {}) for value in chunk], error, first_item)


def unpack_items(blob: Buffer, encoding: str = CALLS) -> List[Tuple[int, tuple, dict]]:
    """A child's items as (function index, args, kwargs), whatever their encoding."""
    if encoding == CALLS:
        found = _calls_header(blob)
        return cloudpickle.loads(blob if found is None else memoryview(blob)[found[1]:])
    loaded = cloudpickle.loads(blob)
    if encoding == ARGS:
        return [(0, tuple(args), {}) for args in loaded]
    if encoding == ARG:
        return [(0, (argument,), {}) for argument in loaded]
    raise ValueError(f"unknown item encoding {encoding!r}")


# -- outcomes (worker side) ---------------------------------------------------------------------
def _safe_repr(obj: Any) -> str:
    try:
        text = repr(obj)
    except Exception as error:
        text = f"<{type(obj).__name__} object; repr() failed: {reason(error)}>"
    return text if len(text) <= REPR_LIMIT else text[:REPR_LIMIT] + "...(truncated)"


def _type_name(obj: Any) -> str:
    cls = type(obj)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _envelope(*fields: Any) -> bytes:
    return pickle.dumps(fields, protocol=PROTOCOL)


def encode_ok(value: Any) -> bytes:
    """The outcome of an item that returned ``value``.

    A value that cannot be pickled makes the pickling error itself the item's exception, as
    ProcessPoolExecutor does. MemoryError propagates: the worker treats it as running out of
    memory.
    """
    try:
        payload = cloudpickle.dumps(value, protocol=PROTOCOL)
    except MemoryError:
        raise
    except Exception as error:
        note = f"batchfutures: the function returned {_type_name(value)}, which could not be pickled"
        add_note(error, note)  # the note travels with the exception
        text = traceback.format_exc()
        if sys.version_info < (3, 11):  # tracebacks show notes from 3.11 on
            text += note + "\n"
        return encode_error(error, text)
    return _envelope(OK, payload)


def encode_error(error: BaseException, tb_text: Optional[str] = None) -> bytes:
    """The outcome of an item whose call raised ``error`` (any BaseException but MemoryError).

    The exception is also loaded back here: one that pickles but cannot be rebuilt (an
    ``__init__`` with other arguments than its ``args``) is recorded as unpicklable, with its
    type, repr and traceback, rather than failing on the client without them.
    """
    if tb_text is None:
        tb_text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    type_name, repr_text = _type_name(error), _safe_repr(error)
    failure: Optional[BaseException] = None
    for own_reduce in (True, False):  # its own reduce first: the same whatever is imported
        try:
            payload = dumps_exception(error, own_reduce)
            pickle.loads(payload)
        except MemoryError:
            raise
        except BaseException as caught:
            failure = failure or caught
            continue
        return _envelope(ERROR, payload, type_name, repr_text, tb_text)
    return encode_unpicklable(
        f"the function raised {repr_text}, which could not be pickled and loaded back "
        f"({reason(failure) if failure else 'unknown'})", tb_text, type_name=type_name,
        repr_text=repr_text)


def encode_unpicklable(message: str, tb_text: str, *, type_name: str = "",
                       repr_text: str = "") -> bytes:
    return _envelope(UNPICKLABLE, message, type_name, repr_text, tb_text)


def encode_mismatch(message: str) -> bytes:
    return _envelope(MISMATCH, message)


def encode_dependency_failure(upstream_job_id: str, upstream_outcome: bytes) -> bytes:
    """The outcome of an item whose argument, another call's result, did not succeed."""
    return _envelope(DEPENDENCY, upstream_job_id, upstream_outcome)


def encode_initializer_failure(initializer: Any, error: BaseException, tb_text: str) -> bytes:
    """The outcome of each item of a child whose initializer raised ``error``."""
    inner = encode_error(error, tb_text)
    return _envelope(INITIALIZER, describe(initializer), inner)


# -- the result object --------------------------------------------------------------------------
def pack_result(outcomes: Sequence[bytes], meta: Dict[str, Any],
                output: Optional[Dict[int, Sequence[Any]]] = None) -> bytes:
    """One object per child: JSON metadata, its items' outcomes and, when an item printed
    something, the output section (``output``: item position -> [stdout, stderr, stdout chars
    cut, stderr chars cut]); the format is in the module docstring."""
    section = json.dumps({str(k): list(v) for k, v in output.items()}).encode() if output else b""
    if section:
        meta = {**meta, "output": len(section)}
    meta_bytes = json.dumps(meta, sort_keys=True, default=str).encode()
    lengths = struct.pack(f"<{len(outcomes)}Q", *(len(o) for o in outcomes))
    return b"".join([RESULT_MAGIC, _U64.pack(len(meta_bytes)), meta_bytes,
                     _U64.pack(len(outcomes)), lengths, *outcomes, section])


def _output_length(meta: Dict[str, Any]) -> int:
    length = meta.get("output", 0)
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValueError(f"a corrupt result object: its output length is {length!r}")
    return length


def unpack_result(data: "bytes | bytearray") -> Tuple[Dict[str, Any], List[bytes]]:
    """(meta, encoded outcomes); ValueError for anything but a whole result object."""
    view = memoryview(data)
    try:
        if bytes(view[:8]) != RESULT_MAGIC:
            raise ValueError("not a batchfutures result object")
        (meta_length,) = _U64.unpack_from(view, 8)
        position = 16 + meta_length
        meta = json.loads(bytes(view[16:position]))
        (count,) = _U64.unpack_from(view, position)
        position += 8
        lengths = struct.unpack_from(f"<{count}Q", view, position)
        position += 8 * count
    except (struct.error, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"a truncated or corrupt result object: {error}") from error
    if position + sum(lengths) + _output_length(meta) != len(view):
        raise ValueError("a truncated or corrupt result object: its size does not add up")
    outcomes = []
    for length in lengths:
        outcomes.append(bytes(view[position:position + length]))
        position += length
    return meta, outcomes


def result_output(data: Any) -> Dict[int, List[Any]]:
    """What the items of a result object printed: item position -> [stdout, stderr, stdout
    chars cut, stderr chars cut], only for items that printed; {} when none did, for an object
    written before echo_output existed, and for anything unreadable (the outcomes' decoding reports that).
    Reads the meta and the output section only, never an outcome."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return {}
    try:
        view = memoryview(data)
        if bytes(view[:8]) != RESULT_MAGIC:
            return {}
        (meta_length,) = _U64.unpack_from(view, 8)
        meta = bytes(view[16:16 + meta_length])
        if b'"output"' not in meta:  # nothing printed: not even the meta is parsed
            return {}
        length = _output_length(json.loads(meta))
        if not length or length > len(view):
            return {}
        section = json.loads(bytes(view[len(view) - length:]))
        # [out, err, out_cut, err_cut], records (5th) and their order (6th) when kept; a
        # longer entry (a later worker's) is read for what this client knows of it
        return {int(position): list(printed) for position, printed in section.items()
                if isinstance(printed, list) and len(printed) >= 4}
    except Exception:
        return {}


def result_usage(data: Any) -> Optional[List[Any]]:
    """The meta's per-item usage entries (see the module docstring), None when the object has
    none (written before usage was measured, no item measured) or cannot be read. Reads the meta only."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return None
    try:
        view = memoryview(data)
        if bytes(view[:8]) != RESULT_MAGIC:
            return None
        (meta_length,) = _U64.unpack_from(view, 8)
        meta = bytes(view[16:16 + meta_length])
        if b'"usage"' not in meta:  # nothing measured: not even the meta is parsed
            return None
        usage = json.loads(meta).get("usage")
    except Exception:
        return None
    return usage if isinstance(usage, list) else None


def _echo_stream(stream: Any, text: Any, cut: Any, name: str) -> None:
    if stream is None or not isinstance(text, str) or not (text or cut):
        return
    if isinstance(cut, int) and cut > 0:
        text = (f"[batchfutures: the first {cut} characters this call wrote to {name} were cut; "
                f"future.log() has them]\n") + text
    try:
        stream.write(text)
    except UnicodeEncodeError:  # the client's terminal cannot show some character
        encoding = getattr(stream, "encoding", None) or "utf-8"
        stream.write(text.encode(encoding, "backslashreplace").decode(encoding, "replace"))
    stream.flush()


def echo_output(printed: Optional[Sequence[Any]], streams: bool = True) -> None:
    """Write what one call printed (an entry of result_output) to this process's sys.stdout and
    sys.stderr, and replay its logging records, as a ProcessPoolExecutor's worker prints to its
    parent's terminal: in the order the call made them when the entry has it (a sixth entry,
    outputorder's runs), else stdout, stderr, then the records (an entry written before the
    order was kept, or a malformed one). ``streams=False``: its prints were streamed while it
    ran (a warm call under echo_output="live"), not written again; its records are replayed.
    (A cold call streamed live is not echoed at all: LiveTail replayed its records as read.)"""
    if not printed:
        return
    out, err, out_cut, err_cut = printed[:4]
    records = printed[4] if len(printed) > 4 and isinstance(printed[4], list) else []
    if not streams:
        logforward.replay(records)
        return
    parts = outputorder.steps(out, err, records, printed[5] if len(printed) > 5 else None)
    cuts = {outputorder.STDOUT: out_cut, outputorder.STDERR: err_cut}
    for stream, cut in ((outputorder.STDERR, err_cut), (outputorder.STDOUT, out_cut)):
        if cut and not any(source == stream for source, _ in parts):
            parts.insert(0, (stream, ""))  # only the note of what was cut
    for source, part in parts:
        if source == outputorder.RECORDS:
            logforward.replay(part)
            continue
        try:
            if source == outputorder.STDOUT:
                _echo_stream(sys.stdout, part, cuts.pop(source, 0), "stdout")
            else:
                _echo_stream(sys.stderr, part, cuts.pop(source, 0), "stderr")
        except Exception:  # a closed or broken stream: the output stays in the job's log
            pass


# -- outcomes (client side) ---------------------------------------------------------------------
def outcome_kind(encoded: bytes) -> str:
    """"ok", "error", "unpicklable" or "mismatch" (without loading the user's objects)."""
    return str(pickle.loads(encoded)[0])


def _remote_error(message: str, tb_text: Optional[str]) -> Exception:
    return RemoteError(message, tb_text)


def outcome_result(encoded: bytes) -> Tuple[bool, Any]:
    """``(True, value)`` or ``(False, exception)``, for the poller to set on a future."""
    try:
        fields = pickle.loads(encoded)
        kind = fields[0]
    except Exception as error:
        return False, _remote_error(f"the item's outcome is corrupt: {reason(error)}",
                                    traceback.format_exc())
    if kind == OK:
        try:
            return True, cloudpickle.loads(fields[1])
        except Exception as error:  # e.g. the value's class does not exist on the client
            return False, _remote_error(
                f"the function's return value could not be loaded here: {reason(error)}",
                traceback.format_exc())
    if kind == ERROR:
        _, payload, type_name, repr_text, tb_text = fields
        try:
            raised = cloudpickle.loads(payload)
            if not isinstance(raised, BaseException):
                raise TypeError(f"expected an exception, got {type(raised).__name__}")
        except Exception as not_loaded:  # e.g. the exception's class does not exist on the client
            return False, _remote_error(
                f"the function raised {type_name}: {repr_text}, which could not be loaded here "
                f"({reason(not_loaded)})", tb_text)
        # the client's lines under the call's frames
        raised.__cause__ = RemoteTraceback(f'\n"""\n{with_source_lines(tb_text)}"""')
        if isinstance(raised, FileNotFoundError):  # a file that is here, not there: files=
            # start-up: shipfiles (tarfile) adds ~1.4 ms to every worker's start; only a client
            # reads an outcome
            from .shipfiles import missing_file_note

            note = missing_file_note(raised, os.getcwd())
            if note is not None:
                add_note(raised, note)
        return False, raised
    if kind == DEPENDENCY:
        _, upstream_job_id, inner = fields
        _, cause = outcome_result(inner)
        dependency = DependencyFailedError(
            f"an argument of this call is the result of {upstream_job_id}, which failed: {cause!r}",
            job_id=upstream_job_id, status_reason="a dependency failed")
        dependency.__cause__ = cause
        return False, dependency
    if kind == INITIALIZER:
        _, described, inner = fields
        _, cause = outcome_result(inner)
        initializer = InitializerFailedError(
            f"{described}, the executor's initializer, raised {cause!r} in this call's worker "
            f"process, so its items did not run")
        initializer.__cause__ = cause
        return False, initializer
    if kind == MISMATCH:
        return False, EnvironmentMismatchError(fields[1])
    if kind == UNPICKLABLE:
        _, message, _type_name, _repr, tb_text = fields
        return False, _remote_error(message, tb_text)
    return False, _remote_error(f"the item's outcome has an unknown kind {kind!r}", None)


def decode_outcome(encoded: bytes) -> Any:
    """The item's value, or raise its exception."""
    ok, value = outcome_result(encoded)
    if ok:
        return value
    raise value
