"""HPACK header blocks: the ones made only of indexed fields are remembered, and forgotten as soon as
the dynamic table may have changed (the same bytes then name other headers)."""

from __future__ import annotations

import pytest
from hpack import Encoder
from hpack.exceptions import HPACKError

from trtllm_service.relay.grpc_http2 import HeaderBlocks, _only_indexed

START = [(b":status", b"200"), (b"content-type", b"application/grpc")]
OTHER = [(b"x-other", b"1")]


def test_triton_blocks_are_decoded_once_while_the_table_stays() -> None:
    encoder, blocks = Encoder(), HeaderBlocks()
    first = encoder.encode(START)  # literals, added to the table
    again = encoder.encode(START)  # now indexed: what Triton sends from its second call on
    assert not _only_indexed(first) and _only_indexed(again) and len(again) == 2
    assert [tuple(h) for h in blocks.decode(first)] == START
    decoded = blocks.decode(again)
    assert [tuple(h) for h in decoded] == START
    assert blocks.decode(again) is decoded  # remembered, not decoded again


def test_a_block_that_may_change_the_table_forgets_what_was_remembered() -> None:
    encoder, blocks = Encoder(), HeaderBlocks()
    blocks.decode(encoder.encode(OTHER))
    indexed = encoder.encode(OTHER)  # index 62: the newest dynamic entry
    assert [tuple(h) for h in blocks.decode(indexed)] == OTHER
    blocks.decode(encoder.encode(START))  # new entries: index 62 is now another header
    assert [tuple(h) for h in blocks.decode(indexed)] != OTHER
    assert [tuple(h) for h in blocks.decode(indexed)] == [START[-1]]


@pytest.mark.parametrize(
    ("block", "indexed"),
    [(b"\x88", True), (b"\xbe\xbf", True), (b"\xff\x80\x01", True), (b"\x88\x40", False), (b"\x20", False)],
)
def test_only_indexed(block: bytes, indexed: bool) -> None:
    assert _only_indexed(block) is indexed


def test_an_undecodable_block_raises_and_is_not_remembered() -> None:
    blocks = HeaderBlocks()
    with pytest.raises(HPACKError):
        blocks.decode(b"\xff\x80\x01")  # index 255: no such entry
    with pytest.raises(HPACKError):
        blocks.decode(b"\xff\x80\x01")
