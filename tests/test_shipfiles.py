"""files=[paths]: local files shipped into each call's working directory (batchfutures.shipfiles)."""

import io
import os
import subprocess
import sys
import tarfile
import textwrap

import pytest

from batchfutures import ConfigurationError, shipfiles


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "data" / "deep").mkdir(parents=True)
    (tmp_path / "data" / "a.csv").write_text("1,2\n")
    (tmp_path / "data" / "deep" / "b.txt").write_text("b")
    (tmp_path / "top.json").write_text("{}")
    (tmp_path / "elsewhere").mkdir()
    return tmp_path


@pytest.mark.parametrize("paths, names", [
    (["top.json"], ["top.json"]),
    (["data"], ["data/a.csv", "data/deep/b.txt"]),
    (["./data/deep/", "data/deep/b.txt"], ["data/deep/b.txt"]),  # named twice: once
    (["{cwd}/top.json"], ["top.json"]),  # absolute, inside the working directory
    (["data", "top.json"], ["data/a.csv", "data/deep/b.txt", "top.json"]),
])
def test_collect(tree, paths, names):
    entries = shipfiles.collect([p.format(cwd=tree) for p in paths], str(tree))
    assert [name for name, _ in entries] == names
    assert all(os.path.isfile(local) for _, local in entries)


@pytest.mark.parametrize("paths, message", [
    (["../outside.txt"], "not inside the working directory"),
    (["/etc/hostname"], "not inside the working directory"),
    (["."], "not inside the working directory"),  # the whole folder: name what to ship
    (["missing.txt"], "does not exist"),
    ("top.json", "a list of paths"),
])
def test_collect_refuses(tree, paths, message):
    with pytest.raises(ConfigurationError, match=message):
        shipfiles.collect(paths, str(tree))


def test_collect_bounds_the_size(tree, monkeypatch):
    monkeypatch.setattr(shipfiles, "MAX_BYTES", 3)
    with pytest.raises(ConfigurationError, match="MiB in all"):
        shipfiles.collect(["data"], str(tree))


def test_pack_is_a_plain_tar_of_the_files(tree):
    data = shipfiles.pack(shipfiles.collect(["data"], str(tree)))
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        members = {m.name: m for m in archive.getmembers()}
        assert set(members) == {"data/a.csv", "data/deep/b.txt"}
        assert archive.extractfile(members["data/a.csv"]).read() == b"1,2\n"
        assert all(m.uid == 0 and m.uname == "" for m in members.values())


# Links, as DVC and git-annex leave them: the cache (outside the working directory) holds the data.
LINKS = {
    "file link": {"data/a.csv": "{store}/real.csv"},
    "named link": {"link.csv": "../store/real.csv"},
    "folder link": {"data": "{store}"},
    "nested folder link": {"data/sub": "../../store"},
}


def _links(root, links):
    (root / "work").mkdir()
    (root / "store").mkdir()
    (root / "store" / "real.csv").write_text("from the store\n")
    for name, target in links.items():
        (root / "work" / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target.format(store=root / "store"), root / "work" / name)
    return root / "work"


@pytest.mark.parametrize("layout, paths, shipped", [
    ("file link", ["data"], {"data/a.csv": b"from the store\n"}),
    ("named link", ["link.csv"], {"link.csv": b"from the store\n"}),
    ("folder link", ["data"], {"data/real.csv": b"from the store\n"}),
    ("nested folder link", ["data"], {"data/sub/real.csv": b"from the store\n"}),
])
def test_links_ship_their_content_and_arrive(tmp_path, monkeypatch, layout, paths, shipped):
    from batchfutures.worker import calls

    cwd = _links(tmp_path, LINKS[layout])
    data = shipfiles.pack(shipfiles.collect(paths, str(cwd)))
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        assert all(member.isreg() for member in archive.getmembers())  # no link members
    worker = tmp_path / "worker"
    worker.mkdir()
    monkeypatch.chdir(worker)
    calls.write_files(data)  # the worker's side: the files arrive, as regular files
    arrived = {str(p.relative_to(worker)).replace(os.sep, "/"): p.read_bytes()
               for p in worker.rglob("*") if p.is_file()}
    assert arrived == shipped and not any(p.is_symlink() for p in worker.rglob("*"))


@pytest.mark.parametrize("links, paths, message", [
    ({"data/again": ".."}, ["data"], "link back to a folder"),   # a loop
    ({"data/self": "."}, ["data"], "link back to a folder"),
    ({"data/gone.csv": "../store/missing.csv"}, ["data"], "link to nothing"),  # not pulled
    ({"gone.csv": "store/missing.csv"}, ["gone.csv"], "link to nothing"),
])
def test_link_problems_refused(tmp_path, links, paths, message):
    cwd = _links(tmp_path, links)
    with pytest.raises(ConfigurationError, match=message):
        shipfiles.collect(paths, str(cwd))


def test_a_link_counts_its_target_size(tmp_path, monkeypatch):
    cwd = _links(tmp_path, {"data": "{store}"})
    monkeypatch.setattr(shipfiles, "MAX_BYTES", 3)
    with pytest.raises(ConfigurationError, match="MiB in all"):
        shipfiles.collect(["data"], str(cwd))


