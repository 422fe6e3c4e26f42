"""Remote tracebacks that point at the user's own file and line, as ProcessPoolExecutor's do.

Two gaps, one on each side of the wire:

- **The file name.** cloudpickle (3.x) rewrites the file name of every code object it pickles by
  value (a function of the script, of a module shipped by value) to ``"<dynamic-code>"``, so a
  worker's traceback said ``File "<dynamic-code>", line 24, in check``. ``Pickler`` keeps the
  client's ``co_filename`` (its own reducer for code objects: cloudpickle's, with the name put
  back), so the worker's frames, its ``logging`` records and its warnings name the script's
  file. A function's pickle then depends on where its script lives: the same script at the
  same path pickles to the same bytes, as before.
- **The source line.** The worker's image does not have the script, so ``traceback`` prints no
  line under such a frame. The client has it: ``with_source_lines`` puts the client's line
  (``linecache``) under each frame that came back without one, in the text the re-raised
  exception's ``__cause__`` (``wire.RemoteTraceback``) carries. A frame the worker printed a
  line for keeps the worker's line. Only frames of files whose code this process shipped
  (``Pickler`` records them), and only the frames' lines (not the exception's message, which
  may hold anything): the remote text never chooses which of the client's files is read.
"""

from __future__ import annotations

import io
import linecache
import re
import types
from collections import ChainMap
from typing import AbstractSet, Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import cloudpickle

__all__ = ["DYNAMIC_FILENAME", "Pickler", "dumps", "with_source_lines", "client_line"]

DYNAMIC_FILENAME = "<dynamic-code>"  # what cloudpickle names the file of code it ships by value

_cloudpickle_code_reduce = cloudpickle.Pickler.dispatch_table[types.CodeType]


def _code_reduce(code: types.CodeType) -> Any:
    """cloudpickle's reduction of a code object, with its real file name put back."""
    constructor, args = _cloudpickle_code_reduce(code)[:2]
    _shipped_code_files.add(code.co_filename)  # its lines may be shown under remote frames
    return constructor, tuple(code.co_filename if isinstance(arg, str) and arg == DYNAMIC_FILENAME
                              else arg for arg in args)


class Pickler(cloudpickle.Pickler):
    """cloudpickle's Pickler; code objects keep the file they were compiled from."""

    # cloudpickle's own table with code objects' entry replaced, then the maps after it
    # (copyreg's, live): as many lookups per object as cloudpickle's Pickler makes
    dispatch_table = ChainMap({**cloudpickle.Pickler.dispatch_table.maps[0],
                               types.CodeType: _code_reduce},
                              *cloudpickle.Pickler.dispatch_table.maps[1:])


def dumps(obj: Any, protocol: Optional[int] = None) -> bytes:
    """``cloudpickle.dumps(obj, protocol)``, code objects keeping their file names."""
    with io.BytesIO() as buffer:
        Pickler(buffer, protocol=protocol).dump(obj)
        return buffer.getvalue()


# -- the client's source lines ----------------------------------------------------------------
# The files whose code this process shipped (Pickler saw it): the only files a remote traceback
# may make the client read. A frame naming any other file (a message's text that looks like a
# frame, an image's own module) gets no line: the client's disk is not the worker's to quote.
_shipped_code_files: Set[str] = set()

# A frame line of a formatted traceback, with what precedes it: spaces, and the "|" bars of an
# exception group's nested tracebacks.
_FRAME = re.compile(r'^(?P<prefix>[ |]*)File "(?P<file>[^"]+)", line (?P<line>\d+), in .*$')
# The header that opens a traceback's frames ("+" opens an exception group's, "|" continues it).
_HEADER = re.compile(r'^(?P<prefix>[ |+]*)(?:Exception Group )?Traceback \(most recent call last\):$')


def client_line(filename: str, lineno: int) -> str:
    """Line ``lineno`` of ``filename`` as this process reads it now, stripped ("" if none)."""
    linecache.checkcache(filename)  # the file may have changed since it was cached
    return linecache.getline(filename, lineno).strip()


def _shows_source(frame_prefix: str, following: Optional[str]) -> bool:
    """Whether the line after a frame line is that frame's source line."""
    if following is None:
        return False
    indent = frame_prefix + "  "
    return (following.startswith(indent) and following[len(indent):len(indent) + 1] not in ("", " ")
            and not following[len(frame_prefix):].startswith("File "))


def frame_lines(lines: List[str]) -> Iterator[Tuple[int, "re.Match[str]"]]:
    """(position, match) of each frame line of a traceback's frames: after a "Traceback (most
    recent call last):" header and before the "Type: message" block that ends them; a line of
    the message that looks like a frame is not one."""
    frames_prefix: Optional[str] = None  # inside a traceback's frames: what each frame starts with
    for position, line in enumerate(lines):
        header = _HEADER.match(line)
        if header is not None:
            frames_prefix = header["prefix"].replace("+", "|") + "  "
            continue
        if frames_prefix is None:
            continue
        match = _FRAME.match(line)
        if match is not None and match["prefix"] == frames_prefix:
            yield position, match
            continue
        rest = line[len(frames_prefix):] if line.startswith(frames_prefix) else None
        if rest is None or not (rest.startswith("  ") or rest.startswith("[Previous line")):
            frames_prefix = None  # the exception's "Type: message": the frames are over


def with_source_lines(tb_text: str, getline: Callable[[str, int], str] = client_line,
                      shipped: Optional[AbstractSet[str]] = None) -> str:
    """``tb_text`` (a formatted traceback, chained and grouped ones too) with a source line
    under every frame that has none, of a file in ``shipped`` (default: the files whose code
    this process shipped), whose line ``getline(file, lineno)`` finds here."""
    if not tb_text or 'File "' not in tb_text:
        return tb_text
    allowed = _shipped_code_files if shipped is None else shipped
    lines = tb_text.split("\n")
    inserts: Dict[int, str] = {}
    for position, match in frame_lines(lines):
        if match["file"] not in allowed:
            continue
        following = lines[position + 1] if position + 1 < len(lines) else None
        if _shows_source(match["prefix"], following):
            continue
        try:
            source = getline(match["file"], int(match["line"])).strip()
        except Exception:  # an unreadable file is a frame without its line, as before
            source = ""
        if source:
            inserts[position] = f"{match['prefix']}  {source}"
    out: List[str] = []
    for position, line in enumerate(lines):
        out.append(line)
        if position in inserts:
            out.append(inserts[position])
    return "\n".join(out)
