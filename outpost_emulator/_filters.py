"""Validation of meter filters, aggregations and `MeterCreate`, as Polar's pydantic models do.

Polar (meter/filter.py, meter/aggregation.py, meter/schemas.py): a filter is
`{conjunction: and|or, clauses: [FilterClause | Filter]}`; a clause value is a string of at most
1000 characters, an Int32 or a bool (pydantic's lax mode turns 3.0 into 3); a leading
`metadata.` is stripped from properties; aggregations are discriminated by `func`.
Error entries reproduce pydantic's, union-member tags included.
"""

from __future__ import annotations

import math
from typing import Any, cast

from outpost_emulator._errors import Errors, Loc
from outpost_emulator._fields import (
    NUL_MSG,
    bool_error,
    check_int,
    check_metadata_value,
    check_nul,
    check_str,
    has_nul,
)
from outpost_emulator._model import (
    AGGREGATION_FUNCS,
    OPERATORS,
    Aggregation,
    AggregationFunc,
    Clause,
    ClauseValue,
    Filter,
    JsonObject,
    Operator,
)

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
_OPERATORS_EXPECTED = "'eq', 'ne', 'gt', 'gte', 'lt', 'lte', 'like' or 'not_like'"
_TAGS = ", ".join(f"'{f}'" for f in AGGREGATION_FUNCS)
UNITS = ("scalar", "token", "custom")


def strip_metadata_prefix(prop: str) -> str:
    return prop.removeprefix("metadata.")


def _model_type(value: Any, loc: Loc, errors: Errors, class_name: str) -> None:
    msg = f"Input should be a valid dictionary or instance of {class_name}"
    errors.add(loc, "model_type", msg, value, {"class_name": class_name})


def parse_filter(value: Any, loc: Loc, errors: Errors) -> Filter | None:
    if not isinstance(value, dict):
        _model_type(value, loc, errors, "Filter")
        return None
    own = Errors()
    conjunction = value.get("conjunction")
    if "conjunction" not in value:
        own.missing((*loc, "conjunction"), value)
    elif conjunction not in ("and", "or"):
        own.add(
            (*loc, "conjunction"),
            "enum",
            "Input should be 'and' or 'or'",
            conjunction,
            {"expected": "'and' or 'or'"},
        )
    clauses: list[Clause | Filter] = []
    if "clauses" not in value:
        own.missing((*loc, "clauses"), value)
    elif not isinstance(value["clauses"], list):
        own.add((*loc, "clauses"), "list_type", "Input should be a valid list", value["clauses"])
    else:
        for i, item in enumerate(value["clauses"]):
            parsed = _parse_clause_or_filter(item, (*loc, "clauses", i), own)
            if parsed is not None:
                clauses.append(parsed)
    if own:
        errors.items.extend(own.items)
        return None
    return Filter(cast("Any", conjunction), tuple(clauses))


def _parse_clause_or_filter(value: Any, loc: Loc, errors: Errors) -> Clause | Filter | None:
    # pydantic's smart union: the first member that validates wins; if none does, the errors of
    # every member are reported, each under the member's class name.
    as_clause, as_filter = Errors(), Errors()
    clause = parse_clause(value, (*loc, "FilterClause"), as_clause)
    if clause is not None:
        return clause
    nested = parse_filter(value, (*loc, "Filter"), as_filter)
    if nested is not None:
        return nested
    errors.items.extend(as_clause.items + as_filter.items)
    return None


def parse_clause(value: Any, loc: Loc, errors: Errors) -> Clause | None:
    if not isinstance(value, dict):
        _model_type(value, loc, errors, "FilterClause")
        return None
    count = len(errors)
    prop = value.get("property")
    if "property" not in value:
        errors.missing((*loc, "property"), value)
    else:
        check_str(prop, (*loc, "property"), errors)
    operator = value.get("operator")
    if "operator" not in value:
        errors.missing((*loc, "operator"), value)
    elif operator not in OPERATORS:
        errors.add(
            (*loc, "operator"),
            "enum",
            f"Input should be {_OPERATORS_EXPECTED}",
            operator,
            {"expected": _OPERATORS_EXPECTED},
        )
    clause_value: ClauseValue | None = None
    if "value" not in value:
        errors.missing((*loc, "value"), value)
    else:
        clause_value = _clause_value(value["value"], (*loc, "value"), errors)
    if len(errors) > count or clause_value is None:
        return None
    return Clause(
        strip_metadata_prefix(cast("str", prop)), cast("Operator", operator), clause_value
    )


