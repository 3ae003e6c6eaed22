"""JSON Schemas (draft 2020-12) of the two public formats (TRACE_FORMAT.md: "Publish a
JSON Schema for each": `kpool schema trace`, `kpool schema report`).

Owns: `trace_schema`, `report_schema`.

Invariants:
- the trace schema describes the YAML *as parsed to JSON* (`yaml.safe_load`), and is
  strict like the loader (`additionalProperties: false` everywhere): every trace
  `load_trace` accepts validates. It is weaker than the loader where JSON Schema
  cannot follow: bounds that depend on the cache (seq ids below `n_seq_max`,
  `kpool <= kv_size`, cells below `kv_size`, ubatch sizes), `ext` needing
  `by_order`, the decode-wide cell rules, slots written before they are read,
  `expect` placement; and JSON Schema counts `1.0` as an integer;
- the report schema is open (`additionalProperties: true`: fields may be added,
  TRACE_FORMAT.md) but every field of format v1 is required with its type;
- both are fresh dicts on every call (callers may mutate them).
"""

from __future__ import annotations

from typing import Any

from kpool_cli.trace.load import (
    KV_SIZE_MAX,
    N_EMBD_MAX,
    N_RS_SEQ_MAX,
    N_SEQ_MAX_MAX,
    N_UBATCH_MAX,
    POS_LIMIT,
)
from kpool_cli.trace.model import FORMAT_VERSION, OP_STATUSES

__all__ = ["report_schema", "trace_schema"]

DIALECT = "https://json-schema.org/draft/2020-12/schema"
INT32_MAX = 2**31 - 1
FINDING_CODE_PATTERN = "^KP[0-9]{3}$"
# plain decimal ends, as the loader reads them (no leading zeros)
POS_RANGE_PATTERN = r"^\s*(0|[1-9][0-9]*)\s*\.\.\s*(0|[1-9][0-9]*)\s*$"


def _int(lo: int | None = None, hi: int | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "integer", **extra}
    if lo is not None:
        out["minimum"] = lo
    if hi is not None:
        out["maximum"] = hi
    return out


def _obj(
    props: dict[str, Any], required: list[str] | tuple[str, ...] = (), *, closed: bool,
    **extra: Any,
) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props, **extra}
    if required:
        out["required"] = list(required)
    out["additionalProperties"] = not closed
    return out


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/$defs/{name}"}


def _array(items: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "array", "items": items, **extra}


# --- trace -------------------------------------------------------------------------


