"""Where everything lives under one storage root R: the names of every object, and nothing else
(no I/O; storage.Storage reads and writes at these names, and seals each object to its name).

    R = file:///.../storage  or  s3://bucket/prefix
    R/runs/<run_id>/functions/<sha256>.pkl     a pickled callable, once per run (function_url)
    R/runs/<run_id>/jobs/<job_key>             a Batch job's folder, "the job URL" (job_url)
    R/runs/<run_id>/jobs/<job_key>/inputs      its inputs object (inputs_url)
    R/runs/<run_id>/jobs/<job_key>/results/<i> child i's result, i zero-padded (result_url)
    R/runs/<run_id>/jobs/<job_key>/oom/<i>     child i's out-of-memory marker (oom_marker_url)
    R/jobs/<batch job id>                      the job URL of a Batch job (pointer_url)
    R/cache/<function digest>/<name>           the call cache's index objects (cache_folder)

An object's name, what its seal binds besides R itself, is its key under R (``name_of``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import List, Optional, Tuple

from .errors import ConfigurationError

__all__ = ["Layout", "RESULT_DIGITS", "OOM_FOLDER", "CACHE_FOLDER", "root_of_job_url",
           "result_index"]

# digits of a result object's name (results/00042): arrays have at most 10,000 children
RESULT_DIGITS = 5
# A child that ended on a MemoryError records it at <job>/oom/<i>: the client's proof that an
# exit status 137 with no OutOfMemoryError reason was out of memory.
OOM_FOLDER = "oom"
RESULTS_FOLDER = "results"
CACHE_FOLDER = "cache"


@dataclass(frozen=True)
class Layout:
    """The names under one root URL (no trailing "/")."""

    root_url: str

    def url(self, *parts: str) -> str:
        return "/".join((self.root_url,) + parts)

    def name_of(self, url: str) -> str:
        """An object's name for its signature: its key under the root (the URL if outside it)."""
        if url.startswith(self.root_url + "/"):
            return url[len(self.root_url) + 1:]
        return url

    # -- runs and their jobs ---------------------------------------------------------------------
    def runs_folder(self) -> str:
        return self.url("runs")

    def run_url(self, run_id: str) -> str:
        return self.url("runs", run_id)

    def run_jobs_folder(self, run_id: str) -> str:
        return self.url("runs", run_id, "jobs")

    def job_url(self, run_id: str, job_key: str) -> str:
        return self.url("runs", run_id, "jobs", job_key)

    def split_job_url(self, job_url: str) -> Optional[Tuple[str, str]]:
        """(run id, job key) of a job URL under this root, or None."""
        prefix = self.runs_folder() + "/"
        if not job_url.startswith(prefix):
            return None
        parts = job_url[len(prefix):].strip("/").split("/")
        if len(parts) != 3 or parts[1] != "jobs":
            return None
        return parts[0], parts[2]

    def function_url(self, run_id: str, payload: bytes) -> str:
        """A pickled callable's name: its content hash, so a run uploads each function once."""
        digest = hashlib.sha256(payload).hexdigest()
        return self.url("runs", run_id, "functions", f"{digest}.pkl")

    # -- job pointers ----------------------------------------------------------------------------
    def pointers_folder(self) -> str:
        return self.url("jobs")

    def pointer_url(self, job_id: str) -> str:
        # one plain name under jobs/: `batchfutures result ../../x` must not read outside R
        if not job_id or "/" in job_id or "\x00" in job_id or job_id in (".", ".."):
            raise ConfigurationError(f"{job_id[:200]!r} is not a job id")
        return self.url("jobs", job_id)

    # -- the call cache --------------------------------------------------------------------------
    def cache_folder(self, *parts: str) -> str:
        """The cache's folder (``cache_folder()``), a function's (``cache_folder(digest)``) or
        one of its index objects (``cache_folder(digest, name)``)."""
        return self.url(CACHE_FOLDER, *parts)


# -- names inside a job's folder (the job URL) -----------------------------------------------------
def inputs_url(job_url: str) -> str:
    return f"{job_url}/inputs"


def results_folder(job_url: str) -> str:
    return f"{job_url}/{RESULTS_FOLDER}"


def result_url(job_url: str, index: int) -> str:
    # zero-padded, so the keys sort as the indices do: a listing can start after a child
    return f"{job_url}/{RESULTS_FOLDER}/{int(index):0{RESULT_DIGITS}d}"


def oom_folder(job_url: str) -> str:
    return f"{job_url}/{OOM_FOLDER}"


def oom_marker_url(job_url: str, index: int) -> str:
    """Where child ``index`` records that it ran out of memory: beside ``results/``, never in it,
    so a marker is never listed, read or kept as a result."""
    return f"{job_url}/{OOM_FOLDER}/{int(index):0{RESULT_DIGITS}d}"


def result_index(name: str) -> Optional[int]:
    """A result's (or marker's) child index from its name (``00042``, or ``42`` as written before
    the names were padded); None for anything else (a temporary)."""
    return int(name) if name.isdigit() else None


def result_indices(names: List[str]) -> List[int]:
    """The child indices among a folder's names, temporaries skipped."""
    return [index for index in map(result_index, names) if index is not None]


def root_of_job_url(job_url: str) -> Optional[str]:
    """R of a job URL ``R/runs/<run_id>/jobs/<job_key>`` (no trailing "/"), or None."""
    root, sep, _ = job_url.rpartition("/runs/")
    return root.rstrip("/") if sep and root else None


def check_run_id(run_id: str) -> None:
    """A run id is one plain name under runs/ (ValueError otherwise): removing it stays in R."""
    if not run_id or "/" in run_id or run_id in (".", ".."):
        raise ValueError(f"{run_id!r} is not a run id")
