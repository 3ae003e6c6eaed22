"""Settings of `kpool check` read from a file: `[tool.kpool]` of a pyproject.toml, or a
kpool.toml, found from a folder upwards as ruff finds its own.

Owns: `Settings` (what the file says, each value checked; None where the file is
silent, so the command line's own default applies), `SettingsError` (a bad settings
file: `FILE:LINE: message`, exit 2), `load_settings` (discovery, reading, checking),
the known keys (`KEYS`), the bounds (`MAX_BYTES`, `MAX_JOBS`,
`MAX_ENTRIES`, `MAX_GLOB`) and how a per-path glob matches a trace (`Glob`).
The command line beats the file: merging is the CLI's, which passes a value of the
file on only where its own option was not given.

Invariants:
- Discovery: from `start` (a folder, or a file's folder) upwards to the filesystem
  root, the first folder holding a `kpool.toml` (the whole file is the settings) or a
  `pyproject.toml` with a `[tool.kpool]` table; in one folder kpool.toml wins. A
  pyproject.toml without the table is passed over. No user-level file is read, and
  the home folder is not a stop: the root is. A file another user owns (not this
  process's user, not root; the link's owner or its target's) is passed over and
  named in `Settings.not_trusted`, which the CLI warns of: a kpool.toml planted in
  a shared folder does not decide what a check run below it ignores.
- The file is untrusted: more than `MAX_BYTES` is refused before parsing, text is
  strict UTF-8, TOML nesting too deep for the parser is a problem, every value is
  checked (type, known name, bounds), and a problem quotes at most 40 characters of
  what the file says. Nothing from the file is imported or run: `engines` names
  registered versions only (a plug-in is named on the command line).
- Every problem is a `SettingsError` naming the file and the line: tomllib's line for
  a syntax error, else the line where the offending key is written (`_key_lines`
  finds it in the text, by the key's full path, so `engines` of `[tool.other]` is
  never taken for `engines` of `[tool.kpool]`). Unknown keys get the closest known
  key suggested.
- Per-path ignores: a glob relative to the settings file's folder, `/`-separated;
  `*` and `?` stay inside one path segment, `**` spans segments, `[...]` is a
  character class (`!` first negates it, and a negated class never matches `/`; a
  range whose ends are reversed is a problem of the file). A glob without `/` matches
  a trace's file name in any folder (as ruff's per-file-ignores do). Matching takes
  time linear in the path, whatever the glob: both come from a checkout, and a
  backtracking regex would let a short glob run for ever on a long name.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .check import OUTPUT_FORMATS
from .contracts.tally import FAIL_ON
from .inputs import InputRefused, InputTooLarge, line_at, nesting_past, read_input
from .trace.yaml_safe import clip, quote
from .verdict.codes import CODES
from .versions import ALL, named_by_data
from .wording import suggest, unknown_key, visible
from .workers import MAX_JOBS

# the files looked for, in the order they win within one folder
KPOOL_TOML = "kpool.toml"
PYPROJECT = "pyproject.toml"

MAX_BYTES = 1 << 20          # a settings file (or a pyproject.toml read to find one)
MAX_ENTRIES = 1000           # items in `engines`, `ignore`, one per-path list; globs
MAX_GLOB = 1000              # characters in one per-path glob

KEYS = ("engines", "fail-on", "ignore", "per-file-ignores", "output-format", "jobs")

_TOML_WHERE = re.compile(r"\s*\((?:at line (\d+), column (\d+)|at end of document)\)$")


class SettingsError(Exception):
    """A settings file kpool refuses (exit 2). `str(e)` is `FILE:LINE: message`, or
    `FILE: message` for a problem of the whole file (unreadable, too big)."""

    def __init__(self, file: Path, line: int | None, message: str) -> None:
        self.file = file
        self.line = line
        self.message = message
        where = visible(str(file)) + (f":{line}" if line is not None else "")
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class Settings:
    """What a settings file says, checked. None (or empty): the file says nothing."""

    source: Path | None                     # the file read; None: none found or --no-config
    engines: tuple[str, ...] | None         # registered names
    fail_on: str | None                     # one of contracts.tally.FAIL_ON
    ignore: tuple[str, ...]                 # codes ignored in every trace
    # (glob relative to the settings file's folder, codes ignored in matching traces)
    per_path_ignore: tuple[tuple[str, tuple[str, ...]], ...]
    output_format: str | None               # one of check.OUTPUT_FORMATS
    jobs: int | None                        # 1 <= jobs <= MAX_JOBS
    # the settings files the search passed over, and their owners: another user's
    not_trusted: tuple[tuple[Path, int], ...] = ()

    def ignored_for(self, path: Path) -> frozenset[str]:
        """The codes ignored for the trace at `path` (relative to the current folder,
        or absolute): `ignore`, and the codes of every per-path glob it matches."""
        codes = set(self.ignore)
        if self.per_path_ignore:
            name = path.name
            rel = _relative(path, self.source.parent) if self.source is not None else None
            for glob, glob_codes in self.per_path_ignore:
                target = rel if "/" in glob else name
                if target is not None and Glob.of(glob).fullmatch(target):
                    codes.update(glob_codes)
        return frozenset(codes)


NO_SETTINGS = Settings(source=None, engines=None, fail_on=None, ignore=(), per_path_ignore=(),
                       output_format=None, jobs=None)


def _relative(path: Path, folder: Path) -> str | None:
    """`path` relative to `folder` with `/` separators; None when it lies outside."""
    try:  # the folders resolved, not the file: a linked trace keeps its own name
        own = path.absolute().parent.resolve() / path.name
        return own.relative_to(folder.resolve()).as_posix()
    except ValueError:
        return None


class GlobError(ValueError):
    """A per-path glob that cannot be read (the settings file's problem)."""


class Glob:
    """A per-path glob (the module's invariants), matched as a set of states, one bit
    each, over the path's characters: a state is a position in the glob's tokens, so a
    step costs a few operations on one integer whatever the glob, and a match is
    linear in the path (a regex would backtrack: `*a*a*a*a*a*ab` against 120 `a`s).

    Tokens: a character test (a literal, `?`, a class), `*` (any run of non-`/`), `**`
    (any run), and `**/` (empty, or any run that ends in `/`: an entry state that
    skips the group or starts its run, the run, then its `/`). A state without a test
    is a star's: it stays on the characters its star takes and skips ahead without
    one. A run of three stars or more is one state: read as the regex this replaced
    read it (pairs `**` left to right, the last pair a `**/` when a `/` follows), it
    matches any run, and takes the `/` after it as optional when it is even.

    Two star tokens that span `/` are never next to each other (`_glob_tokens`: what
    `**/**/` matches, `**/` does), so a skip reaches at most two states on and a step
    takes two rounds of them; a glob of 333 `**/` was a chain of 333 skips, followed
    again at every character (9 s a trace in a deep folder, for a settings file of
    such globs). A character's tests are a lookup for the literals, one mask for `?`
    and a call per class, kept for `_MASKS_KEPT` characters. The states after the
    last trace's folder (the path up to its last `/`) are kept, so the traces of one
    folder, which come one after the other, cost their file names."""

    __slots__ = ("_accept", "_any", "_classes", "_folder", "_literals", "_masks",
                 "_nonslash", "_skip1", "_skip3", "_start", "_unslashed")

    def __init__(self, glob: str) -> None:
        literals: dict[str, int] = {}  # a character: the states of its literal
        unslashed = 0  # the states of `?`
        classes: list[tuple[int, _CharClass]] = []
        any_, nonslash, skip1, skip3 = 0, 0, 0, 0
        k = 0  # the next token's state
        for token in _glob_tokens(glob):
            if token == _GROUP:  # entry -> its run -> its `/`; the entry skips past
                literals["/"] = literals.get("/", 0) | 1 << (k + 2)
                skip1 |= 1 << k | 1 << (k + 1)
                skip3 |= 1 << k
                any_ |= 1 << (k + 1)
                k += 3
                continue
            if token in (_STAR, _ANY):  # it stays on what its star takes, and skips
                skip1 |= 1 << k
                if token == _STAR:
                    nonslash |= 1 << k
                else:
                    any_ |= 1 << k
            elif token == "?":
                unslashed |= 1 << k
            elif isinstance(token, _CharClass):
                classes.append((1 << k, token))
            else:
                literals[token] = literals.get(token, 0) | 1 << k
            k += 1
        self._literals, self._unslashed, self._classes = literals, unslashed, classes
        self._any, self._nonslash = any_, nonslash
        self._skip1, self._skip3 = skip1, skip3
        self._accept = 1 << k
        self._masks: dict[str, int] = {}
        self._start = self._run(1, "")
        self._folder = ("", self._start)  # the last folder read, and the states after it

    @staticmethod
    @functools.lru_cache(maxsize=1024)
    def of(glob: str) -> Glob:
        """The glob's matcher, made once. Raises GlobError for a class it cannot read."""
        return Glob(glob)

    def _mask(self, c: str) -> int:
        """The states whose character test passes `c`."""
        got = self._literals.get(c, 0) | (self._unslashed if c != "/" else 0)
        for state, test in self._classes:
            if test(c):
                got |= state
        if len(self._masks) < _MASKS_KEPT:
            self._masks[c] = got
        return got

    def _run(self, states: int, text: str) -> int:
        """The states after `states` have read `text` (0: no match can follow), each
        step's skips taken (at most two on, see the class)."""
        masks, skip1, skip3 = self._masks, self._skip1, self._skip3
        stay_any, stay = self._any, self._any | self._nonslash
        states |= (states & skip1) << 1 | (states & skip3) << 3
        states |= (states & skip1) << 1 | (states & skip3) << 3
        for c in text:
            mask = masks.get(c)
            if mask is None:
                mask = self._mask(c)
            states = (states & mask) << 1 | states & (stay_any if c == "/" else stay)
            states |= (states & skip1) << 1 | (states & skip3) << 3
            states |= (states & skip1) << 1 | (states & skip3) << 3
            if not states:
                break
        return states

    def fullmatch(self, path: str) -> bool:
        cut = path.rfind("/") + 1
        folder, states = self._folder
        if path[:cut] != folder:
            folder = path[:cut]
            states = self._run(self._start, folder)
            self._folder = (folder, states)
        return bool(self._run(states, path[cut:]) & self._accept)


# the characters a glob keeps the tests of (`Glob`): a path's are a few dozen, and a
# mask is up to MAX_GLOB bits, for each of up to MAX_ENTRIES globs
_MASKS_KEPT = 256


@dataclass(frozen=True, slots=True)
class _CharClass:
    """A `[...]` class: its characters and ranges; negated, it also refuses `/`."""

    negated: bool
    chars: frozenset[str]
    ranges: tuple[tuple[str, str], ...]

    def __call__(self, c: str) -> bool:
        inside = c in self.chars or any(lo <= c <= hi for lo, hi in self.ranges)
        return c != "/" and not inside if self.negated else inside


def _char_class(body: str) -> _CharClass:
    """The class `[body]`; GlobError for a range whose ends are reversed."""
    neg = body.startswith("!")
    if neg:
        body = body[1:]
    chars: set[str] = set()
    ranges: list[tuple[str, str]] = []
    j = 0
    while j < len(body):
        if j + 2 < len(body) and body[j + 1] == "-":
            lo, hi = body[j], body[j + 2]
            if lo > hi:
                raise GlobError(f"the class [{body}] has a reversed range {lo}-{hi}")
            ranges.append((lo, hi))
            j += 3
        else:
            chars.add(body[j])
            j += 1
    return _CharClass(neg, frozenset(chars), tuple(ranges))


# a glob's star tokens (`Glob`): `*`, a run of two or more stars (any run), `**/`
_STAR, _ANY, _GROUP = "*", "**", "**/"


def _glob_tokens(glob: str) -> list[str | _CharClass]:
    """The tokens of `glob` (`Glob`'s): a literal character, `?`, a class, or a star
    token. A token that spans `/` right after another that does is one token with it:
    `**/` after `**/` or `**` is dropped (what the two match, the first matches), and
    `**` after `**/` takes its place (any run)."""
    tokens: list[str | _CharClass] = []
    i, n = 0, len(glob)
    while i < n:
        if glob[i] == "*":
            j = i
            while j < n and glob[j] == "*":
                j += 1
            run, slash = j - i, j < n and glob[j] == "/"
            i = j
            if run == 1:
                tokens.append(_STAR)
                continue
            token = _GROUP if run == 2 and slash else _ANY
            if slash and run % 2 == 0:  # pairs, the last a `**/`: its `/` is the token's
                i += 1
            if tokens and tokens[-1] in (_GROUP, _ANY):
                if token == _ANY:
                    tokens[-1] = _ANY
                continue
            tokens.append(token)
        elif glob[i] == "?":
            tokens.append("?")
            i += 1
        elif glob[i] == "[" and (end := glob.find("]", i + 2)) != -1:
            tokens.append(_char_class(glob[i + 1:end]))
            i = end + 1
        else:
            tokens.append(glob[i])
            i += 1
    return tokens


# -- discovery and reading -----------------------------------------------------------------

def load_settings(start: Path, *, no_config: bool = False) -> Settings:
    """The settings of the first settings file from `start` upwards (see the module's
    invariants); `NO_SETTINGS` when there is none or with `no_config`. Raises
    SettingsError for a file that cannot be read or parsed, or says anything wrong."""
    if no_config:
        return NO_SETTINGS
    try:
        return _discovered(start)
    except OSError as e:  # a folder kpool may not look into, a path past the system's length
        raise SettingsError(Path(e.filename) if e.filename else start, None,
                            f"cannot look for a settings file there: {e.strerror or e} "
                            "(--no-config skips the search)") from None


def _discovered(start: Path) -> Settings:
    """`load_settings`'s search, which reads the file system (an OSError passes)."""
    folder = start.resolve()
    if not folder.is_dir():
        folder = folder.parent
    passed: list[tuple[Path, int]] = []
    for d in (folder, *folder.parents):
        # whatever stands at the name is the settings file: a FIFO, a device or a
        # folder named kpool.toml is refused by _read, not passed over in silence
        for name, table in ((KPOOL_TOML, ()), (PYPROJECT, ("tool", "kpool"))):
            path = d / name
            if not os.path.lexists(path):
                continue
            owner = _other_owner(path)
            if owner is not None:
                passed.append((path, owner))
                continue
            text, data = _read(path)
            tool = data.get("tool")
            if not table or (isinstance(tool, dict) and "kpool" in tool):
                found = _settings(path, text, data, table)
                return replace(found, not_trusted=tuple(passed))
    return replace(NO_SETTINGS, not_trusted=tuple(passed))


def _other_owner(path: Path) -> int | None:
    """The owner of `path` (of the link, or of what it names) when that is another
    user than this process's and not root: such a file is passed over, as Mercurial
    passes over another user's hgrc, so that a settings file planted in a shared
    folder (/tmp) cannot ignore the findings of a `kpool check` run below it. None
    when this user or root owns both."""
    me = os.geteuid()
    for st in (os.lstat(path), *([os.stat(path)] if os.path.exists(path) else [])):
        if st.st_uid not in (me, 0):
            return st.st_uid
    return None


def _read(path: Path) -> tuple[str, dict[str, Any]]:
    try:
        raw = read_input(path, MAX_BYTES)
    except InputTooLarge:
        raise SettingsError(path, None, f"larger than {MAX_BYTES} bytes: not read") from None
    except InputRefused as e:
        raise SettingsError(path, None, f"cannot read it: it {e}") from None
    except OSError as e:
        raise SettingsError(path, None, f"cannot read it: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SettingsError(path, line_at(raw, e.start),
                            "not UTF-8 text") from None
    long_key = _long_key_line(text)
    if long_key is not None:  # tomllib takes time and memory quadratic in its parts
        raise SettingsError(path, long_key, f"invalid TOML: a dotted key of more than {_DEEP} "
                            "parts (kpool's keys have at most four): not parsed")
    try:
        return text, tomllib.loads(text)
    except ValueError as e:
        if not isinstance(e, tomllib.TOMLDecodeError):  # int(): thousands of digits
            raise SettingsError(path, None, "an integer of more digits than any setting "
                                "takes (Python refuses to read it)") from None
        message = str(e)
        m = _TOML_WHERE.search(message)
        line = None
        if m is not None:
            message = message[:m.start()]
            if m.group(1) is not None:
                line = int(m.group(1))
                message += f" (column {m.group(2)})"
            else:
                line = line_at(text, len(text))
        raise SettingsError(path, line, f"invalid TOML: {message}") from None
    except RecursionError:
        line = _deep_line(text)
        raise SettingsError(path, line, "invalid TOML: arrays and inline tables nested too "
                            "deeply" + (f" (past {_DEEP} levels from here)" if line else "")
                            ) from None


# `_deep_line`, `_long_key_line`: a settings file nests two or three levels, and its
# keys have two to four parts; where tomllib's recursion gives out, the line where the
# nesting first passed this many names the place, and a dotted key (or table name) of
# more parts is refused before tomllib reads it
_DEEP = 64
_ONE_LINE_STRINGS = r'"(?:\\.|[^"\\\n])*"' r"|'[^'\n]*'"
# the strings skipped (not read as a key): one that does not end is skipped to where it
# stops (its line's end, a backslash there, the text's end), so each character is read
# once. Tried again from every quote after it, a string that never ended was read
# again and again: `"\"\"\...` took the square of its length (38 s for 40 KB, before
# tomllib said a word). A multi-line basic string ends at the first `"""` no backslash
# escapes; a literal one, which has no escapes, at the first `'''`; each with the one
# or two quotes written just inside its end (`"""x""""` is `x"`: a quote left over
# would be skipped as a string to its line's end, a key or a bracket with it).
_MULTI_LINE_SKIPPED = r'"""(?:\\[\s\S]|[^\\])*?(?:"{3,5}|\\?\Z)' r"|'''[\s\S]*?(?:'{3,5}|\Z)"
_ONE_LINE_SKIPPED = r'"(?:\\.|[^"\\\n])*"?' r"|'[^'\n]*'?"
_NESTING = re.compile(_MULTI_LINE_SKIPPED + "|" + _ONE_LINE_SKIPPED +
                      r"|#[^\n]*|[\[\]{}]")  # comments; the brackets counted
_KEY_PART = r"(?:[A-Za-z0-9_-]+|" + _ONE_LINE_STRINGS + ")"
_LONG_KEY = re.compile(_MULTI_LINE_SKIPPED +
                       # a dotted key of more than _DEEP parts, from its first part on
                       # (not from within one: linear time): the group
                       r"|(?<![A-Za-z0-9_.-])"
                       f"({_KEY_PART}(?:[ \t]*\\.[ \t]*{_KEY_PART}){{{_DEEP},}})"
                       "|" + _ONE_LINE_SKIPPED + r"|#[^\n]*")  # strings and comments skipped


def _long_key_line(text: str) -> int | None:
    """The line of the first dotted key (or table name) of more than _DEEP parts
    (strings and comments skipped), or None."""
    for m in _LONG_KEY.finditer(text):
        if m.group(1) is not None:
            return line_at(text, m.start())
    return None


def _deep_line(text: str) -> int | None:
    """The line where arrays and inline tables first nest past _DEEP levels (strings
    and comments skipped), or None."""
    at = nesting_past(text, _NESTING, _DEEP)
    return None if at is None else line_at(text, at)


# -- checking ------------------------------------------------------------------------------

class _Checker:
    """Checks the values of one settings table; every problem names the key's line."""

    def __init__(self, path: Path, text: str, prefix: tuple[str, ...]) -> None:
        self.path = path
        self.prefix = prefix
        self._text = text
        self._lines: dict[tuple[str, ...], int] | None = None

    def line(self, *key: str) -> int | None:
        if self._lines is None:
            self._lines = _key_lines(self._text)
        full = self.prefix + key
        while full:  # the key, else the closest enclosing table written in the file
            if full in self._lines:
                return self._lines[full]
            full = full[:-1]
        return None

    def name(self, *key: str) -> str:
        """The key's dotted path as TOML writes it: a part that is not a bare key
        quoted, with what a terminal would act on escaped, and clipped."""
        return ".".join(p if _BARE.fullmatch(p) else f'"{visible(clip(p))}"'
                        for p in self.prefix + key)

    def fail(self, key: tuple[str, ...], message: str) -> SettingsError:
        return SettingsError(self.path, self.line(*key), f"{self.name(*key)}: {message}")

    def choice(self, key: str, value: object, known: tuple[str, ...]) -> str:
        if not isinstance(value, str):
            raise self.fail((key,), f"expected a string, got {_kind(value)}")
        if value not in known:
            raise self.fail((key,), f"unknown value {quote(value)}{suggest(value, known)}; "
                                    f"one of {', '.join(known)}")
        return value

    def strings(self, key: tuple[str, ...], value: object, what: str) -> list[str]:
        if not isinstance(value, list):
            # one name written bare (`engines = "rep-once"`): the list it belongs in
            hint = (f": write a list, even of one: [{quote(value)}]" if isinstance(value, str)
                    else "")
            raise self.fail(key, f"expected a list of {what}, got {_kind(value)}{hint}")
        if len(value) > MAX_ENTRIES:
            raise self.fail(key, f"more than {MAX_ENTRIES} items")
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise self.fail(key, f"item {i}: expected a string, got {_kind(item)}")
        return value

    def codes(self, key: tuple[str, ...], value: object) -> tuple[str, ...]:
        items = self.strings(key, value, "codes")
        for item in items:
            if item not in CODES:
                raise self.fail(key, f"unknown code {quote(item)}{suggest(item, CODES)}; "
                                     "`kpool explain` lists the codes")
        return tuple(dict.fromkeys(items))

    def engines(self, value: object) -> tuple[str, ...]:
        items = self.strings(("engines",), value, "engine names")
        if not items:
            raise self.fail(("engines",), "empty: name at least one engine, or leave the "
                                          "key out")
        for item in items:
            why = None if item == ALL else named_by_data(item, "a settings file", ", or all")
            if why is not None:
                raise self.fail(("engines",), why)
            if items.count(item) > 1:
                raise self.fail(("engines",), f"engine {quote(item)} named twice")
        return tuple(items)

    def jobs(self, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(("jobs",), f"expected an int, got {_kind(value)}")
        if not 1 <= value <= MAX_JOBS:
            raise self.fail(("jobs",), f"{_int_shown(value)} is out of range (must be 1 <= "
                                       f"value <= {MAX_JOBS})")
        return value

    def per_path(self, value: object) -> tuple[tuple[str, tuple[str, ...]], ...]:
        key = "per-file-ignores"
        if not isinstance(value, dict):
            raise self.fail((key,), f"expected a table of glob = [codes], got {_kind(value)}")
        if len(value) > MAX_ENTRIES:
            raise self.fail((key,), f"more than {MAX_ENTRIES} globs")
        out = []
        for glob, codes in value.items():
            if not glob:
                raise self.fail((key, glob), "an empty glob")
            if len(glob) > MAX_GLOB:
                raise self.fail((key, glob), f"a glob longer than {MAX_GLOB} characters")
            if glob.startswith("/") or "\\" in glob:
                raise self.fail((key, glob), f"glob {quote(glob)}: write it relative to the "
                                             "settings file's folder, with / separators")
            try:
                Glob.of(glob)
            except GlobError as e:
                raise self.fail((key, glob), f"glob {quote(glob)}: {visible(str(e))}") \
                    from None
            out.append((glob, self.codes((key, glob), codes)))
        return tuple(out)


def _int_shown(value: int) -> str:
    """An int of the file as a problem quotes it: whole up to 39 digits, else its size
    (TOML's hex, octal and binary ints have no bound, and `str` refuses one of more
    than 4,300 digits: `jobs = 0xfff...` was an internal error)."""
    bits = value.bit_length()
    return str(value) if bits <= _SHOWN_BITS else f"an int of {bits:,} bits"


_SHOWN_BITS = 128  # 2**128 has 39 digits


def _kind(value: object) -> str:
    kinds = {bool: "a bool", int: "an int", float: "a float", str: "a string",
             list: "a list", dict: "a table"}
    name = kinds.get(type(value), "a date or time")
    return f"{name} ({quote(value)})" if isinstance(value, str) else name


def _settings(path: Path, text: str, data: dict[str, Any], prefix: tuple[str, ...]) -> Settings:
    check = _Checker(path, text, prefix)
    table: object = data
    for part in prefix:
        assert isinstance(table, dict)
        table = table[part]
    if not isinstance(table, dict):
        raise check.fail((), f"expected a table, got {_kind(table)}")
    for key in table:
        if key not in KEYS:
            raise check.fail((key,), unknown_key(key, KEYS))
    t: Mapping[str, Any] = table
    return Settings(
        source=path,
        engines=check.engines(t["engines"]) if "engines" in t else None,
        fail_on=check.choice("fail-on", t["fail-on"], FAIL_ON) if "fail-on" in t else None,
        ignore=check.codes(("ignore",), t["ignore"]) if "ignore" in t else (),
        per_path_ignore=check.per_path(t["per-file-ignores"]) if "per-file-ignores" in t
        else (),
        output_format=(check.choice("output-format", t["output-format"], OUTPUT_FORMATS)
                       if "output-format" in t else None),
        jobs=check.jobs(t["jobs"]) if "jobs" in t else None,
    )


# -- where each key is written -------------------------------------------------------------

_BARE = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR_END = re.compile(r"[,\]}\n#]")


def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    """The line (1-based) where each key path is first written in `text`, a TOML
    document tomllib has accepted: table headers, keys and dotted keys (with their
    table's path), keys of inline tables. Strings, comments and arrays are skipped, so
    text inside them is never taken for a key. Past what it cannot follow (it should
    not happen on a document tomllib accepted), the lines found so far."""
    scan = _KeyScan(text)
    with contextlib.suppress(ValueError, IndexError, RecursionError, tomllib.TOMLDecodeError):
        scan.run()
    return scan.lines


class _KeyScan:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.newlines = [m.start() for m in re.finditer("\n", text)]
        self.lines: dict[tuple[str, ...], int] = {}

    def record(self, path: tuple[str, ...], at: int) -> None:
        self.lines.setdefault(path, bisect.bisect_right(self.newlines, at) + 1)

    def peek(self, k: int = 1) -> str:
        return self.s[self.i:self.i + k]

    def skip_blank(self, newlines: bool) -> None:
        """Spaces, tabs, comments (and newlines, if `newlines`)."""
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in " \t\r" or (newlines and c == "\n"):
                self.i += 1
            elif c == "#":
                end = s.find("\n", self.i)
                self.i = len(s) if end == -1 else end
            else:
                return

    def key(self) -> tuple[str, ...]:
        parts = []
        while True:
            self.skip_blank(False)
            c = self.peek()
            if c in ('"', "'"):
                start = self.i
                self.string()
                parts.append(tomllib.loads("k = " + self.s[start:self.i])["k"])
            else:
                m = _BARE.match(self.s, self.i)
                if m is None:
                    raise ValueError("not a key")
                parts.append(m.group())
                self.i = m.end()
            self.skip_blank(False)
            if self.peek() != ".":
                return tuple(parts)
            self.i += 1

    def string(self) -> None:
        s = self.s
        q = s[self.i]
        if s.startswith(q * 3, self.i):
            end = self.i + 3
            while True:
                end = s.index(q * 3, end)
                if q == '"' and _escaped(s, end):
                    end += 1
                    continue
                break
            end += 3
            while s.startswith(q, end):  # up to two quotes may end the content
                end += 1
            self.i = end
            return
        end = self.i + 1
        while True:
            end = s.index(q, end)
            if q == '"' and _escaped(s, end):
                end += 1
                continue
            break
        self.i = end + 1

    def value(self, path: tuple[str, ...]) -> None:
        self.skip_blank(False)
        c = self.peek()
        if c in ('"', "'"):
            self.string()
        elif c == "[":
            self.i += 1
            while True:
                self.skip_blank(True)
                if self.peek() == "]":
                    self.i += 1
                    return
                self.value(())
                self.skip_blank(True)
                if self.peek() == ",":
                    self.i += 1
        elif c == "{":
            self.i += 1
            while True:
                self.skip_blank(True)
                if self.peek() == "}":
                    self.i += 1
                    return
                if self.peek() == ",":
                    self.i += 1
                    continue
                at = self.i
                key = path + self.key()
                if path:
                    self.record(key, at)
                self.skip_blank(False)
                self.i += 1  # '='
                self.value(key if path else ())
        else:
            m = _SCALAR_END.search(self.s, self.i)
            self.i = len(self.s) if m is None else m.start()

    def run(self) -> dict[tuple[str, ...], int]:
        table: tuple[str, ...] = ()
        s = self.s
        while True:
            self.skip_blank(True)
            if self.i >= len(s):
                return self.lines
            at = self.i
            if s[self.i] == "[":  # a header, [a.b] or [[a.b]]: it writes a too
                n = 2 if s.startswith("[[", self.i) else 1
                self.i += n
                table = self.key()
                self.i += n
                for k in range(1, len(table) + 1):
                    self.record(table[:k], at)
            else:
                key = table + self.key()
                for k in range(len(table) + 1, len(key) + 1):  # a.b.c = 1 writes a.b too
                    self.record(key[:k], at)
                self.skip_blank(False)
                self.i += 1  # '='
                self.value(key)


def _escaped(s: str, at: int) -> bool:
    """Whether the quote at `at` follows an odd number of backslashes."""
    n = 0
    while at - n - 1 >= 0 and s[at - n - 1] == "\\":
        n += 1
    return n % 2 == 1
