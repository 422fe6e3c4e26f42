"""Issue 29, point 4: every object read from storage, the cache's index objects included, goes
through the one sealed read (Storage.read_sealed: size checked before a byte is read, never a
symlink or FIFO locally, the MAC computed as it streams in), and one listing reads at most
MAX_INDEX_READS index objects. The attacker is a bucket writer without the key: she plants
objects, she cannot sign them."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import s3server
from test_seals import Feeds  # the bytes the verifying reader was given

from batchfutures import cache as cache_module
from batchfutures.cache import CACHE_FOLDER, INDEX_KIND, CallCache, _index_payload
from batchfutures.errors import IntegrityError
from batchfutures.signing import Signer
from batchfutures.storage import ObjectTooLargeError, Storage

moto_server, aws_env, s3_bucket, s3_root = (
    s3server.moto_server, s3server.aws_env, s3server.s3_bucket, s3server.s3_root)
FUNCTION = "f" * 64
DIGEST = "d" * 64




@pytest.fixture
def keyed(storage) -> Storage:
    return Storage(storage.root_url, signer=Signer.from_key(b"k" * 32))


def index_url(storage: Storage, run: str, job: str = "job") -> str:
    return storage.url(CACHE_FOLDER, FUNCTION, f"{run}.{job}")


def write_index(storage: Storage, run: str, calls=((DIGEST, 0, 0),)) -> str:
    """An index as the client writes one (signed with the key)."""
    url = index_url(storage, run)
    storage.put_bytes(url, storage.signer.seal(INDEX_KIND, storage.name_of(url),
                                               _index_payload(list(calls)),
                                               root=storage.mac_root))
    return url


def looked_up(storage: Storage) -> CallCache:
    found = CallCache(storage, definition="d", by_value=False, initargs=None)
    found.refresh(FUNCTION)
    return found


def entries(cache: CallCache):
    return cache._entries.get(FUNCTION, {})


def test_a_signed_index_is_read(keyed):
    write_index(keyed, "20300101T000000-0000000001")
    found = entries(looked_up(keyed))
    assert list(found) == [DIGEST]
    assert found[DIGEST][0][0] == keyed.job_url("20300101T000000-0000000001", "job")


def test_a_planted_oversized_index_is_refused_before_a_byte_is_read(keyed, monkeypatch, caplog):
    """The issue's 200 MB index, scaled down: the limit is 4 KiB here, the index 64 KiB."""
    monkeypatch.setattr(cache_module, "MAX_INDEX_SIZE", 4096)
    keyed.put_bytes(index_url(keyed, "20300101T000000-00000000ff"), b"\0" * (64 * 1024))
    write_index(keyed, "20300101T000000-0000000001")
    feeds = Feeds(monkeypatch)
    found = looked_up(keyed)
    assert list(entries(found)) == [DIGEST]  # the signed one, read
    assert feeds.fed < 4096  # only the signed index's bytes; none of the planted one
    assert "over the limit of 4096 bytes" in caplog.text
    # refused once, not read again at the next look-up
    assert "20300101T000000-00000000ff.job" in found._known[FUNCTION]


def test_a_signed_index_over_the_limit_is_refused_too_and_never_written(keyed, monkeypatch):
    monkeypatch.setattr(cache_module, "MAX_INDEX_SIZE", 4096)
    calls = [(f"{i:064x}", i, 0) for i in range(200)]  # ~16 KiB
    url = write_index(keyed, "20300101T000000-0000000002", calls)
    with pytest.raises(ObjectTooLargeError):
        keyed.read_sealed(url, INDEX_KIND, limit=cache_module.MAX_INDEX_SIZE)
    assert entries(looked_up(keyed)) == {}


def test_an_unsigned_or_altered_index_is_ignored(keyed):
    keyed.put_bytes(index_url(keyed, "20300101T000000-0000000003"),
                    b'{"calls": [["' + DIGEST.encode() + b'", 0, 0]]}')
    url = write_index(keyed, "20300101T000000-0000000004")
    data = bytearray(keyed.get_bytes(url))
    data[-3] ^= 1
    keyed.put_bytes(url, bytes(data))
    assert entries(looked_up(keyed)) == {}


def test_a_listing_reads_at_most_max_index_reads_newest_first(keyed, monkeypatch):
    monkeypatch.setattr(cache_module, "MAX_INDEX_READS", 5)
    runs = [f"20300101T0000{i:02d}-{i:010x}" for i in range(12)]
    for number, run in enumerate(runs):
        write_index(keyed, run, [(f"{number:064x}", 0, 0)])
    reads = []
    real = keyed.read_sealed

    def counted(url, kind, **kwargs):
        reads.append(url)
        return real(url, kind, **kwargs)
    monkeypatch.setattr(keyed, "read_sealed", counted)
    found = looked_up(keyed)
    assert len(reads) == 5
    assert sorted(entries(found)) == sorted(f"{n:064x}" for n in range(7, 12))  # the newest


def test_a_local_index_that_is_a_symlink_or_fifo_is_refused_without_blocking(local, tmp_path):
    keyed = Storage(local.root_url, signer=Signer.from_key(b"k" * 32))
    elsewhere = write_index(keyed, "20300101T000000-0000000005")  # signed, but not this name
    linked = index_url(keyed, "20300101T000000-0000000006")
    os.symlink(keyed._path(elsewhere), keyed._path(linked))
    fifo = index_url(keyed, "20300101T000000-0000000007")
    os.mkfifo(keyed._path(fifo))
    os.unlink(keyed._path(elsewhere))
    results = []
    reader = threading.Thread(target=lambda: results.append(looked_up(keyed)), daemon=True)
    reader.start()
    reader.join(timeout=30)
    assert not reader.is_alive(), "reading the cache blocked on a FIFO"
    assert entries(results[0]) == {}
    for url in (linked, fifo):
        with pytest.raises(IntegrityError):
            keyed.read_sealed(url, INDEX_KIND)
        with pytest.raises(IntegrityError):
            keyed.get_bytes(url)  # plain reads too: no link followed, no FIFO opened


def test_a_whole_local_read_checks_the_size_first(local, monkeypatch):
    small = Storage(local.root_url, signer=Signer.from_key(b"k" * 32), max_object_size=1024)
    url = small.url("x")
    small.put_bytes(url, b"x" * 4096)
    with pytest.raises(ObjectTooLargeError):
        small.get_bytes(url)
    assert small.get_bytes(url, 0, 10) == b"x" * 10  # a range is the caller's bound


@pytest.mark.parametrize("planted", ["symlink", "fifo"])
def test_the_signing_key_file_is_read_as_a_private_regular_file(tmp_path, planted):
    from batchfutures import signing
    from batchfutures.errors import ConfigurationError

    path = tmp_path / "key"
    if planted == "symlink":
        (tmp_path / "real").write_text("ab" * 32)
        os.chmod(tmp_path / "real", 0o600)
        path.symlink_to(tmp_path / "real")
    else:
        os.mkfifo(path, 0o600)
    done = []
    reader = threading.Thread(target=lambda: done.append(_load(signing, path)), daemon=True)
    reader.start()
    reader.join(timeout=30)
    assert not reader.is_alive(), "reading the key blocked"
    assert isinstance(done[0], ConfigurationError), done


def _load(signing: Any, path: Any) -> Any:
    try:
        return signing.read_key_file(path, create=False)
    except Exception as error:  # noqa: BLE001 (the test inspects it)
        return error
