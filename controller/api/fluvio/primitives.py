"""The primitives of Fluvio's admin wire protocol (../shared/fluvio-wire.md): integers, strings,
options, lists, maps, version-gated structs and tagged enums, and ``struct``, which derives a
struct's layout from its dataclass, so that each message and object type is declared once.

Purely computational and sans-I/O: functions of bytes only, no asyncio, aiohttp, structlog or logging.
"""

from __future__ import annotations

import dataclasses
import enum
import struct as struct_module
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

# Version 0 encodes only the ungated fields; the request header's version reaches every nested struct.
ANY_VERSION = 2**15 - 1


class CodecError(ValueError):
    """Bytes that are not a valid message, or a value the protocol cannot carry."""


class DecodeError(CodecError):
    pass


class EncodeError(CodecError):
    pass


# ---------------------------------------------------------------------------- reading and codecs


class Reader:
    """A cursor over one message's bytes."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos

    def take(self, size: int, what: str) -> bytes:
        end = self.pos + size
        if size < 0 or end > len(self.data):
            raise DecodeError(f"{what} needs {size} bytes at offset {self.pos}, only {self.remaining} left")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk


Tag = TypeVar("Tag", bound=enum.IntEnum)


class Codec:
    """Encodes a value into a bytearray and decodes it back, both at a protocol version."""

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        raise NotImplementedError

    def decode(self, reader: Reader, version: int) -> Any:
        raise NotImplementedError


class Int(Codec):
    __slots__ = ("fmt", "packer", "name", "low", "high")

    def __init__(self, fmt: str, name: str) -> None:
        self.fmt = fmt
        self.packer = struct_module.Struct(">" + fmt)
        self.name = name
        bits = self.packer.size * 8
        signed = fmt.islower()
        self.low = -(2 ** (bits - 1)) if signed else 0
        self.high = 2 ** (bits - 1) - 1 if signed else 2**bits - 1

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        try:
            if type(value) is bool:
                raise struct_module.error("a bool is not a number")
            out += self.packer.pack(value)
        except struct_module.error:
            raise EncodeError(f"{self.name} must be a whole number in [{self.low}, {self.high}], got {value!r}") from None

    def decode(self, reader: Reader, version: int) -> int:
        pos = reader.pos
        end = pos + self.packer.size
        if end > len(reader.data):
            raise DecodeError(f"{self.name} needs {self.packer.size} bytes at offset {pos}, only {reader.remaining} left")
        reader.pos = end
        return self.packer.unpack_from(reader.data, pos)[0]


I8, U8, I16, U16 = Int("b", "i8"), Int("B", "u8"), Int("h", "i16"), Int("H", "u16")
I32, U32, I64, U64 = Int("i", "i32"), Int("I", "u32"), Int("q", "i64"), Int("Q", "u64")


class _Bool(Codec):
    def encode(self, out: bytearray, value: Any, version: int) -> None:
        if type(value) is not bool:
            raise EncodeError(f"bool must be True or False, got {value!r}")
        out.append(1 if value else 0)

    def decode(self, reader: Reader, version: int) -> bool:
        byte = reader.take(1, "bool")[0]
        if byte > 1:
            raise DecodeError(f"bool at offset {reader.pos - 1} is 0x{byte:02x}, not 00 or 01")
        return byte == 1


BOOL = _Bool()
MAX_STRING_BYTES = 2**15 - 1


class _String(Codec):
    """u16 byte length then UTF-8; Fluvio's decoder reads the length as i16 (<= 0 is "")."""

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        if not isinstance(value, str):
            raise EncodeError(f"string expected, got {value!r}")
        raw = value.encode()
        if len(raw) > MAX_STRING_BYTES:
            raise EncodeError(f"string of {len(raw)} bytes is longer than the protocol's {MAX_STRING_BYTES} ({value[:40]!r}...)")
        out += len(raw).to_bytes(2, "big")
        out += raw

    def decode(self, reader: Reader, version: int) -> str:
        length = I16.decode(reader, version)
        if length <= 0:
            return ""
        raw = reader.take(length, "string")
        try:
            return raw.decode()
        except UnicodeDecodeError as error:
            raise DecodeError(f"string at offset {reader.pos - length} is not UTF-8: {error}") from None


