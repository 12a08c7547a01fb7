"""Reading request bodies and headers the way every report route does.

A JSON body nests at most :data:`dp_governor.api.errors.MAX_JSON_DEPTH` levels and holds no lone
surrogate; ``X-Device-Id`` and ``Idempotency-Key`` are sent at most once. Used by the report route
and by the fast lane (:mod:`dp_governor.api._lane`), so both read a request the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dp_governor.api.errors import MAX_JSON_DEPTH
from dp_governor.budget.errors import InvalidRequest

__all__ = ["check_json", "decode_json", "duplicated_header"]

_SINGLE_HEADERS = {b"x-device-id": "X-Device-Id", b"idempotency-key": "Idempotency-Key"}


def duplicated_header(headers: Sequence[tuple[bytes, bytes]]) -> str | None:
    """The first of ``X-Device-Id`` / ``Idempotency-Key`` sent more than once, else ``None``.

    Two copies would be read differently by different parsers (the first or the last), so a
    request carrying two is refused rather than guessed at.

    >>> duplicated_header([(b"x-device-id", b"a"), (b"x-device-id", b"b")])
    'X-Device-Id'
    """
    seen: set[bytes] = set()
    for name, _ in headers:
        if name in _SINGLE_HEADERS:
            if name in seen:
                return _SINGLE_HEADERS[name]
            seen.add(name)
    return None


def check_json(value: Any) -> Any:
    r"""``value`` if it nests at most 16 levels and holds no lone surrogate, else 422 on `body`.

    A report is three levels deep at most; deeper values break error messages (``repr``
    recursion) and a lone surrogate (``"\ud800"``) cannot be encoded as UTF-8 again, so both
    are refused where the body is read, naming the problem.

    >>> check_json({"j": 1, "bits": "AA=="})
    {'j': 1, 'bits': 'AA=='}
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    raise InvalidRequest(
                        "body", "holds a lone surrogate (such as \\ud800), which is not a character"
                    ) from None
        elif isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise InvalidRequest("body", f"nests deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(item, dict):
                stack.extend((k, depth) for k in item)
                stack.extend((v, depth + 1) for v in item.values())
            else:
                stack.extend((v, depth + 1) for v in item)
    return value


def decode_json(raw: bytes) -> Any:
    """A JSON body as the report routes read it, through :func:`check_json` (422 on `body`)."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise InvalidRequest("body", f"nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        raise InvalidRequest("body", f"is not valid JSON: {exc}") from None
    return check_json(value)
