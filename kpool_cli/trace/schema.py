"""The JSON Schema (draft 2020-12) of the trace format (TRACE_FORMAT.md: "Publish a
JSON Schema for each": `kpool schema trace`), generated from its declaration in
`trace.format`; and the few JSON Schema builders the report's schema
(`report.format`) shares.

Owns: `trace_schema`, `DIALECT`, `json_int`, `json_object`, `json_array`, `json_ref`.

Invariants:
- every property, its type, bounds, default (where it has one) and description come
  from `trace.format`; what is written here is how each declared type is spelled
  in JSON Schema (the `$defs`) and the decode's three forms as a `oneOf`;
- the schema describes the YAML *as parsed to JSON* (`yaml.safe_load`), and is
  strict like the loader (`additionalProperties: false` everywhere): every trace
  `load_trace` accepts validates. It is weaker than the loader where JSON Schema
  cannot follow: bounds that depend on the cache (seq ids below `n_seq_max`,
  `kpool <= kv_size`, cells below `kv_size`, ubatch sizes), `ext` needing
  `by_order`, the decode-wide cell rules, slots written before they are read,
  `expect` placement; and JSON Schema counts `1.0` as an integer;
- it is a fresh dict on every call (callers may mutate it).
"""

from __future__ import annotations

from typing import Any

from kpool_cli.trace.format import (
    CACHE,
    CELL,
    DECODE_FORMS,
    EXT,
    FINDING_CODE_PATTERN,
    FORMAT_VERSION,
    NO_DEFAULT,
    OP_STATUSES,
    OPS,
    POOL,
    POS,
    POSITIONS,
    SEQ,
    SEQ_OR_ALL,
    SEQ_SET,
    SLOT,
    TOKEN,
    TOP,
    Field,
    Section,
    Type,
)

__all__ = ["DIALECT", "json_array", "json_int", "json_object", "json_ref", "trace_schema"]

DIALECT = "https://json-schema.org/draft/2020-12/schema"
# plain decimal ends, as the loader reads them (no leading zeros)
POS_RANGE_PATTERN = r"^\s*(0|[1-9][0-9]*)\s*\.\.\s*(0|[1-9][0-9]*)\s*$"


def json_int(lo: int | None = None, hi: int | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "integer", **extra}
    if lo is not None:
        out["minimum"] = lo
    if hi is not None:
        out["maximum"] = hi
    return out


def json_object(
    props: dict[str, Any], required: list[str] | tuple[str, ...] = (), *, closed: bool,
    **extra: Any,
) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props, **extra}
    if required:
        out["required"] = list(required)
    out["additionalProperties"] = not closed
    return out


def json_ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/$defs/{name}"}


def json_array(items: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "array", "items": items, **extra}


# --- trace -------------------------------------------------------------------------

# the declared types that have a definition of their own, by the definition's name
_DEFS = {"seq": SEQ, "seqOrAll": SEQ_OR_ALL, "seqSet": SEQ_SET, "pos": POS,
         "positions": POSITIONS, "ext": EXT, "cell": CELL, "slot": SLOT}
_REF = {t.name: name for name, t in _DEFS.items()}


def _type(t: Type, lo: int | None, hi: int | None) -> dict[str, Any]:
    """How a value of type `t` (bounds narrowed to lo/hi for an int) is spelled."""
    if t.name in _REF:
        return json_ref(_REF[t.name])
    match t.name:
        case "int" | "bound":
            return json_int(lo, hi)
        case "bool":
            return {"type": "boolean"}
        case "str" | "engine":
            return {"type": "string", "minLength": 1} if t.nonempty else {"type": "string"}
        case "version":
            return {"const": FORMAT_VERSION}
        case "findings":
            return json_array({"type": "string", "pattern": FINDING_CODE_PATTERN},
                              uniqueItems=True)
        case "pools":
            return json_array(json_ref("pool"), uniqueItems=True)
        case "status":
            return {"enum": list(OP_STATUSES)}
        case "tokens":
            return json_array(json_ref("token"), minItems=1)
        case "ubatches":
            return json_array(json_array(json_ref("token"), minItems=t.lo, maxItems=t.hi),
                              minItems=1)
        case "section":
            return _section(CACHE)
        case "ops":
            return json_array({"oneOf": [_op(op) for op in OPS.values()]})
    raise AssertionError(f"no JSON Schema for the declared type {t.name!r}")


def _field(f: Field) -> dict[str, Any]:
    out = {**_type(f.type, f.lo, f.hi), "description": f.doc}
    if f.default is not NO_DEFAULT and f.default is not None:
        out["default"] = f.default
    return out


def _section(s: Section, **extra: Any) -> dict[str, Any]:
    return json_object({f.name: _field(f) for f in s.fields}, s.required, closed=True,
                       **extra)


def _op(s: Section) -> dict[str, Any]:
    if s.name == "decode":
        body: dict[str, Any] = json_ref("decode")
    elif s.body == "empty":
        body = {"type": ["object", "null"], "maxProperties": 0}
    elif s.body == "text":
        body = {"type": "string"}
    else:
        body = _section(s)
    return json_object({s.name: body}, [s.name], closed=True, description=s.doc)


def _defs() -> dict[str, Any]:
    def int_def(t: Type) -> dict[str, Any]:
        return json_int(t.lo, t.hi, description=t.doc)

    return {
        "seq": int_def(SEQ),
        "seqOrAll": int_def(SEQ_OR_ALL),
        "seqSet": {
            "description": SEQ_SET.doc,
            "oneOf": [json_ref("seq"), json_array(json_ref("seq"), minItems=1, uniqueItems=True)],
        },
        "pos": int_def(POS),
        "positions": {
            "description": POSITIONS.doc,
            "oneOf": [
                json_ref("pos"),
                {"type": "string", "pattern": POS_RANGE_PATTERN},
                json_array(json_ref("pos"), minItems=1),
            ],
        },
        "ext": json_array(json_ref("pos"), minItems=2, maxItems=2, description=EXT.doc),
        "cell": int_def(CELL),
        "token": _section(TOKEN),
        "decode": {
            "description": OPS["decode"].doc,
            "oneOf": [_section(form, description=form.doc) for form in DECODE_FORMS],
        },
        "pool": {
            "description": POOL.doc,
            "oneOf": [
                json_array(json_int(), prefixItems=[_type(f.type, f.lo, f.hi)
                                                    for f in POOL.fields],
                           minItems=len(POOL.fields), maxItems=len(POOL.fields)),
                _section(POOL),
            ],
        },
        "slot": {"type": "string", "minLength": 1} if SLOT.nonempty else {"type": "string"},
    }


def trace_schema() -> dict[str, Any]:
    """The trace file (TRACE_FORMAT.md "Trace"), as `yaml.safe_load` parses it."""
    return {
        "$schema": DIALECT,
        "title": f"kpool trace, format v{FORMAT_VERSION}",
        "description": "A trace of the k-pool indexer cache (docs/FORMATS.md). The YAML is"
                       " read as JSON; kpool's loader checks more than this schema can.",
        **_section(TOP),
        "$defs": _defs(),
    }