def _clause_value(value: Any, loc: Loc, errors: Errors) -> ClauseValue | None:
    """`Annotated[str, MaxLen(1000)] | Int32 | bool` in pydantic's smart mode."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and len(value) <= 1000:
        return value
    as_int: int | None = None
    if isinstance(value, int):
        as_int = value
    elif isinstance(value, float) and math.isfinite(value) and value == int(value):
        as_int = int(value)  # lax mode: 3.0 -> 3
    if as_int is not None and INT32_MIN <= as_int <= INT32_MAX:
        return as_int
    # No member accepts it: one error per member.
    check_str(value, loc, errors, max_length=1000, tag="constrained-str")
    int_loc = (*loc, "constrained-int")
    if as_int is not None and as_int > INT32_MAX:
        msg = f"Input should be less than or equal to {INT32_MAX}"
        errors.add(int_loc, "less_than_equal", msg, value, {"le": INT32_MAX})
    elif as_int is not None:
        msg = f"Input should be greater than or equal to {INT32_MIN}"
        errors.add(int_loc, "greater_than_equal", msg, value, {"ge": INT32_MIN})
    else:
        check_int(value, int_loc, errors)
    type_, msg = bool_error(value)
    errors.add((*loc, "bool"), type_, msg, value)
    return None


def parse_aggregation(value: Any, loc: Loc, errors: Errors) -> Aggregation | None:
    if not isinstance(value, dict):
        errors.not_an_object(loc, value)
        return None
    if "func" not in value:
        msg = "Unable to extract tag using discriminator 'func'"
        errors.add(loc, "union_tag_not_found", msg, value, {"discriminator": "'func'"})
        return None
    func = value["func"]
    if func not in AGGREGATION_FUNCS:
        tag = str(func)
        msg = (
            f"Input tag '{tag}' found using 'func' does not match any of the expected tags: {_TAGS}"
        )
        ctx = {"discriminator": "'func'", "tag": tag, "expected_tags": _TAGS}
        errors.add(loc, "union_tag_invalid", msg, value, ctx)
        return None
    func = cast("AggregationFunc", func)
    if func == "count":
        return Aggregation("count")  # extra keys are ignored, as pydantic does
    prop = value.get("property")
    if "property" not in value:
        errors.missing((*loc, func, "property"), value)
        return None
    if not check_str(prop, (*loc, func, "property"), errors):
        return None
    return Aggregation(func, strip_metadata_prefix(prop))


def parse_meter_metadata(value: Any, loc: Loc, errors: Errors) -> JsonObject | None:
    """`MetadataField`: keys 1..40 characters, values str 1..500 | int | float | bool, <= 50."""
    if not isinstance(value, dict):
        errors.add(loc, "dict_type", "Input should be a valid dictionary", value)
        return None
    count = len(errors)
    for key, item in value.items():
        check_str(key, (*loc, key, "[key]"), errors, min_length=1, max_length=40)
        check_metadata_value(item, (*loc, key), errors)
    if len(errors) == count and len(value) > 50:
        msg = f"Dictionary should have at most 50 items after validation, not {len(value)}"
        ctx = {"field_type": "Dictionary", "max_length": 50, "actual_length": len(value)}
        errors.add(loc, "too_long", msg, value, ctx)
    if len(errors) == count:
        check_nul(value, loc, errors)
    return dict(value) if len(errors) == count else None


def parse_meter_create(body: Any, errors: Errors) -> JsonObject | None:
    """`MeterCreate`; returns the normalised fields, or None after adding errors."""
    loc: Loc = ("body",)
    if not isinstance(body, dict):
        errors.not_an_object(loc, body)
        return None
    count = len(errors)
    name = body.get("name")
    if "name" not in body:
        errors.missing((*loc, "name"), body)
    elif check_str(name, (*loc, "name"), errors, min_length=3) and has_nul(name):
        errors.add((*loc, "name"), "value_error", NUL_MSG, name, {"error": "invalid characters"})
    unit = body.get("unit", "scalar")
    if unit not in UNITS:
        expected = "'scalar', 'token' or 'custom'"
        errors.add(
            (*loc, "unit"), "enum", f"Input should be {expected}", unit, {"expected": expected}
        )
    label = body.get("custom_label")
    if label is not None:
        check_str(label, (*loc, "custom_label"), errors)
    multiplier = body.get("custom_multiplier")
    if multiplier is not None:
        multiplier = check_int(multiplier, (*loc, "custom_multiplier"), errors)
        if multiplier is not None and multiplier <= 0:
            errors.add(
                (*loc, "custom_multiplier"),
                "greater_than",
                "Input should be greater than 0",
                body.get("custom_multiplier"),
                {"gt": 0},
            )
    filter_ = None
    if "filter" not in body:
        errors.missing((*loc, "filter"), body)
    else:
        filter_ = parse_filter(body["filter"], (*loc, "filter"), errors)
    aggregation = None
    if "aggregation" not in body:
        errors.missing((*loc, "aggregation"), body)
    else:
        aggregation = parse_aggregation(body["aggregation"], (*loc, "aggregation"), errors)
    metadata = parse_meter_metadata(body.get("metadata", {}), (*loc, "metadata"), errors)
    if body.get("organization_id") is not None:
        errors.add(
            (*loc, "organization_id"),
            "organization_token",
            "Setting organization_id is disallowed when using an organization token.",
            body["organization_id"],
        )
    if len(errors) > count:
        return None
    # MeterCreate's model validator runs only once every field is valid.
    if unit == "custom" and label is None:
        error = "custom_label is required when unit is 'custom'."
        errors.add(loc, "value_error", f"Value error, {error}", body, {"error": error})
        return None
    if unit != "custom" and label is not None:
        error = "custom_label and custom_multiplier are only allowed when unit is 'custom'."
        errors.add(loc, "value_error", f"Value error, {error}", body, {"error": error})
        return None
    return {
        "name": name,
        "unit": unit,
        "custom_label": label,
        "custom_multiplier": multiplier,
        "filter": filter_,
        "aggregation": aggregation,
        "metadata": metadata or {},
    }
