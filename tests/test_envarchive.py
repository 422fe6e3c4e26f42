"""envarchive.py: an environment archive's member checks and its unpacking (hostile ones refused
whole, nothing written)."""

from __future__ import annotations

import io
import os
import stat
import zipfile

import pytest

from batchfutures import envarchive


@pytest.mark.parametrize("name, kind, problem", [
    ("tinypkg/__init__.py", "file", None),
    ("tinypkg/", "folder", None),
    ("tinypkg-1.0.dist-info/METADATA", "file", None),
    ("../x", "file", "leaves the folder"),
    ("a/../../x", "file", "leaves the folder"),
    ("a//b", "file", "empty part"),
    ("/abs/x", "file", "absolute"),
    ("C:x", "file", "absolute"),
    ("a\\..\\x", "file", "plain relative"),
    ("a\0b", "file", "plain relative"),
    ("", "file", "plain relative"),
    ("link", "link", "a link"),
    ("dev", "other", "a other"),
])
def test_member_problem(name, kind, problem):
    found = envarchive.member_problem(name, kind)
    assert (found is None) == (problem is None)
    if problem is not None:
        assert problem in found


@pytest.mark.parametrize("mode, kind", [
    (stat.S_IFREG | 0o644, "file"),
    (stat.S_IFDIR | 0o755, "folder"),
    (stat.S_IFLNK | 0o777, "link"),
    (stat.S_IFCHR | 0o600, "other"),
    (stat.S_IFIFO | 0o600, "other"),
])
def test_member_kind(mode, kind):
    info = zipfile.ZipInfo("x")
    info.external_attr = mode << 16
    assert envarchive.member_kind(info) == kind


def _zip(*members):
    """An archive of (name, data, unix mode or None) members."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data, mode in members:
            info = zipfile.ZipInfo(name)
            if mode is not None:
                info.external_attr = mode << 16
            archive.writestr(info, data)
    return out.getvalue()


FILE = stat.S_IFREG | 0o644
GOOD = ("ok/__init__.py", b"VALUE = 1\n", FILE)


@pytest.mark.parametrize("members, limits, words", [
    ([GOOD, ("../escape.py", b"x", FILE)], {}, "leaves the folder"),
    ([GOOD, ("/abs.py", b"x", FILE)], {}, "absolute"),
    ([GOOD, ("ok/link", b"/etc/passwd", stat.S_IFLNK | 0o777)], {}, "link"),
    ([GOOD, ("ok/fifo", b"", stat.S_IFIFO | 0o600)], {}, "other"),
    ([GOOD, ("big.bin", b"\0" * 5000, FILE)], {"max_total": 4096}, "bytes unpacked"),
    ([GOOD] + [(f"m{i}", b"", FILE) for i in range(5)], {"max_members": 3}, "members"),
])
def test_hostile_archives_refused_before_anything_is_written(tmp_path, members, limits, words):
    target = tmp_path / "env"
    target.mkdir()
    with pytest.raises(envarchive.ArchiveRefused, match=words):
        envarchive.unpack(_zip(*members), target, **limits)
    assert os.listdir(target) == []
    assert not (tmp_path / "escape.py").exists()


def test_not_a_zip_refused(tmp_path):
    with pytest.raises(envarchive.ArchiveRefused, match="not a zip"):
        envarchive.unpack(b"PK\x03\x04 broken", tmp_path)


def test_pack_and_unpack(tmp_path):
    source = tmp_path / "site"
    (source / "tinypkg").mkdir(parents=True)
    (source / "tinypkg" / "__init__.py").write_text("VALUE = 42\n")
    (source / "bin").mkdir()
    (source / "bin" / "tool").write_text("#!/bin/sh\n")
    os.chmod(source / "bin" / "tool", 0o755)
    (source / "tinypkg" / "outside").symlink_to("/etc/hostname")  # links are not packed
    target = tmp_path / "env"
    target.mkdir()
    names = envarchive.unpack(envarchive.pack(source), target)
    assert sorted(names) == ["bin/tool", "tinypkg/__init__.py"]
    assert (target / "tinypkg" / "__init__.py").read_text() == "VALUE = 42\n"
    assert os.stat(target / "bin" / "tool").st_mode & 0o777 == 0o700
    assert os.stat(target / "tinypkg" / "__init__.py").st_mode & 0o777 == 0o600


@pytest.mark.parametrize("url, digest", [
    ("s3://b/p/envs/" + "a" * 64 + ".zip", "a" * 64),
    ("file:///w/storage/envs/" + "0f" * 32 + ".zip", "0f" * 32),
    ("s3://b/p/envs/" + "A" * 64 + ".zip", None),
    ("s3://b/p/envs/../x.zip", None),
    ("s3://b/p/envs/" + "a" * 63 + ".zip", None),
])
def test_digest_of(url, digest):
    assert envarchive.digest_of(url) == digest
