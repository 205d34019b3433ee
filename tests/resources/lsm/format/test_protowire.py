"""The schema-less protobuf reader refuses data of the wrong shape instead of inventing bytes."""

from __future__ import annotations

import pytest

from resources.lsm.format.protowire import ProtobufDecodeError, decode


def test_a_varint_where_bytes_are_expected_is_an_error_not_a_zero_buffer():
    message = decode(bytes([0x08, 0x05]))  # field 1, varint 5
    with pytest.raises(ProtobufDecodeError, match="field 1 is a varint"):
        message.bytes(1)
    with pytest.raises(ProtobufDecodeError, match="field 1 is a varint"):
        message.messages(1)


def test_length_delimited_fields_decode():
    message = decode(bytes([0x12, 0x03]) + b"abc")  # field 2, 3 bytes
    assert message.bytes(2) == b"abc" and message.string(2) == "abc" and message.bytes(3) is None
