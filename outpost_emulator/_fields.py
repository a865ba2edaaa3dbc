"""Field checks that reproduce pydantic's lax-mode rules and error entries for Polar's schemas."""

from __future__ import annotations

import math
import uuid
from decimal import Decimal, InvalidOperation
from typing import Any, TypeGuard

from outpost_emulator._errors import Errors, Loc, too_long_msg, too_short_msg

NUL_MSG = "Value error, This value contains invalid characters"
_NUL_CTX = {"error": "This value contains invalid characters"}
_BOOL_WORDS = {
    "0": False, "off": False, "f": False, "false": False, "n": False, "no": False,
    "1": True, "on": True, "t": True, "true": True, "y": True, "yes": True,
}  # fmt: skip


def has_nul(value: Any) -> bool:
    """Polar's `Schema` rejects NUL characters anywhere in a field (keys included)."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_nul(v) for v in value)
    return False


def check_nul(value: Any, loc: Loc, errors: Errors) -> None:
    """Polar's error for a NUL character in ``value``, if it holds one."""
    if has_nul(value):
        errors.add(loc, "value_error", NUL_MSG, value, _NUL_CTX)


def check_str(
    value: Any,
    loc: Loc,
    errors: Errors,
    *,
    min_length: int | None = None,
    max_length: int | None = None,
    tag: str | None = None,
) -> TypeGuard[str]:
    """A strict string (pydantic never turns numbers into strings) within length bounds."""
    at = (*loc, tag) if tag else loc
    if not isinstance(value, str):
        errors.add(at, "string_type", "Input should be a valid string", value)
        return False
    if min_length is not None and len(value) < min_length:
        ctx = {"min_length": min_length}
        errors.add(at, "string_too_short", too_short_msg(min_length), value, ctx)
        return False
    if max_length is not None and len(value) > max_length:
        ctx = {"max_length": max_length}
        errors.add(at, "string_too_long", too_long_msg(max_length), value, ctx)
        return False
    return True


def lax_int(value: Any) -> tuple[int | None, str, str]:
    """pydantic's lax int: (value, "", "") or (None, error type, message)."""
    if isinstance(value, bool):
        return int(value), "", ""
    if isinstance(value, int):
        return value, "", ""
    if isinstance(value, float):
        if not math.isfinite(value):
            return None, "finite_number", "Input should be a finite number"
        if value != int(value):
            return None, "int_from_float", _FRACTION_MSG
        return int(value), "", ""
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text), "", ""
        except ValueError:
            pass
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if math.isfinite(number) and number == int(number):
            return int(number), "", ""
        return None, "int_parsing", _INT_PARSING_MSG
    return None, "int_type", "Input should be a valid integer"


_FRACTION_MSG = "Input should be a valid integer, got a number with a fractional part"
_INT_PARSING_MSG = "Input should be a valid integer, unable to parse string as an integer"


def check_int(value: Any, loc: Loc, errors: Errors) -> int | None:
    result, type_, msg = lax_int(value)
    if result is None:
        errors.add(loc, type_, msg, value)
    return result


def bool_error(value: Any) -> tuple[str, str]:
    """The bool branch error pydantic reports for a value that is not a lax bool."""
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return "bool_parsing", "Input should be a valid boolean, unable to interpret input"
    return "bool_type", "Input should be a valid boolean"


def lax_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, float) and value in (0.0, 1.0):
        return bool(value)
    if isinstance(value, str):
        return _BOOL_WORDS.get(value.strip().lower())
    return None


def check_uuid4(value: Any, loc: Loc, errors: Errors) -> str | None:
    if not isinstance(value, str):
        errors.add(loc, "uuid_type", "UUID input should be a string, bytes or UUID object", value)
        return None
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        msg = "Input should be a valid UUID, invalid format"
        errors.add(loc, "uuid_parsing", msg, value, {"error": "invalid format"})
        return None
    if parsed.version != 4:
        errors.add(loc, "uuid_version", "UUID version 4 expected", value, {"expected_version": 4})
        return None
    return str(parsed)


def check_decimal(
    value: Any, loc: Loc, errors: Errors, *, max_digits: int, decimal_places: int
) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        msg = "Decimal input should be an integer, float, string or Decimal object"
        errors.add(loc, "decimal_type", msg, value)
        return False
    try:
        number = Decimal(str(value).strip())
    except InvalidOperation:
        errors.add(loc, "decimal_parsing", "Input should be a valid decimal", value)
        return False
    if not number.is_finite():
        errors.add(loc, "finite_number", "Input should be a finite number", value)
        return False
    _, digit_tuple, exponent = number.normalize().as_tuple()
    assert isinstance(exponent, int)
    if exponent >= 0:
        digits, decimals = len(digit_tuple) + exponent, 0
    else:
        decimals = -exponent
        digits = max(len(digit_tuple), decimals)
    if digits > max_digits:
        msg = f"Decimal input should have no more than {max_digits} digits in total"
        errors.add(loc, "decimal_max_digits", msg, value, {"max_digits": max_digits})
        return False
    if decimals > decimal_places:
        msg = f"Decimal input should have no more than {decimal_places} decimal places"
        errors.add(loc, "decimal_max_places", msg, value, {"decimal_places": decimal_places})
        return False
    return True


def check_metadata_value(value: Any, loc: Loc, errors: Errors) -> bool:
    """`str (1..500) | int | float | bool`, with pydantic's one-error-per-branch report.

    NaN and infinities are refused here although pydantic's float accepts them: Polar's JSONB
    column cannot store them, so the emulator answers 422 instead of Polar's 500.
    """
    if isinstance(value, bool | int):
        return True
    if isinstance(value, float):
        if math.isfinite(value):
            return True
        errors.add(loc, "finite_number", "Input should be a finite number", value)
        return False
    if isinstance(value, str) and 1 <= len(value) <= 500:
        return True
    check_str(value, loc, errors, min_length=1, max_length=500, tag="constrained-str")
    if isinstance(value, str):
        errors.add((*loc, "int"), "int_parsing", _INT_PARSING_MSG, value)
        msg = "Input should be a valid number, unable to parse string as a number"
        errors.add((*loc, "float"), "float_parsing", msg, value)
    else:
        errors.add((*loc, "int"), "int_type", "Input should be a valid integer", value)
        errors.add((*loc, "float"), "float_type", "Input should be a valid number", value)
    type_, msg = bool_error(value)
    errors.add((*loc, "bool"), type_, msg, value)
    return False
