"""The JSON report format v1, declared once (TRACE_FORMAT.md, "Report"; kpool's
additions in docs/FORMATS.md): each record of a report with its fields, each
field's JSON Schema and a line of doc; and `report_schema`, generated from them.

Owns: `Field`, `Record`, the records (`REPORT` and the records it holds: `TOOL`,
`TRACE`, `CONFIG`, `EVENT`, `UBATCH`, `TOKEN`, `POOL`, `POOL_RUN`, `SCATTER`,
`SCATTER_RUN`, `COST`, `FINDING`, `FINDING_TOKEN`, `EXPECTATION`, `PROBLEM`,
`SUMMARY`), `COST_KEYS`, `REPORT_VERSION` and `report_schema`; and the output of
`kpool check --output-format json` (`CHECK` and its records, `CHECK_VERSION`,
`check_schema`) and of `kpool diff --format json` (`DIFF` and its records,
`DIFF_VERSION`, the comparison's words `DIFF_UBATCH_FIELDS`, `DIFF_EVENT_FIELDS` and
`DIFF_VERDICTS`, `diff_schema`); the words a report's `summary.status` and `backend`
take (`REPORT_STATUSES`, `STOPPED_STATUSES`, `VALUE_BACKENDS`).

What derives from it:
- `report_schema()`, `kpool schema report`: every record an object of its fields,
  open (`additionalProperties: true`), its required fields required;
- the writer (`report.json_report`): the key names and their order, through
  `Record.make` (a name not declared is an error) or a record's `names`; its
  listing kernels' key texts (`_key_texts`, which holds a record's order to the
  one a kernel gathers values in) and each field's width, read in its schema
  (`_widths`: `type`, `maxItems`, `const`);
- the diff's reader (`diff.reports`): the cost counters it requires (`COST_KEYS`),
  the config fields it reads, with their bounds and which may be absent, the value
  backends it knows and the statuses it refuses;
- the diff's writer (`report.diff_view`) and comparison (`diff.compare`): the keys
  of its JSON, what `differs` names, the verdicts.

Invariants:
- names are the format's public contract: add, never rename; a field added after
  v1's first release is not required (a report written before it still validates
  and still reads);
- `CONFIG` is the trace's cache block (`trace.format.CACHE`): the same fields in
  the same order, with the lower bounds only (a report is read, not limited);
- `make` keeps the declared order, so the writer's output order is the
  declaration's.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from kpool_cli.contracts import exits
from kpool_cli.trace.format import CACHE, FINDING_CODE_PATTERN, OP_STATUSES
from kpool_cli.trace.schema import DIALECT, json_array, json_int, json_object, json_ref

__all__ = [
    "CHECK",
    "CHECK_DIFF",
    "CHECK_FINDING",
    "CHECK_RESULT",
    "CHECK_SHOWN",
    "CHECK_SUMMARY",
    "CHECK_UNMET",
    "CHECK_VERSION",
    "CONFIG",
    "COST",
    "COST_KEYS",
    "DIFF",
    "DIFF_BOTH",
    "DIFF_CHANGE",
    "DIFF_COMPARE",
    "DIFF_ENGINE",
    "DIFF_EVENT",
    "DIFF_EVENT_FIELDS",
    "DIFF_EVENT_SIDE",
    "DIFF_FINDING",
    "DIFF_OP_SIDE",
    "DIFF_OP_UBATCH",
    "DIFF_PARTED",
    "DIFF_REGRESSION",
    "DIFF_SUMMARY",
    "DIFF_TOKEN",
    "DIFF_TOTALS",
    "DIFF_TRACE",
    "DIFF_TRACE_ID",
    "DIFF_UBATCH",
    "DIFF_UBATCH_FIELDS",
    "DIFF_UBATCH_SIDE",
    "DIFF_VERDICTS",
    "DIFF_VERSION",
    "EVENT",
    "EXPECTATION",
    "FINDING",
    "FINDING_TOKEN",
    "POOL",
    "POOL_RUN",
    "PROBLEM",
    "REPORT",
    "REPORT_STATUSES",
    "REPORT_VERSION",
    "SCATTER",
    "SCATTER_RUN",
    "STOPPED_STATUSES",
    "SUMMARY",
    "TOKEN",
    "TOOL",
    "TRACE",
    "UBATCH",
    "VALUE_BACKENDS",
    "Field",
    "Record",
    "check_schema",
    "diff_schema",
    "report_schema",
]

REPORT_VERSION = 1
# summary.status of a report that is not a whole run: the trace turned out invalid, or
# a signal ended the replay (`kpool diff` refuses such a report)
STOPPED_STATUSES = ("invalid", "interrupted")
REPORT_STATUSES = ("pass", "fail", "aborted", *STOPPED_STATUSES)
# `backend` of a report that ran one (`backend.store.BACKENDS` adds "none": null here)
VALUE_BACKENDS = ("numba", "numpy")
SEVERITIES = ("error", "warning")


@dataclass(frozen=True)
class Field:
    """One key of a record: the JSON Schema of its value, a line of doc, and whether
    every report has it."""

    name: str
    schema: dict[str, Any]
    doc: str
    required: bool = True


@dataclass(frozen=True)
class Record:
    """An object of the report: its fields in the order kpool writes them."""

    name: str
    doc: str
    fields: tuple[Field, ...]
    _names: frozenset[str] = field(init=False, repr=False, compare=False)
    _order: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # the writer asks for the names of every entry it writes: told once
        object.__setattr__(self, "_order", tuple(f.name for f in self.fields))
        object.__setattr__(self, "_names", frozenset(self._order))
        assert len(self._names) == len(self.fields), self.name

    def __getitem__(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)

    @property
    def names(self) -> tuple[str, ...]:
        return self._order

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.required)

    def make(self, **values: Any) -> dict[str, Any]:
        """The record with the given fields, in the declared order. Fields may be left
        out (optional ones, or those a streaming writer adds later); a name the record
        does not declare raises ValueError."""
        if tuple(values) == self._order:  # every field, in order (a ubatch, its cost)
            return values
        extra = values.keys() - self._names
        if extra:
            raise ValueError(f"{self.name} declares no field {', '.join(sorted(extra))}")
        return {f.name: values[f.name] for f in self.fields if f.name in values}

    def schema(self, **extra: Any) -> dict[str, Any]:
        """The record as an open JSON Schema object (fields may be added)."""
        props = {f.name: {**f.schema, "description": f.doc} for f in self.fields}
        return json_object(props, self.required, closed=False, description=self.doc,
                           **extra)


def _f(name: str, schema: dict[str, Any], doc: str, required: bool = True) -> Field:
    return Field(name, schema, doc, required)


_NAT = json_int(0)
_INTS = json_array(json_int())
_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_PAIR = json_array(_NAT, minItems=2, maxItems=2, description="a half-open range [a, b)")
_STEPS = json_array(json_int(), minItems=3, maxItems=3,
                    description="[c0, d, e]: first row, step between members, between entries")
_SEQ_MAP = {
    "type": "object",
    "propertyNames": {"pattern": "^(0|[1-9][0-9]*)$"},
    "additionalProperties": json_int(),
    "description": "seq id (as a string) -> stale position",
}

# --- records ------------------------------------------------------------------------

TOOL = Record("tool", "the program that wrote the report", (
    _f("name", _STR, "kpool"),
    _f("version", _STR, "its version"),
))

TRACE = Record("trace", "the trace replayed", (
    _f("path", _STR, "as given on the command line; <stdin> for -"),
    _f("name", _STR, "the trace's name, empty if it has none"),
    _f("sha256", {"type": "string", "pattern": "^([0-9a-f]{64})?$"},
       "of the trace file's bytes"),
))

# the cache fields added after v1's first release: a report may lack them
_CONFIG_ADDED = frozenset({"n_rs_seq", "n_batch"})
CONFIG = Record("config", "the cache config of the replay (the trace's cache block,"
                " defaults filled in)", tuple(
    _f(f.name, _BOOL if f.type.name == "bool" else json_int(f.lo), f.doc,
       f.name not in _CONFIG_ADDED)
    for f in CACHE.fields
))

FINDING_TOKEN = Record("finding token", "a token involved", (
    _f("pos", json_int(), "its position"),
    _f("seq", {"oneOf": [json_int(), _INTS]}, "its sequence, or sequences"),
))

FINDING = Record("finding", "something the engine did wrong (`kpool explain CODE`)", (
    _f("code", {"type": "string", "pattern": FINDING_CODE_PATTERN}, "KP001, KP002, ..."),
    _f("name", _STR, "the code's name"),
    _f("severity", {"enum": list(SEVERITIES)}, "error or warning"),
    _f("message", _STR, "what happened, in a line"),
    _f("rows", _INTS, "the global rows involved (those not in row_runs)"),
    _f("seqs", _INTS, "the sequences involved"),
    _f("row_runs", json_array(json_array(json_int(), minItems=3, maxItems=3)),
       "more rows, [first, end, step]: first, first + step, ... < end", required=False),
    _f("tokens", json_array(FINDING_TOKEN.schema()), "the tokens involved {pos, seq}",
       required=False),
    _f("pools", json_array(json_array(json_int(), minItems=2, maxItems=3)),
       "the pools involved: [seq, k], or [seq, k0, k1]: pools k0..k1-1 of seq",
       required=False),
    _f("evidence", {"type": "object"},
       "code-specific data (KP001: entries per row, and with a value backend whether the"
       " racing values are equal; KP007: the first differing pair)", required=False),
))

EVENT = Record("event", "a non-decode op, or a rejected decode", (
    _f("op", _NAT, "the op's index in the trace's ops"),
    _f("kind", _STR, "the op's name; notes appear as events of kind note"),
    _f("status", {"enum": list(OP_STATUSES)}, "what the op did"),
    _f("stale", _SEQ_MAP, "the stale positions it set"),
    _f("message", _STR, "why it was rejected or aborted; a note's text", required=False),
    _f("findings", json_ref("findings"), "its KP005 / KP006 / KP008", required=False),
))

TOKEN = Record("token", "a token of the ubatch", (
    _f("pos", json_int(), "its position"),
    _f("seq", _INTS, "its sequences"),
    _f("cell", json_int(0, description="global row"), "its row"),
    _f("ext", json_array(json_int(), minItems=2, maxItems=2), "M-RoPE [x, y]: M-RoPE"
       " traces only", required=False),
))

POOL = Record("pool", "a pool of the layout", (
    _f("seq", _NAT, "its sequence"),
    _f("k", _NAT, "its index in the sequence"),
    _f("first_pos", json_int(), "the position of its first member"),
    _f("last_pos", json_int(), "the position of its last member"),
    _f("cells", _INTS, "its members' rows"),
    _f("rep", json_int(0, description="global row"), "its rep's row"),
    _f("new", _BOOL, "marked new in this ubatch"),
))

POOL_RUN = Record("pool run", "a run: pools k0..k1-1 of seq, pool k0 + i at first_pos +"
                  " i*kpool, member j on row c0 + i*e + j*d, its rep the last", (
    _f("seq", _NAT, "their sequence"),
    _f("k", _PAIR, "[k0, k1]: pools k0..k1-1"),
    _f("first_pos", json_int(), "the position of pool k0's first member"),
    _f("cells", _STEPS, "[c0, d, e]: member j of pool k0 + i on row c0 + i*e + j*d"),
    _f("new", _BOOL, "marked new in this ubatch"),
))

SCATTER = Record("scatter entry", "an entry of the scatter plan", (
    _f("rep", json_int(0), "the row it writes"),
    _f("cells", _INTS, "the rows it pools"),
    _f("pad", _BOOL, "a padding entry"),
))

SCATTER_RUN = Record("scatter run", "a run of n entries: entry i pools rows c0 + i*e +"
                     " j*d (j < kpool) into the last of them", (
    _f("n", json_int(2), "how many entries"),
    _f("cells", _STEPS, "[c0, d, e]"),
    _f("pad", {"const": False}, "runs are of real entries only"),
))

COST = Record("cost", "the counters of ENGINE.md §8", (
    _f("cells_scanned", _NAT, "(pos, cell) pairs the layout update copies, plus the"
       " cells cache-safe's sharing scan reads"),
    _f("pools_marked", _NAT, "pools marked new"),
    _f("rows_gathered", _NAT, "rows the gather reads"),
    _f("scatter_entries", _NAT, "entries of the scatter plan"),
    _f("gen_zeroed", _NAT, "generation-array entries zero-filled"),
    _f("reps_sorted", _NAT, "rep rows sorted to pick padding rows"),
))
COST_KEYS = COST.names

UBATCH = Record("ubatch", "one ubatch of a decode", (
    _f("index", _NAT, "its index over the replay"),
    _f("op", _NAT, "the index of its decode in the trace's ops"),
    _f("batch_ubatch", _NAT, "its index in its decode"),
    _f("tokens", json_array(TOKEN.schema()), "its tokens"),
    _f("stale_batch", _SEQ_MAP, "the stale positions the ubatch starts from"),
    _f("n_pool_real", _NAT, "pools of the layout"),
    _f("n_new", _NAT, "pools marked new"),
    _f("n_new_g", _NAT, "scatter entries, padding included"),
    _f("pools", json_array({"oneOf": [POOL.schema(), POOL_RUN.schema()]}),
       "the pools marked new (--pools all: every pool), runs folded"),
    _f("scatter", json_array({"oneOf": [SCATTER.schema(), SCATTER_RUN.schema(
        **{"not": {"required": ["rep"]}})]}), "every entry of the scatter plan, runs folded"),
    _f("cost", COST.schema(), "what the ubatch cost the real engine"),
    _f("findings", json_ref("findings"), "its findings"),
))

EXPECTATION = Record("expectation", "an expect op that applied to this engine", (
    _f("op", _NAT, "the expect op's index in the trace's ops"),
    _f("ok", _BOOL, "whether it held"),
    _f("message", _STR, "what was expected and what happened"),
))

PROBLEM = Record("problem", "why the trace turned out invalid mid-replay", (
    _f("file", _STR, "the trace file"),
    _f("line", _NAT, "1-based; 0: no position"),
    _f("column", _NAT, "1-based; 0: no position"),
    _f("field", _STR, "the dotted path of the field"),
    _f("message", _STR, "what is wrong"),
))

SUMMARY = Record("summary", "totals over the replay", (
    _f("ubatches", _NAT, "ubatches replayed"),
    _f("tokens", _NAT, "tokens decoded", required=False),
    _f("findings", {"type": "object", "propertyNames": {"pattern": FINDING_CODE_PATTERN},
                    "additionalProperties": _NAT}, "findings per code"),
    _f("pools_marked", _NAT, "pools marked new"),
    _f("pools_per_token", {"type": "number"}, "pools_marked / tokens", required=False),
    _f("expectations", json_object({"passed": _NAT, "failed": _NAT}, ("passed", "failed"),
                                    closed=False),
       "expect ops that passed and failed", required=False),
    _f("cost", {"type": "object", "additionalProperties": _NAT}, "the cost counters, summed",
       required=False),
    _f("status", {"enum": list(REPORT_STATUSES)}, "pass, fail (findings at or above"
       " --fail-on, or a failed expectation under --check), aborted (KP005 stopped the"
       " replay), invalid (the trace turned out invalid mid-replay) or interrupted (a"
       " signal ended the run: the report holds what was replayed before it)"),
))

REPORT = Record("report", "What `kpool replay` found (docs/FORMATS.md). Fields may be"
                " added in later versions; none is renamed.", (
    _f("kpool_report", {"const": REPORT_VERSION}, "the format version"),
    _f("tool", TOOL.schema(), TOOL.doc),
    _f("trace", TRACE.schema(), TRACE.doc),
    _f("engine", _STR, "the engine version replayed"),
    _f("backend", {"type": ["string", "null"]},
       f"the value backend ({', '.join(VALUE_BACKENDS)}), or null for a model-only replay"),
    _f("config", CONFIG.schema(), CONFIG.doc),
    _f("ubatches", json_array(UBATCH.schema()), "every ubatch, in order"),
    _f("events", json_array(EVENT.schema()), "every non-decode op and every rejected"
       " decode, with its status and the stale positions it set"),
    _f("expectations", json_array(EXPECTATION.schema()),
       "one per expect op that applied to this engine"),
    _f("problems", json_array(PROBLEM.schema()), "only when the trace turned out invalid"
       " mid-replay (summary.status invalid)", required=False),
    _f("summary", SUMMARY.schema(), SUMMARY.doc),
))


def report_schema() -> dict[str, Any]:
    """The JSON output of `kpool replay` (TRACE_FORMAT.md "Report"): one report
    (`$defs/report`), or, for several traces, an array of two or more. Open: a reader
    must ignore fields it does not know. A fresh dict on every call."""
    return copy.deepcopy({
        "$schema": DIALECT,
        "title": f"kpool report, format v{REPORT_VERSION}",
        "oneOf": [json_ref("report"), json_array(json_ref("report"), minItems=2)],
        "$defs": {
            "report": REPORT.schema(),
            "finding": FINDING.schema(),
            "findings": json_array(json_ref("finding")),
        },
    })


# --- kpool check (one document per command: every trace under every engine) ----------

CHECK_VERSION = 1
CHECK_STATUSES = ("pass", "fail", "invalid")

CHECK_DIFF = Record("difference", "one thing an expect asked that did not hold", (
    _f("what", _STR, "status, findings, n_new, n_new_g, marked pools, ubatch, ..."),
    _f("expected", _STR, "what the expect says"),
    _f("actual", _STR, "what the replay did"),
))

CHECK_UNMET = Record("unmet expectation", "an expect op that did not hold", (
    _f("op", _NAT, "the expect op's index in the trace's ops"),
    _f("line", _NAT, "the expect op's line in the trace (1-based; 0: unknown)"),
    _f("target", json_int(-1), "the index of the op it checked (-1: none ran before it)"),
    _f("target_line", _NAT, "that op's line (0: none)"),
    _f("diffs", json_array(CHECK_DIFF.schema()), "what differs, expected beside actual"),
    _f("message", _STR, "the same in a line"),
))

CHECK_FINDING = Record("check finding", "a finding no expect of the trace pins", (
    _f("code", {"type": "string", "pattern": FINDING_CODE_PATTERN}, "KP001, KP002, ..."),
    _f("name", _STR, "the code's name"),
    _f("severity", {"enum": list(SEVERITIES)}, "error or warning"),
    _f("op", _NAT, "the index of the op that raised it"),
    _f("line", _NAT, "that op's line in the trace (1-based; 0: unknown)"),
    _f("ubatch", {"oneOf": [_NAT, {"type": "null"}]},
       "the ubatch's index over the replay; null for an op's event"),
    _f("message", _STR, "what happened, in a line"),
    _f("fails", _BOOL, "at or above --fail-on: it fails the check"),
))

_COUNTS = {"type": "object", "propertyNames": {"pattern": FINDING_CODE_PATTERN},
           "additionalProperties": _NAT}

CHECK_RESULT = Record("check result", "one trace under one engine", (
    _f("path", _STR, "the trace file"),
    _f("engine", _STR, "the engine version's name, as a report's `engine` (the spec "
       "given when no version loaded from it); empty when the trace did not load"),
    _f("status", {"enum": list(CHECK_STATUSES)}, "pass, fail (an expect did not hold, or"
       " an unpinned finding at or above --fail-on) or invalid (the trace cannot be"
       " checked: problems says why)"),
    _f("unmet", json_array(CHECK_UNMET.schema()), "the expectations that did not hold"),
    _f("findings", json_array(CHECK_FINDING.schema()),
       "unpinned, unignored findings (failing ones first, at most 50)"),
    _f("more_findings", _NAT, "unpinned findings left out of findings"),
    _f("problems", json_array(PROBLEM.schema()), "why the trace is invalid"),
    _f("expectations", json_object({"passed": _NAT, "failed": _NAT}, ("passed", "failed"),
                                    closed=False), "expect ops that held and did not"),
    _f("ubatches", _NAT, "ubatches replayed"),
    _f("counts", json_object({"all": _COUNTS, "pinned": _COUNTS, "ignored": _COUNTS},
                             ("all", "pinned", "ignored"), closed=False),
       "findings per code: every one, those an expect pins, those of ignored codes"),
))

CHECK_SUMMARY = Record("check summary", "totals over the command", (
    _f("traces", _NAT, "trace files checked"),
    _f("runs", _NAT, "(trace, engine) results"),
    _f("passed", _NAT, "results that passed"),
    _f("failed", _NAT, "results that failed"),
    _f("invalid", _NAT, "results of invalid traces"),
    _f("exit_code", {"enum": [exits.PASS, exits.FINDINGS, exits.BAD_INPUT]},
       "the command's exit status"),
))

CHECK_SHOWN = Record("shown by", "a finding code on a trace checked under more than one "
                     "engine, and the versions that show it", (
    _f("path", _STR, "the trace file"),
    _f("code", {"type": "string", "pattern": FINDING_CODE_PATTERN}, "KP001, KP002, ..."),
    _f("by", json_array(json_object({"engine": _STR, "count": _NAT, "first_op": _NAT},
                                    ("engine", "count", "first_op"), closed=True)),
       "each version that shows it: how often (pinned and ignored ones included), and "
       "the op of the first"),
    _f("not_by", json_array(_STR), "the versions that replayed the trace and do not"),
))

CHECK = Record("check", "What `kpool check` found. Fields may be added in later versions;"
               " none is renamed.", (
    _f("kpool_check", {"const": CHECK_VERSION}, "the format version"),
    _f("tool", TOOL.schema(), TOOL.doc),
    _f("fail_on", {"enum": ["error", "warning", "never"]}, "the failing severity"),
    _f("results", json_array(CHECK_RESULT.schema()), "one per trace and engine, in order"),
    _f("versions", json_array(CHECK_SHOWN.schema()),
       "per trace checked under more than one engine, which versions show each code "
       "not ignored for it"),
    _f("summary", CHECK_SUMMARY.schema(), CHECK_SUMMARY.doc),
))


def check_schema() -> dict[str, Any]:
    """The JSON output of `kpool check --output-format json`. A fresh dict on every
    call."""
    return copy.deepcopy({
        "$schema": DIALECT,
        "title": f"kpool check, format v{CHECK_VERSION}",
        **CHECK.schema(),
    })


# --- kpool diff --format json (one document per command: every trace, base vs head) ---

DIFF_VERSION = 1
# what the comparison means, worst first (`diff.compare.DiffResult.verdict`)
DIFF_VERDICTS = ("regression", "changed", "no differences")
# the fields of a ubatch or an event that a comparison tells apart, in the order
# `differs` lists them (`diff.compare`); an event has stale and findings only
DIFF_UBATCH_FIELDS = ("tokens", "stale", "n_pool_real", "n_new", "n_new_g", "pools",
                      "scatter", "findings")
DIFF_EVENT_FIELDS = ("stale", "findings")

_CODE = {"type": "string", "pattern": FINDING_CODE_PATTERN}
_CODES = json_array(_CODE)
_STRS = json_array(_STR)
_SEQ_K = json_array(json_array(_NAT, minItems=2, maxItems=2), description="[seq, k]")
_OR_NULL = ({"type": "null"},)

# the diff writes a side as its report holds it: the report's own fields where they
# are the same (a ubatch's counts, a scatter entry, a token, a finding's code and rows)
DIFF_FINDING = Record("diff finding", "a finding of one side, as the diff keys it", (
    FINDING["code"], FINDING["rows"],
))

DIFF_UBATCH_SIDE = Record("diff ubatch side", "what one side's ubatch did", (
    *(UBATCH[n] for n in ("index", "n_pool_real", "n_new", "n_new_g", "stale_batch")),
    _f("pools", _SEQ_K, "the pools marked new, in layout order"),
    _f("scatter", json_array(SCATTER.schema()), "every entry of the scatter plan"),
    _f("findings", json_array(DIFF_FINDING.schema()), "its findings"),
    # a report may hold a later kpool's counters too (`diff.reports` reads them)
    _f("cost", {**COST.schema(), "additionalProperties": _NAT},
       "its cost counters, as its report has them: these, and a later version's"),
))

DIFF_OP_UBATCH = Record("diff op ubatch", "a ubatch of an op, on one side", (
    _f("batch_ubatch", _NAT, "its index in its decode"),
    *DIFF_UBATCH_SIDE.fields,
))

DIFF_EVENT_SIDE = Record("diff event side", "what one side's event did", (
    _f("kind", _STR, "the op's name"),
    _f("status", {"enum": list(OP_STATUSES)}, "what the op did"),
    _f("stale", _SEQ_MAP, "the stale positions it set"),
    _f("findings", json_array(DIFF_FINDING.schema()), "its findings"),
    _f("message", _STR, "why it was rejected or aborted (shown, never compared)",
       required=False),
))

DIFF_OP_SIDE = Record("diff op side", "what one side did at the op where the runs part", (
    _f("status", {"enum": list(OP_STATUSES)}, "what the op did"),
    _f("event", {"oneOf": [DIFF_EVENT_SIDE.schema(), *_OR_NULL]},
       "the op as an event, or null for a decode that ran"),
    _f("ubatches", json_array(DIFF_OP_UBATCH.schema()), "the ubatches it ran"),
))

DIFF_TOKEN = Record("diff token", "a token of the ubatch", (TOKEN["pos"], TOKEN["seq"]))

_DIFFERENCE_COMMON = (
    _f("findings_gained", _CODES, "codes head has more of, one per finding"),
    _f("findings_lost", _CODES, "codes base has more of, one per finding"),
)

DIFF_UBATCH = Record("ubatch difference", "an aligned ubatch whose behaviour differs", (
    _f("type", {"const": "ubatch"}, "ubatch"),
    _f("op", _NAT, "the index of its decode in the trace's ops"),
    _f("batch_ubatch", _NAT, "its index in its decode"),
    _f("tokens", json_array(DIFF_TOKEN.schema()), "its tokens (base's)"),
    _f("differs", json_array({"enum": list(DIFF_UBATCH_FIELDS)}),
       "the fields that differ"),
    _f("pools_only_base", _SEQ_K, "pools marked by base alone"),
    _f("pools_only_head", _SEQ_K, "pools marked by head alone"),
    *_DIFFERENCE_COMMON,
    _f("base", DIFF_UBATCH_SIDE.schema(), "base's ubatch"),
    _f("head", DIFF_UBATCH_SIDE.schema(), "head's ubatch"),
))

DIFF_EVENT = Record("event difference", "an aligned event whose behaviour differs", (
    _f("type", {"const": "event"}, "event"),
    _f("op", _NAT, "the op's index in the trace's ops"),
    _f("kind", _STR, "the op's name"),
    _f("differs", json_array({"enum": list(DIFF_EVENT_FIELDS)}), "the fields that differ"),
    *_DIFFERENCE_COMMON,
    _f("base", DIFF_EVENT_SIDE.schema(), "base's event"),
    _f("head", DIFF_EVENT_SIDE.schema(), "head's event"),
))

DIFF_PARTED = Record("parting", "the op where the runs stop being comparable ubatch by"
                     " ubatch: one side aborts, or rejects a decode the other applies", (
    _f("op", _NAT, "the op's index in the trace's ops"),
    _f("kind", _STR, "the op's name"),
    _f("reason", _STR, "why the runs part there"),
    _f("base", {"oneOf": [DIFF_OP_SIDE.schema(), *_OR_NULL]},
       "what base did there; null: its run ended before"),
    _f("head", {"oneOf": [DIFF_OP_SIDE.schema(), *_OR_NULL]},
       "what head did there; null: its run ended before"),
    _f("base_ubatches_after", _NAT, "ubatches base ran after the op"),
    _f("head_ubatches_after", _NAT, "ubatches head ran after the op"),
))

DIFF_CHANGE = Record("finding change", "findings of a code one side has more of", (
    _f("code", _CODE, "KP001, KP002, ..."),
    _f("count", json_int(1), "how many more"),
    _f("where", _STR, "their first places (`op 3.1`: op 3's ubatch 1; `op 3`: its event)"),
    _f("aligned", _BOOL, "false: after the runs part, compared by counts"),
    _f("rows", _INTS, "their rows, on the side that has them"),
))

DIFF_TOTALS = Record("diff totals", "one side's totals", (
    _f("ubatches", _NAT, "ubatches replayed"),
    _f("pools_repooled", _NAT, "pools marked new (the sum of n_new)"),
    _f("cost", {"type": "object", "additionalProperties": _NAT},
       "the cost counters, summed, by name"),
    _f("findings", _COUNTS, "findings per code"),
    _f("aborted", _BOOL, "a run ended in an engine abort (KP005)"),
))

_BASE_HEAD = json_object({"base": _NAT, "head": _NAT,
                          "ratio": {"type": ["number", "null"],
                                    "description": "head / base to 4 places; null when"
                                                   " base is 0"}},
                         ("base", "head", "ratio"), closed=False)

DIFF_COMPARE = Record("diff compare", "base beside head, for the pools re-pooled and each"
                      " cost counter", (
    _f("pools_repooled", _BASE_HEAD, "pools marked new"),
    *(_f(k, _BASE_HEAD, COST[k].doc) for k in COST_KEYS),
))

DIFF_BOTH = Record("diff both totals", "base's totals and head's, and the two compared", (
    _f("base", DIFF_TOTALS.schema(), "base's"),
    _f("head", DIFF_TOTALS.schema(), "head's"),
    _f("compare", DIFF_COMPARE.schema(), DIFF_COMPARE.doc),
))

DIFF_ENGINE = Record("diff engine", "what one side replayed with", (
    _f("engine", _STR, "the engine version"),
    _f("backend", {"type": ["string", "null"]}, "the value backend; null: model-only"),
))

DIFF_TRACE_ID = Record("diff trace id", "the trace compared", (
    *TRACE.fields,
    _f("same_trace", _BOOL, "false only when reports of different traces were forced"
       " together (--force)"),
))

DIFF_TRACE = Record("trace diff", "one trace, base vs head", (
    _f("trace", DIFF_TRACE_ID.schema(), DIFF_TRACE_ID.doc),
    _f("base", DIFF_ENGINE.schema(), "base's engine and backend"),
    _f("head", DIFF_ENGINE.schema(), "head's engine and backend"),
    _f("not_compared", _CODES, "codes only one side could find, left out of both"),
    _f("by_design", json_array({"enum": list(DIFF_UBATCH_FIELDS)}),
       "fields the two versions differ in on purpose, left out of `differs`"),
    _f("changed", _BOOL, "some behaviour differs (cost counters aside)"),
    _f("regression", _BOOL, "head has a finding base does not (ignored codes aside)"),
    _f("aligned_ubatches", _NAT, "ubatches compared one to one"),
    _f("cost_only_ubatches", _NAT, "aligned ubatches that differ in cost counters only"),
    _f("differences", json_array({"oneOf": [DIFF_UBATCH.schema(), DIFF_EVENT.schema()]}),
       "the aligned ubatches and events that differ, in op order"),
    _f("parted", {"oneOf": [DIFF_PARTED.schema(), *_OR_NULL]},
       "where the runs part; null: they never do"),
    _f("findings_fixed", json_array(DIFF_CHANGE.schema()), "findings base has more of"),
    _f("findings_introduced", json_array(DIFF_CHANGE.schema()),
       "findings head has more of"),
    _f("totals", DIFF_BOTH.schema(), DIFF_BOTH.doc),
))

DIFF_REGRESSION = Record("regression", "a finding change that fails the diff", (
    _f("trace", _STR, "the trace's path"),
    *DIFF_CHANGE.fields,
))

DIFF_SUMMARY = Record("diff summary", "totals over the command", (
    _f("traces", _NAT, "traces compared"),
    _f("changed", _NAT, "traces whose behaviour differs"),
    _f("findings_fixed", _COUNTS, "findings base has more of, per code"),
    _f("findings_introduced", _COUNTS, "findings head has more of, per code"),
    _f("regressions", json_array(DIFF_REGRESSION.schema()), "what fails the diff"),
    _f("totals", DIFF_BOTH.schema(), "over every trace"),
    _f("not_compared", _CODES, "codes left out of the comparison of some trace"),
    _f("verdict", {"enum": list(DIFF_VERDICTS)}, "the worst of them"),
    _f("exit_code", {"enum": [exits.PASS, exits.FINDINGS]}, "the command's exit status"),
))

DIFF = Record("diff", "What `kpool diff` found. Fields may be added in later versions;"
              " none is renamed.", (
    _f("kpool_diff", {"const": DIFF_VERSION}, "the format version"),
    _f("tool", TOOL.schema(), TOOL.doc),
    _f("base", _STR, "base's engine (several, joined, when reports differ)"),
    _f("head", _STR, "head's engine"),
    _f("fail_on_change", _BOOL, "--fail-on-change: any behavioural difference fails"),
    _f("ignore", _STRS, "--ignore: codes or prefixes whose gain is no regression"),
    _f("traces", json_array(DIFF_TRACE.schema()), "one per trace, in order"),
    _f("summary", DIFF_SUMMARY.schema(), DIFF_SUMMARY.doc),
))


def diff_schema() -> dict[str, Any]:
    """The JSON output of `kpool diff --format json`. A fresh dict on every call."""
    return copy.deepcopy({
        "$schema": DIALECT,
        "title": f"kpool diff, format v{DIFF_VERSION}",
        **DIFF.schema(),
    })
