"""layout.py: every name under a storage root, made in one place (pure: no storage is opened)."""

from __future__ import annotations

import hashlib

import pytest

from batchfutures import layout
from batchfutures.errors import ConfigurationError
from batchfutures.layout import Layout

ROOT = "s3://bucket/prefix"
JOB = f"{ROOT}/runs/run-1/jobs/key-1"
NAMES = Layout(ROOT)


@pytest.mark.parametrize("made, expected", [
    (NAMES.run_url("run-1"), f"{ROOT}/runs/run-1"),
    (NAMES.job_url("run-1", "key-1"), JOB),
    (NAMES.run_jobs_folder("run-1"), f"{ROOT}/runs/run-1/jobs"),
    (NAMES.runs_folder(), f"{ROOT}/runs"),
    (NAMES.pointers_folder(), f"{ROOT}/jobs"),
    (NAMES.pointer_url("abc-123:7"), f"{ROOT}/jobs/abc-123:7"),
    (NAMES.cache_folder(), f"{ROOT}/cache"),
    (NAMES.cache_folder("f00d", "run-1.key-1"), f"{ROOT}/cache/f00d/run-1.key-1"),
    (layout.inputs_url(JOB), f"{JOB}/inputs"),
    (layout.results_folder(JOB), f"{JOB}/results"),
    (layout.result_url(JOB, 42), f"{JOB}/results/00042"),
    (layout.result_url(JOB, 9999), f"{JOB}/results/09999"),
    (layout.oom_folder(JOB), f"{JOB}/oom"),
    (layout.oom_marker_url(JOB, 3), f"{JOB}/oom/00003"),
    (NAMES.function_url("run-1", b"pickle"),
     f"{ROOT}/runs/run-1/functions/{hashlib.sha256(b'pickle').hexdigest()}.pkl"),
])
def test_each_name(made, expected):
    assert made == expected


def test_result_names_sort_as_their_indices():
    names = [layout.result_url(JOB, i) for i in (0, 9, 10, 99, 100, 9999)]
    assert sorted(names) == names


@pytest.mark.parametrize("url, name", [
    (f"{ROOT}/runs/run-1/jobs/key-1/inputs", "runs/run-1/jobs/key-1/inputs"),
    (f"{ROOT}/jobs/x", "jobs/x"),
    ("s3://bucket/prefixed/jobs/x", "s3://bucket/prefixed/jobs/x"),  # outside R: the whole URL
    (ROOT, ROOT),
])
def test_an_objects_name_is_its_key_under_the_root(url, name):
    assert NAMES.name_of(url) == name


@pytest.mark.parametrize("job_url, parts", [
    (JOB, ("run-1", "key-1")),
    (JOB + "/", ("run-1", "key-1")),
    (f"{ROOT}/runs/run-1", None),
    (f"{ROOT}/runs/run-1/jobs/key-1/inputs", None),
    (f"{ROOT}/runs/run-1/other/key-1", None),
    ("s3://elsewhere/runs/run-1/jobs/key-1", None),
])
def test_split_job_url(job_url, parts):
    assert NAMES.split_job_url(job_url) == parts


@pytest.mark.parametrize("job_url, root", [
    (JOB, ROOT),
    ("file:///tmp/storage/runs/r/jobs/k", "file:///tmp/storage"),
    ("s3://bucket/a/runs/b/runs/r/jobs/k", "s3://bucket/a/runs/b"),  # the last /runs/
    ("s3://bucket/prefix/jobs/k", None),
    ("/runs/r/jobs/k", None),
])
def test_root_of_job_url(job_url, root):
    assert layout.root_of_job_url(job_url) == root


@pytest.mark.parametrize("job_id", ["", "a/b", "..", ".", "x\x00y"])
def test_a_pointer_is_one_plain_name(job_id):
    with pytest.raises(ConfigurationError):
        NAMES.pointer_url(job_id)


@pytest.mark.parametrize("run_id, ok", [("run-1", True), ("", False), ("a/b", False),
                                        ("..", False), (".", False)])
def test_a_run_id_is_one_plain_name(run_id, ok):
    if ok:
        layout.check_run_id(run_id)
    else:
        with pytest.raises(ValueError):
            layout.check_run_id(run_id)


@pytest.mark.parametrize("names, indices", [
    (["00000", "00042", "7"], [0, 42, 7]),  # 7: written before the names were padded
    ([".00001.abc.tmp", "00001"], [1]),  # a temporary is not a result
    ([], []),
])
def test_result_indices(names, indices):
    assert layout.result_indices(names) == indices
