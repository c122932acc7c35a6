"""Protobuf's wire format, the little the relay writes and reads by hand: varints and
length-delimited fields (strings, bytes, messages, packed lists), whose key is the field number
shifted left by 3 with wire type 2. relay/request.py writes Triton's request messages with these;
relay/response_shape.py slices Triton's repeated responses with them."""

from __future__ import annotations


def varint(value: int) -> bytes:
    """A non-negative integer as a varint: 7 bits a byte, low first, the high bit on all but the last."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it (IndexError past the end)."""
    value, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def length_field(key: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its key (one byte for field numbers below 16), the payload's length,
    the payload."""
    size = len(payload)
    return key + (bytes((size,)) if size < 0x80 else varint(size)) + payload
