"""The container command: ``python -m batchfutures.worker <job_url>``.

    AWS_BATCH_JOB_ARRAY_INDEX (0 for a plain job)
      -> read the header and this child's byte range of <job_url>/inputs
      -> versions differ from the client's stamp?  every item: mismatch outcome
      -> load the functions it needs, run each item in order (print goes to the job's log)
      -> write <job_url>/results/<index> once, atomically; exit 0

An exception raised by the user's function is an outcome, not a container failure: the worker
still exits 0. A MemoryError means the container ran out of memory: the worker ends with exit
status 137 and writes nothing, as the kernel's OOM killer would (the local emulator caps memory
with RLIMIT_DATA, so there an over-limit allocation surfaces as MemoryError). A result already
written by an earlier attempt is kept: a retry never overwrites a finished result.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from typing import Any, Dict, List, Optional

logger = logging.getLogger("batchfutures")
OOM_EXIT_STATUS = 137


def _out_of_memory() -> None:
    try:
        sys.stderr.write("batchfutures.worker: MemoryError: out of memory; exiting with status 137\n")
        sys.stderr.flush()
    finally:
        os._exit(OOM_EXIT_STATUS)


def run_child(job_url: str, index: int, attempt: Optional[str] = None) -> int:
    from . import serialization
    from .storage import Storage

    storage = Storage.from_url(job_url)
    if storage.has_result(job_url, index):
        logger.info("batchfutures.worker: child %d already has a result; keeping it", index)
        return 0
    header, blob = storage.read_child_inputs(job_url, index)
    meta: Dict[str, Any] = {"index": index, "attempt": attempt, "started": time.time(),
                            "worker": serialization.payload_stamp()}
    mismatch = serialization.check_stamp(header)
    try:
        items = serialization.unpack_items(blob)
    except MemoryError:
        _out_of_memory()
    except Exception:
        items = None
        load_error = traceback.format_exc()
    if mismatch is not None or items is None:
        count = _item_count(header, index)
        if mismatch is not None:
            outcome = serialization.encode_mismatch(mismatch)
        else:
            outcome = serialization.encode_unpicklable("the worker could not load the call's arguments",
                                                       load_error)
        storage.write_result(job_url, index, serialization.pack_result([outcome] * count, meta))
        return 0

    functions: Dict[int, Any] = {}
    outcomes: List[bytes] = []
    for function_index, args, kwargs in items:
        try:
            if function_index not in functions:
                data = storage.get_function(header["functions"][function_index])
                functions[function_index] = serialization.loads(data)
        except MemoryError:
            _out_of_memory()
        except Exception:
            outcomes.append(serialization.encode_unpicklable(
                "the worker could not load the function", traceback.format_exc()))
            continue
        try:
            value = functions[function_index](*args, **kwargs)
        except MemoryError:
            _out_of_memory()
        except BaseException as error:  # the user's exception (even SystemExit) is an outcome
            outcomes.append(serialization.encode_error(error, traceback.format_exc()))
            del error
            continue
        try:
            outcomes.append(serialization.encode_ok(value))
        except MemoryError:
            _out_of_memory()
        del value
    sys.stdout.flush()
    sys.stderr.flush()
    meta["finished"] = time.time()
    try:
        storage.write_result(job_url, index, serialization.pack_result(outcomes, meta))
    except MemoryError:
        _out_of_memory()
    return 0


def _item_count(header: Dict[str, Any], index: int) -> int:
    chunksize, items = int(header.get("chunksize", 1)), int(header.get("items", 1))
    return max(1, min(chunksize, items - index * chunksize))


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m batchfutures.worker <job_url>\n")
        return 2
    logging.basicConfig(level=os.environ.get("BATCHFUTURES_LOG_LEVEL", "WARNING"),
                        stream=sys.stderr, format="%(name)s: %(message)s")
    index = int(os.environ.get("AWS_BATCH_JOB_ARRAY_INDEX", "0"))
    return run_child(argv[0], index, os.environ.get("AWS_BATCH_JOB_ATTEMPT"))


if __name__ == "__main__":
    sys.exit(main())
