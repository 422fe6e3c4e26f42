"""wire.py's inputs object, as bytes: built with given tags, read back field by field (no key,
no storage: storage.Storage computes and checks the MACs; tests/test_storage.py reads it there)."""

from __future__ import annotations

import json
import struct

import pytest

from batchfutures import wire
from batchfutures.signing import TAG_SIZE

MAC = bytes(range(32))


def tags(count: int) -> list:
    return [bytes([i]) * TAG_SIZE for i in range(count)]


@pytest.mark.parametrize("blobs", [[b"only"], [b"a", b"bb", b""], [b"x" * 10] * 5])
def test_pack_inputs_reads_back(blobs):
    body = wire.inputs_header_body({"encoding": "arg"}, len(blobs))
    data = wire.pack_inputs(body, MAC, tags(len(blobs)), blobs)
    table = wire.index_offset(data[:wire.PREFIX_READ])
    assert table is not None
    signed = wire.split_signed_header(data[wire.INPUTS_PREAMBLE:table])
    assert signed == (body, MAC)
    assert json.loads(body) == {"encoding": "arg", "children": len(blobs)}
    for index, blob in enumerate(blobs):
        start, stop = wire.child_range(data, wire.index_entry(table, index))
        assert data[start:start + TAG_SIZE] == tags(len(blobs))[index]
        assert data[start + TAG_SIZE:stop] == blob
    last = wire.child_range(data, wire.index_entry(table, len(blobs) - 1))[1]
    assert last == len(data)


@pytest.mark.parametrize("children, padded", [(1, False), (2, True), (50, True)])
def test_the_prefix_holds_no_blob_of_an_array(children, padded):
    blobs = [b"b" * 3] * children
    data = wire.pack_inputs(wire.inputs_header_body({}, children), MAC, tags(children), blobs)
    table = wire.index_offset(data)
    assert table is not None
    first = wire.child_range(data, wire.index_entry(table, 0))[0]
    assert (first >= wire.PREFIX_READ) is padded


def test_the_header_names_its_children_and_refuses_the_mac_field():
    assert json.loads(wire.inputs_header_body({"b": 1, "a": 2}, 3)) == {"a": 2, "b": 1,
                                                                        "children": 3}
    with pytest.raises(ValueError):
        wire.inputs_header_body({"hmac": "x"}, 1)


@pytest.mark.parametrize("prefix, table", [
    (wire.INPUTS_MAGIC + struct.pack("<Q", 10) + b"{}", 26),
    (b"BFINPUT2" + struct.pack("<Q", 10), None),  # another version's magic
    (wire.INPUTS_MAGIC + b"\x00", None),  # too short for the header's length
    (b"", None),
])
def test_index_offset(prefix, table):
    assert wire.index_offset(prefix) == table


HEX = "ab" * 32


@pytest.mark.parametrize("stored, signed", [
    (b'{"a":1,"hmac":"' + HEX.encode() + b'"}', (b'{"a":1}', bytes.fromhex(HEX))),
    (b'{"hmac":"' + HEX.encode() + b'"}', (b"{}", bytes.fromhex(HEX))),
    (b'{"a":1}', None),  # unsigned
    (b'{"a":1,"hmac":"' + HEX.encode() + b'","b":2}', None),  # the MAC is not the last field
    (b'{"a":1 "hmac":"' + HEX.encode() + b'"}', None),  # not a field of the object
    (b'{"a":1,"hmac":"' + HEX[:-2].encode() + b'"}', None),  # a short MAC
])
def test_split_signed_header(stored, signed):
    assert wire.split_signed_header(stored) == signed


def test_child_number_is_a_little_endian_u64():
    assert wire.child_number(1) == b"\x01" + bytes(7)