STRING = _String()


class _Rest(Codec):
    """The remaining bytes of a TypeBuffer payload, kept raw (an object type this SC does not serve)."""

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        out += value

    def decode(self, reader: Reader, version: int) -> bytes:
        return reader.take(reader.remaining, "payload")


REST = _Rest()


class OptionOf(Codec):
    __slots__ = ("inner",)

    def __init__(self, inner: Codec) -> None:
        self.inner = inner

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        if value is None:
            out.append(0)
        else:
            out.append(1)
            self.inner.encode(out, value, version)

    def decode(self, reader: Reader, version: int) -> Any:
        flag = reader.take(1, "option flag")[0]
        if flag == 0:
            return None
        if flag != 1:
            raise DecodeError(f"option flag at offset {reader.pos - 1} is 0x{flag:02x}, not 00 or 01")
        return self.inner.decode(reader, version)


class VecOf(Codec):
    """Count written as u32 and read as i32 (< 1 is empty), then the elements; a count above
    ``limit`` (None: any) is refused before any element is decoded."""

    __slots__ = ("inner", "limit")

    def __init__(self, inner: Codec, limit: int | None = None) -> None:
        self.inner = inner
        self.limit = limit

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        if not isinstance(value, (list, tuple)):
            raise EncodeError(f"list expected, got {value!r}")
        out += len(value).to_bytes(4, "big")
        for item in value:
            self.inner.encode(out, item, version)

    def decode(self, reader: Reader, version: int) -> list[Any]:
        count = I32.decode(reader, version)
        if count < 1:
            return []
        # Every element takes at least one byte: a count beyond the bytes left is a lie.
        if count > reader.remaining:
            raise DecodeError(f"list of {count} elements at offset {reader.pos - 4}, only {reader.remaining} bytes left")
        # Decoding costs ten to forty times the bytes, on the event loop: a list longer than any
        # request needs is refused by its count, not after its elements were built.
        if self.limit is not None and count > self.limit:
            raise DecodeError(f"list of {count} elements at offset {reader.pos - 4} is above the limit of {self.limit}")
        inner = self.inner
        if isinstance(inner, Int):
            # A list of integers (replicas, SPU ids) in one call: a million of them in 0.05 s, not 1.
            return list(struct_module.unpack(f">{count}{inner.fmt}", reader.take(count * inner.packer.size, f"list of {count} {inner.name}")))
        return [inner.decode(reader, version) for _ in range(count)]


class MapOf(Codec):
    """BTreeMap: u16 count, then key/value pairs in ascending key order."""

    __slots__ = ("key", "value")

    def __init__(self, key: Codec, value: Codec) -> None:
        self.key = key
        self.value = value

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        if not isinstance(value, Mapping):
            raise EncodeError(f"mapping expected, got {value!r}")
        if len(value) > 0xFFFF:
            raise EncodeError(f"a map holds at most 65535 entries on the wire, got {len(value)}")
        out += len(value).to_bytes(2, "big")
        for key in sorted(value):
            self.key.encode(out, key, version)
            self.value.encode(out, value[key], version)

    def decode(self, reader: Reader, version: int) -> dict[Any, Any]:
        count = U16.decode(reader, version)
        decoded = {}
        for _ in range(count):
            key = self.key.decode(reader, version)
            decoded[key] = self.value.decode(reader, version)
        return decoded


@dataclass(frozen=True, slots=True)
class Field:
    """One struct field; present on the wire only when min_version <= version <= max_version."""

    name: str
    codec: Codec
    min_version: int = 0
    max_version: int = ANY_VERSION