@pytest.mark.parametrize("existing, where, content, words", [
    (None, "image", b"new: 2\n", None),                       # nothing there: written
    (b"new: 2\n", "image", b"new: 2\n", None),                # the same already: left
    (b"old: 1\n", "image", b"new: 2\n", "replacing it"),      # an image's stale copy: replaced
    (b"edited: 3\n", "client", b"edited: 3\n", "keeping the file"),  # the user's own: kept
    (b"new: 2\n", "client", b"new: 2\n", None),
], ids=["absent", "same", "stale", "client-edited", "client-same"])
def test_a_file_already_there(tmp_path, monkeypatch, caplog, existing, where, content, words):
    from batchfutures.worker import calls

    client = tmp_path / "client"
    client.mkdir()
    (client / "config.yaml").write_bytes(b"new: 2\n")
    data = shipfiles.pack(shipfiles.collect(["config.yaml"], str(client)), str(client))
    folder = client if where == "client" else tmp_path / "image"
    folder.mkdir(exist_ok=True)
    if existing is not None:
        (folder / "config.yaml").write_bytes(existing)  # the image's, or edited since
    monkeypatch.chdir(folder)
    caplog.set_level("WARNING", logger="batchfutures")
    calls.write_files(data)
    assert (folder / "config.yaml").read_bytes() == content
    assert sorted(os.listdir(folder)) == ["config.yaml"]  # nothing left aside
    if words is None:
        assert "config.yaml" not in caplog.text
    else:
        assert words in caplog.text and "config.yaml" in caplog.text


@pytest.mark.parametrize("client_folder, here, expected", [
    (None, "{a}", False),          # an archive without the header
    ("", "{a}", False),
    ("{a}", "{a}", True),
    ("{a}/../a", "{a}", True),     # the same folder by another name
    ("{a}", "{b}", False),
    ("{a}/missing", "{a}", False),  # not a folder of this machine
])
def test_runs_in_folder(tmp_path, client_folder, here, expected):
    from batchfutures.worker import calls

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    names = {"a": tmp_path / "a", "b": tmp_path / "b"}
    given = client_folder.format(**names) if client_folder is not None else None
    assert calls.runs_in_folder(given, here.format(**names)) is expected


@pytest.mark.parametrize("error, existing, expected", [
    (FileNotFoundError(2, "No such file", "data/a.csv"), {"/cwd/data/a.csv"}, "files=['data/a.csv']"),
    (FileNotFoundError(2, "No such file", "data/a.csv"), set(), None),  # not here either
    (FileNotFoundError(2, "No such file", "/cwd/data/a.csv"), {"/cwd/data/a.csv"},
     "open it as 'data/a.csv'"),
    (FileNotFoundError(2, "No such file", "/srv/x"), {"/srv/x"}, "put it in S3"),
    (FileNotFoundError("no filename"), {"/cwd/no filename"}, None),
    (KeyError("data/a.csv"), {"/cwd/data/a.csv"}, None),
])
def test_missing_file_note(error, existing, expected):
    note = shipfiles.missing_file_note(error, "/cwd", exists=existing.__contains__)
    if expected is None:
        assert note is None
    else:
        assert expected in note


@pytest.mark.parametrize("initargs, files, same_as_initargs", [
    (None, None, True), (b"args", None, True), (None, b"tar", False), (b"args", b"tar", False),
])
def test_cache_part(initargs, files, same_as_initargs):
    part = shipfiles.cache_part(initargs, files)
    assert (part == initargs) is same_as_initargs
    if files is not None:  # other files, another key
        assert part != shipfiles.cache_part(initargs, files + b"!")


SCRIPT = """\
import concurrent.futures, sys
from batchfutures import BatchExecutor


def read(name):
    with open(name) as handle:
        return handle.read()


if __name__ == "__main__":
    kind = sys.argv[1]
    if kind == "ppe":
        ex = concurrent.futures.ProcessPoolExecutor(1)
    else:
        ex = BatchExecutor(files=["data"] if kind in ("files", "warm") else None,
                           keepalive=30 if kind == "warm" else 0)
    with ex:
        future = ex.submit(read, "data/a.csv")
        try:
            print("READ:", repr(future.result()))
        except FileNotFoundError as error:
            print("MISSING:", getattr(error, "__notes__", []))
"""


@pytest.mark.slow
def test_a_relative_path_resolves_as_on_the_client(tree):
    (tree / "script.py").write_text(textwrap.dedent(SCRIPT))
    outputs = {}
    for kind in ("ppe", "files", "warm", "none"):
        environment = {**os.environ, "BATCHFUTURES_WORKDIR": str(tree / "work")}
        done = subprocess.run([sys.executable, "script.py", kind], cwd=tree, env=environment,
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr
        outputs[kind] = done.stdout
    assert "READ: '1,2\\n'" in outputs["ppe"]
    assert outputs["files"] == outputs["ppe"]
    assert outputs["warm"] == outputs["ppe"]  # warm workers unpack it when they start
    # without files=: the FileNotFoundError says what to do
    assert "MISSING:" in outputs["none"] and "files=['data/a.csv']" in outputs["none"]
