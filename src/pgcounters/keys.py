"""Counter keys: validation and the canonical text form stored in the database.

A counter is declared with a tuple of key types (``()`` for a global counter,
``("bigint",)`` for a row id, ``("bigint", "date")`` for article + day, ...).
Keys are stored as ``text[]`` whose elements are the canonical text of each
part, the same text PostgreSQL's own casts produce (``42``, a lower-case
hyphenated UUID, an ISO date), so triggers written in SQL and the Python client
agree byte for byte.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Sequence
from typing import Literal, TypeAlias, get_args

from pgcounters.errors import InvalidCounterName, InvalidDelta, InvalidKey

KeyType: TypeAlias = Literal["bigint", "uuid", "text", "date"]
KEY_TYPES: tuple[KeyType, ...] = get_args(KeyType)
KeyPart: TypeAlias = int | str | uuid.UUID | dt.date
Key: TypeAlias = tuple[KeyPart, ...]

BIGINT_MIN = -(2**63)
BIGINT_MAX = 2**63 - 1
MAX_KEY_PARTS = 8
MAX_TEXT_PART = 1000  # characters; keeps a key well inside a btree index row
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]{0,199}")

_PY_NAMES: dict[type, KeyType] = {int: "bigint", str: "text", uuid.UUID: "uuid", dt.date: "date"}


def check_name(name: object) -> str:
    """Return ``name`` if it is a valid counter name, else raise InvalidCounterName."""
    if not isinstance(name, str) or NAME_RE.fullmatch(name) is None:
        raise InvalidCounterName(
            f"invalid counter name {name!r}: use 1-200 characters of letters, digits and "
            "_ . : / -, starting with a letter or _"
        )
    return name


def normalize_key_types(key: object) -> tuple[KeyType, ...]:
    """Turn a key declaration (``None``, ``"bigint"``, ``int``, or a sequence) into key types."""
    if key is None:
        return ()
    items: Sequence[object] = (
        key if isinstance(key, tuple | list) else [key]  # a single type
    )
    if len(items) > MAX_KEY_PARTS:
        raise InvalidKey(f"a key has at most {MAX_KEY_PARTS} parts, got {len(items)}")
    out: list[KeyType] = []
    for item in items:
        if isinstance(item, type) and item in _PY_NAMES:
            out.append(_PY_NAMES[item])
        elif isinstance(item, str) and item in KEY_TYPES:
            out.append(item)
        else:
            raise InvalidKey(
                f"unknown key type {item!r}: use one of {', '.join(KEY_TYPES)} "
                "(or int, str, uuid.UUID, datetime.date)"
            )
    return tuple(out)


def _encode_part(part: object, key_type: KeyType, counter: str) -> str:
    def wrong() -> InvalidKey:
        return InvalidKey(f"counter {counter!r}: key part {part!r} is not a valid {key_type}")

    if key_type == "bigint":
        if isinstance(part, bool) or not isinstance(part, int):
            raise wrong()
        if not BIGINT_MIN <= part <= BIGINT_MAX:
            raise InvalidKey(f"counter {counter!r}: key part {part} is out of the bigint range")
        return str(part)
    if key_type == "uuid":
        if isinstance(part, uuid.UUID):
            return str(part)
        if isinstance(part, str):
            try:
                return str(uuid.UUID(part))
            except ValueError:
                raise wrong() from None
        raise wrong()
    if key_type == "date":
        if isinstance(part, dt.datetime) or not isinstance(part, dt.date):
            raise wrong()
        return part.isoformat()
    # text
    if not isinstance(part, str):
        raise wrong()
    if "\x00" in part:
        raise InvalidKey(f"counter {counter!r}: a text key cannot contain NUL bytes")
    try:
        part.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidKey(
            f"counter {counter!r}: a text key cannot contain unpaired surrogates (not UTF-8)"
        ) from None
    if len(part) > MAX_TEXT_PART:
        raise InvalidKey(
            f"counter {counter!r}: a text key part has at most {MAX_TEXT_PART} characters"
        )
    return part


_ONE_BIGINT: tuple[KeyType, ...] = ("bigint",)


def encode_key(key: object, key_types: tuple[KeyType, ...], counter: str) -> list[str]:
    """Validate ``key`` against ``key_types`` and return its canonical ``text[]`` form."""
    if type(key) is int and key_types == _ONE_BIGINT and BIGINT_MIN <= key <= BIGINT_MAX:
        return [str(key)]  # the hot path: one integer key
    if not key_types:
        if key is None or key == ():
            return []
        raise InvalidKey(f"counter {counter!r} is global and takes no key, got {key!r}")
    parts: tuple[object, ...]
    if len(key_types) == 1 and not isinstance(key, tuple):
        parts = (key,)
    elif isinstance(key, tuple):
        parts = key
    else:
        raise InvalidKey(
            f"counter {counter!r} takes a key of ({', '.join(key_types)}), got {key!r}"
        )
    if len(parts) != len(key_types):
        raise InvalidKey(
            f"counter {counter!r} takes a key of ({', '.join(key_types)}), got {key!r}"
        )
    return [_encode_part(p, t, counter) for p, t in zip(parts, key_types, strict=True)]


def decode_key(parts: Sequence[str], key_types: tuple[KeyType, ...]) -> Key:
    """Turn a stored ``text[]`` key back into Python values."""
    out: list[KeyPart] = []
    if len(parts) != len(key_types):
        raise InvalidKey(f"stored key {list(parts)!r} does not have {len(key_types)} parts")
    for text, key_type in zip(parts, key_types, strict=True):
        try:
            if key_type == "bigint":
                out.append(int(text))
            elif key_type == "uuid":
                out.append(uuid.UUID(text))
            elif key_type == "date":
                out.append(dt.date.fromisoformat(text))
            else:
                out.append(text)
        except ValueError:
            # written before keys were checked in SQL (schema version 8)
            raise InvalidKey(
                f"stored key part {text!r} is not a canonical {key_type}: "
                "see `pgcounters recount` to rebuild the counter"
            ) from None
    return tuple(out)


def check_delta(delta: object) -> int:
    """Return ``delta`` if it is an int in the bigint range, else raise InvalidDelta."""
    if type(delta) is int and BIGINT_MIN <= delta <= BIGINT_MAX:
        return delta
    if isinstance(delta, bool) or not isinstance(delta, int):
        raise InvalidDelta(f"a delta must be an int, got {delta!r}")
    if not BIGINT_MIN <= delta <= BIGINT_MAX:
        raise InvalidDelta(f"delta {delta} is out of the bigint range")
    return delta