def trace_schema() -> dict[str, Any]:
    """The trace file (TRACE_FORMAT.md "Trace"), as `yaml.safe_load` parses it."""
    bound = _int(-1, INT32_MAX, description="a position, or -1 for no bound (the default)")

    def op(name: str, body: dict[str, Any], description: str) -> dict[str, Any]:
        return _obj({name: body}, [name], closed=True, description=description)

    def seq_op(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
        return _obj(props, required, closed=True)

    defs: dict[str, Any] = {
        "seq": _int(0, N_SEQ_MAX_MAX - 1, description="a seq id, below cache.n_seq_max"),
        "seqOrAll": _int(-1, N_SEQ_MAX_MAX - 1, description="a seq id, or -1: every sequence"),
        "seqSet": {
            "description": "a token's sequences: one seq id or a list of distinct ones"
                           " (the first is the one the token reads through)",
            "oneOf": [
                _ref("seq"),
                _array(_ref("seq"), minItems=1, uniqueItems=True),
            ],
        },
        "pos": _int(0, POS_LIMIT - 1, description="a position"),
        "positions": {
            "description": "a position, a half-open range 'A..B' (A < B), or a list",
            "oneOf": [
                _ref("pos"),
                {"type": "string", "pattern": POS_RANGE_PATTERN},
                _array(_ref("pos"), minItems=1),
            ],
        },
        "ext": _array(_ref("pos"), minItems=2, maxItems=2,
                      description="M-RoPE [x, y]; only with cache.by_order: true"),
        "cell": _int(0, KV_SIZE_MAX - 1,
                     description="a recorded placement: stream-local cell, below kv_size;"
                                 " every token of the decode has one, or none"),
        "token": _obj(
            {"pos": _ref("pos"), "seq": _ref("seqSet"), "ext": _ref("ext"),
             "cell": _ref("cell")},
            ["pos", "seq"], closed=True,
        ),
        "decode": {
            "description": "one llama_batch, in one of three forms",
            "oneOf": [
                _obj(
                    {"seq": _ref("seqSet"), "pos": _ref("positions"), "ext": _ref("ext"),
                     "cell": _ref("cell")},
                    ["seq", "pos"], closed=True,
                    description="shorthand: one token per position, all with the same"
                                " sequences (cell: only for a single position)",
                ),
                _obj({"tokens": _array(_ref("token"), minItems=1)}, ["tokens"], closed=True),
                _obj(
                    {"ubatches": _array(_array(_ref("token"), minItems=1,
                                               maxItems=N_UBATCH_MAX), minItems=1)},
                    ["ubatches"], closed=True,
                    description="a fixed split into ubatches",
                ),
            ],
        },
        "pool": {
            "oneOf": [
                _array(_int(), prefixItems=[_ref("seq"), _int(0, KV_SIZE_MAX)],
                       minItems=2, maxItems=2),
                _obj({"seq": _ref("seq"), "k": _int(0, KV_SIZE_MAX)}, ["seq", "k"],
                     closed=True),
            ],
        },
        "slot": {"type": "string", "minLength": 1},
    }
    ops = [
        op("decode", _ref("decode"), "a decode"),
        op("seq_rm", seq_op({"seq": _ref("seqOrAll"), "p0": bound, "p1": bound}, ["seq"]),
           "remove positions [p0, p1) of seq (-1: every sequence)"),
        op("seq_cp", seq_op({"src": _ref("seq"), "dst": _ref("seq"), "p0": bound, "p1": bound},
                            ["src", "dst"]),
           "copy positions [p0, p1) of src to dst"),
        op("seq_keep", seq_op({"seq": _ref("seq")}, ["seq"]), "keep only seq"),
        op("seq_add", seq_op({"seq": _ref("seq"), "p0": bound, "p1": bound,
                              "shift": _int(-(2**31), INT32_MAX)}, ["seq", "shift"]),
           "shift positions [p0, p1) of seq"),
        op("seq_div", seq_op({"seq": _ref("seq"), "p0": bound, "p1": bound,
                              "d": _int(1, INT32_MAX)}, ["seq", "d"]),
           "divide positions [p0, p1) of seq"),
        op("state_write", seq_op({"seq": _ref("seq"), "slot": _ref("slot")}, ["seq", "slot"]),
           "save seq's state in slot"),
        op("state_read", seq_op({"seq": _ref("seq"), "slot": _ref("slot")}, ["seq", "slot"]),
           "restore a slot written earlier into seq"),
        op("state_drop", seq_op({"seq": _ref("seqOrAll")}, ["seq"]),
           "drop seq (-1: every sequence)"),
        op("clear", {"type": ["object", "null"], "maxProperties": 0}, "empty the cache"),
        op("note", {"type": "string"}, "free text shown in the report"),
        op("expect", _obj({
            "engine": {"type": "string", "minLength": 1},
            "findings": _array({"type": "string", "pattern": FINDING_CODE_PATTERN},
                               uniqueItems=True),
            "n_new": _int(0, INT32_MAX),
            "n_new_g": _int(0, INT32_MAX),
            "pools": _array(_ref("pool"), uniqueItems=True),
            "status": {"enum": list(OP_STATUSES)},
            "ubatch": _int(-1, INT32_MAX, description="ubatch index, -1 (default): the last"),
        }, closed=True), "assertions on the previous op (not the first op, notes do not count)"),
    ]
    cache = _obj({
        "kv_size": _int(1, KV_SIZE_MAX, description="cells per stream"),
        "kpool": _int(1, KV_SIZE_MAX, description="tokens per pool, at most kv_size"),
        "n_seq_max": _int(1, N_SEQ_MAX_MAX, default=1),
        "unified": {"type": "boolean", "default": True},
        "by_order": {"type": "boolean", "default": False},
        "n_ubatch": _int(1, N_UBATCH_MAX, default=512),
        "n_embd": _int(1, N_EMBD_MAX, default=16),
        "n_rs_seq": _int(0, N_RS_SEQ_MAX, default=0,
                         description="the recurrent child's rollback snapshots per sequence "
                                     "(0 without MTP; the draft depth with it, e.g. 3)"),
    }, ["kv_size", "kpool"], closed=True)
    return {
        "$schema": DIALECT,
        "title": f"kpool trace, format v{FORMAT_VERSION}",
        "description": "A trace of the k-pool indexer cache (TRACE_FORMAT.md). The YAML is"
                       " read as JSON; kpool's loader checks more than this schema can.",
        **_obj({
            "kpool_trace": {"const": FORMAT_VERSION},
            "name": {"type": "string"},
            "description": {"type": "string"},
            "cache": cache,
            "engine": {"type": "string", "minLength": 1},
            "seed": _int(0, 2**64 - 1),
            "ops": _array({"oneOf": ops}),
        }, ["kpool_trace", "cache", "ops"], closed=True),
        "$defs": defs,
    }


# --- report ------------------------------------------------------------------------


def report_schema() -> dict[str, Any]:
    """The JSON report of `kpool replay` (TRACE_FORMAT.md "Report"). Open: a reader
    must ignore fields it does not know."""

    def obj(props: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict:
        return _obj(props, list(props) if required is None else required, closed=False,
                    **extra)

    nat = _int(0)
    ints = _array(_int())
    pair = _array(nat, minItems=2, maxItems=2, description="a half-open range [a, b)")
    steps = _array(_int(), minItems=3, maxItems=3,
                   description="[c0, d, e]: first row, step between members, between entries")
    seq_map = {
        "type": "object",
        "propertyNames": {"pattern": "^(0|[1-9][0-9]*)$"},
        "additionalProperties": _int(),
        "description": "seq id (as a string) -> stale position",
    }
    defs: dict[str, Any] = {
        "finding": obj({
            "code": {"type": "string", "pattern": FINDING_CODE_PATTERN},
            "name": {"type": "string"},
            "severity": {"enum": ["error", "warning"]},
            "message": {"type": "string"},
            "rows": ints,
            "row_runs": _array(_array(_int(), minItems=3, maxItems=3), description=(
                "more rows, [first, end, step]: first, first + step, ... < end")),
            "seqs": ints,
            "tokens": _array(obj({
                "pos": _int(),
                "seq": {"oneOf": [_int(), ints]},
            })),
            "pools": _array(_array(_int(), minItems=2, maxItems=3, description=(
                "[seq, k], or [seq, k0, k1]: pools k0..k1-1 of seq"))),
        }, ["code", "name", "severity", "message", "rows", "seqs"]),
        "findings": _array(_ref("finding")),
    }
    event = obj({
        "op": nat,
        "kind": {"type": "string"},
        "status": {"enum": list(OP_STATUSES)},
        "stale": seq_map,
        "message": {"type": "string"},
        "findings": _ref("findings"),
    }, ["op", "kind", "status", "stale"])
    ubatch = obj({
        "index": nat,
        "op": nat,
        "batch_ubatch": nat,
        "tokens": _array(obj({
            "pos": _int(),
            "seq": ints,
            "cell": _int(0, description="global row"),
            "ext": _array(_int(), minItems=2, maxItems=2),
        }, ["pos", "seq", "cell"])),
        "stale_batch": seq_map,
        "n_pool_real": nat,
        "n_new": nat,
        "n_new_g": nat,
        "pools": _array({"oneOf": [obj({
            "seq": nat,
            "k": nat,
            "first_pos": _int(),
            "last_pos": _int(),
            "cells": ints,
            "rep": _int(0, description="global row"),
            "new": {"type": "boolean"},
        }), obj({
            "seq": nat,
            "k": pair,
            "first_pos": _int(),
            "cells": steps,
            "new": {"type": "boolean"},
        }, description="a run: pools k0..k1-1 of seq, pool k0 + i at first_pos + i*kpool, "
                       "member j on row c0 + i*e + j*d, its rep the last")]}),
        "scatter": _array({"oneOf": [obj({
            "rep": _int(0),
            "cells": ints,
            "pad": {"type": "boolean"},
        }), obj({
            "n": _int(2),
            "cells": steps,
            "pad": {"const": False},
        }, ["n", "cells", "pad"], **{"not": {"required": ["rep"]}},
           description="a run of n entries: entry i pools rows c0 + i*e + j*d (j < kpool) "
                       "into the last of them")]}),
        "cost": obj({
            "cells_scanned": nat,
            "pools_marked": nat,
            "rows_gathered": nat,
            "scatter_entries": nat,
            "gen_zeroed": nat,
            "reps_sorted": nat,
        }),
        "findings": _ref("findings"),
    })
    config = obj({
        "kv_size": _int(1),
        "kpool": _int(1),
        "n_seq_max": _int(1),
        "unified": {"type": "boolean"},
        "by_order": {"type": "boolean"},
        "n_ubatch": _int(1),
        "n_embd": _int(1),
        "n_rs_seq": _int(0),
    }, ["kv_size", "kpool", "n_seq_max", "unified", "by_order", "n_ubatch", "n_embd"])
    return {
        "$schema": DIALECT,
        "title": "kpool report, format v1",
        "description": "What `kpool replay` found (TRACE_FORMAT.md). Fields may be added"
                       " in later versions; none is renamed.",
        **obj({
            "kpool_report": {"const": 1},
            "tool": obj({"name": {"type": "string"}, "version": {"type": "string"}}),
            "trace": obj({
                "path": {"type": "string"},
                "name": {"type": "string"},
                "sha256": {"type": "string", "pattern": "^([0-9a-f]{64})?$"},
            }),
            "engine": {"type": "string"},
            "backend": {"type": ["string", "null"]},
            "config": config,
            "events": _array(event),
            "ubatches": _array(ubatch),
            "expectations": _array(obj({
                "op": nat,
                "ok": {"type": "boolean"},
                "message": {"type": "string"},
            })),
            # only when the trace turned out invalid mid-replay (status "invalid")
            "problems": _array(obj({
                "file": {"type": "string"},
                "line": nat,
                "column": nat,
                "field": {"type": "string"},
                "message": {"type": "string"},
            })),
            "summary": obj({
                "ubatches": nat,
                "findings": {
                    "type": "object",
                    "propertyNames": {"pattern": FINDING_CODE_PATTERN},
                    "additionalProperties": nat,
                },
                "pools_marked": nat,
                "status": {"enum": ["pass", "fail", "aborted", "invalid"]},
            }),
        }, ["kpool_report", "tool", "trace", "engine", "backend", "config", "events",
            "ubatches", "expectations", "summary"]),
        "$defs": defs,
    }