class Struct(Codec):
    """Fields in declaration order, no framing; an absent (version-gated) field takes its default."""

    def __init__(self, cls: type, *fields: Field) -> None:
        self.cls = cls
        self.fields = fields
        # Per version: the present fields' (name, bound encoder), so encoding tests no gates.
        self._encoders: dict[int, tuple[tuple[str, Callable[[bytearray, Any, int], None]], ...]] = {}

    def _present(self, version: int) -> tuple[tuple[str, Callable[[bytearray, Any, int], None]], ...]:
        present = tuple(
            (spec.name, spec.codec.encode) for spec in self.fields if spec.min_version <= version <= spec.max_version
        )
        self._encoders[version] = present
        return present

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        if not isinstance(value, self.cls):
            raise EncodeError(f"{self.cls.__name__} expected, got {value!r}")
        present = self._encoders.get(version) or self._present(version)
        for name, encode in present:
            try:
                encode(out, getattr(value, name), version)
            except EncodeError as error:
                raise EncodeError(f"{self.cls.__name__}.{name}: {error}") from None

    def decode_fields(self, reader: Reader, version: int) -> dict[str, Any]:
        values = {}
        for spec in self.fields:
            if spec.min_version <= version <= spec.max_version:
                try:
                    values[spec.name] = spec.codec.decode(reader, version)
                except DecodeError as error:
                    raise DecodeError(f"{self.cls.__name__}.{spec.name}: {error}") from None
        return values

    def decode(self, reader: Reader, version: int) -> Any:
        return self.cls(**self.decode_fields(reader, version))


class Tagged(Codec):
    """An enum with payloads: the tag, then the variant's fields (never version-gated themselves)."""

    def __init__(self, name: str, tag: Int, variants: Mapping[int, Struct]) -> None:
        self.name = name
        self.tag = tag
        self.by_tag = dict(variants)
        self.by_type = {variant.cls: (number, variant) for number, variant in variants.items()}

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        found = self.by_type.get(type(value))
        if found is None:
            raise EncodeError(f"{self.name} cannot be {value!r}")
        number, variant = found
        self.tag.encode(out, number, version)
        variant.encode(out, value, version)

    def decode(self, reader: Reader, version: int) -> Any:
        number = self.tag.decode(reader, version)
        variant = self.by_tag.get(number)
        if variant is None:
            raise DecodeError(f"{self.name} has no variant with tag {number} (known: {sorted(self.by_tag)})")
        return variant.decode(reader, version)


class EnumU8(Codec, Generic[Tag]):
    """A unit-only enum carried as its u8 tag."""

    def __init__(self, cls: type[Tag]) -> None:
        self.cls = cls

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        if not isinstance(value, self.cls):
            raise EncodeError(f"{self.cls.__name__} expected, got {value!r}")
        out.append(int(value))

    def decode(self, reader: Reader, version: int) -> Tag:
        number = reader.take(1, self.cls.__name__)[0]
        try:
            return self.cls(number)
        except ValueError:
            raise DecodeError(f"{self.cls.__name__} has no value {number} (known: {[int(v) for v in self.cls]})") from None


@dataclass(frozen=True, slots=True)
class Since:
    """In a field's ``Annotated`` type: the field is on the wire from this version on."""

    version: int


def struct(cls: type, **codecs: Codec) -> Struct:
    """The Struct of a dataclass whose fields say their own wire layout: a field typed
    ``Annotated[T, codec]`` (with ``Since(n)`` when a version gates it) is on the wire, in the
    order the class declares its fields. ``codecs`` gives the codec of a field whose layout
    depends on where it is (a Metadata's spec, by type label); a field with neither is not on the
    wire (a request's type label travels in front of its payload)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = []
    for declared in dataclasses.fields(cls):
        codec, since = codecs.get(declared.name), 0
        hint = hints[declared.name]
        if typing.get_origin(hint) is Annotated:
            for extra in hint.__metadata__:
                if isinstance(extra, Codec) and codec is None:
                    codec = extra
                elif isinstance(extra, Since):
                    since = extra.version
        if codec is not None:
            fields.append(Field(declared.name, codec, since))
    unknown = set(codecs) - {declared.name for declared in dataclasses.fields(cls)}
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {sorted(unknown)}")
    return Struct(cls, *fields)
