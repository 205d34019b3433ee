"""Minimal protobuf wire-format reader.

Lance keeps MemWAL state in protobuf messages (shard manifests, the MemWAL index
details inside the base table's manifest) but pylance exposes no Python classes
for them. Decoding the handful of fields we need straight from the wire format
avoids generated code that would have to track Lance's ``.proto`` files; the
field numbers live next to each decoder as named constants.
"""

from __future__ import annotations

import builtins
from collections import defaultdict
from dataclasses import dataclass, field

_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5


class ProtobufDecodeError(ValueError):
    """Raised when bytes are not a well-formed protobuf message."""


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ProtobufDecodeError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtobufDecodeError("varint longer than 10 bytes")


@dataclass
class Message:
    """The fields of one decoded message, by field number, in wire order.

    Scalars (varint, fixed32, fixed64) are kept as ``int``; length-delimited
    fields as ``bytes`` (decode nested messages with :func:`decode`).
    """

    fields: dict[int, list[int | bytes]] = field(default_factory=lambda: defaultdict(list))

    # Past the methods ``int`` and ``bytes``, those names in annotations mean the methods: hence ``builtins.``.

    def int(self, number: int, default: int = 0) -> int:
        """Last value of a scalar field (protobuf's last-one-wins rule)."""
        values = self.fields.get(number)
        return int(values[-1]) if values else default

    def optional_int(self, number: builtins.int) -> builtins.int | None:
        values = self.fields.get(number)
        return int(values[-1]) if values else None

    def bytes(self, number: builtins.int) -> builtins.bytes | None:
        values = self.fields.get(number)
        return _as_bytes(values[-1], number) if values else None

    def string(self, number: builtins.int) -> str | None:
        raw = self.bytes(number)
        return raw.decode("utf-8") if raw is not None else None

    def message(self, number: builtins.int) -> Message | None:
        raw = self.bytes(number)
        return decode(raw) if raw is not None else None

    def messages(self, number: builtins.int) -> list[Message]:
        return [decode(_as_bytes(raw, number)) for raw in self.fields.get(number, [])]


def _as_bytes(raw: builtins.int | bytes, number: builtins.int) -> bytes:
    """A length-delimited field's bytes; a varint there means the data is not what the decoder expects."""
    if isinstance(raw, int):
        raise ProtobufDecodeError(f"field {number} is a varint where a length-delimited value was expected")
    return bytes(raw)


def decode(data: bytes) -> Message:
    """Split ``data`` into its fields without a schema.

    Raises
    ------
    ProtobufDecodeError
        If the bytes are truncated or use a wire type Lance never writes.
    """
    message = Message()
    pos = 0
    value: int | bytes
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire_type = key >> 3, key & 0x7
        if wire_type == _VARINT:
            value, pos = _read_varint(data, pos)
        elif wire_type == _FIXED64:
            value, pos = int.from_bytes(data[pos : pos + 8], "little"), pos + 8
        elif wire_type == _FIXED32:
            value, pos = int.from_bytes(data[pos : pos + 4], "little"), pos + 4
        elif wire_type == _LENGTH_DELIMITED:
            length, pos = _read_varint(data, pos)
            if pos + length > len(data):
                raise ProtobufDecodeError(f"field {number} runs past the end of the message")
            value, pos = data[pos : pos + length], pos + length
        else:
            raise ProtobufDecodeError(f"unsupported wire type {wire_type} for field {number}")
        if pos > len(data):
            raise ProtobufDecodeError(f"field {number} runs past the end of the message")
        message.fields[number].append(value)
    return message
