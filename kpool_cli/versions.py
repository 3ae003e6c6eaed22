"""Engine versions: the policies that differ between releases of the k-pool engine,
a registry of the known ones, and loading a user's own (`--engine pkg.mod:Name`).

Owns: `EngineVersion` (a frozen record of policies), `CACHE_SAFE` (llama.cpp before
PR #29994), `REP_ONCE` (PR #29994), `TAIL_TRUNCATE` (rep-once with a fork's layout
patch for MTP; docs/versions.md), `VERSIONS`, `load_version`.

A third version is a few lines:

    >>> from dataclasses import replace
    >>> mine = replace(REP_ONCE, name="rep-once-no-dedup", mark_once_per_rep=False)
    >>> mine.seq_cp_whole_only
    True

Every policy names the ENGINE.md section whose rule it switches.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, fields, replace
from typing import Literal

PADDING_POLICIES = ("unused-rows", "row-zero")


@dataclass(frozen=True, slots=True)
class EngineVersion:
    name: str
    description: str
    # ENGINE.md §4: a partial seq_cp aborts (GGML_ASSERT `p0 <= 0 && p1 < 0`) instead of
    # sharing part of a sequence
    seq_cp_whole_only: bool
    # ENGINE.md §4: seq_cp stales the source too, not only the destination
    seq_cp_stales_src: bool
    # ENGINE.md §4: seq_rm, state_read and state_drop stale every sequence while the
    # layout is shared
    restale_all_when_shared: bool
    # ENGINE.md §5 step 3 and §6: track sharing per sequence; while any cell of the layout
    # is shared, skip the stale/touched rules and re-pool every pool
    repool_all_when_shared: bool
    # ENGINE.md §6: mark a pool only if no pool with the same rep row was marked in this
    # ubatch (the per-row generation array of PR #29994)
    mark_once_per_rep: bool
    # ENGINE.md §7: where padding entries write: each its own row that is no real pool's
    # rep ("unused-rows"), or all of them row 0 ("row-zero", a naive engine)
    padding: Literal["unused-rows", "row-zero"] = "unused-rows"
    # ENGINE.md §5 step 2, a fork's patch for MTP: a stale sequence none of whose cells
    # is shared is not rebuilt but truncated at its stale position (its pairs below it
    # and the pools that end below it kept, unchecked: the staleness contract says they
    # did not change), then extended by the append path; shared sequences rebuild
    truncate_stale_tail: bool = False
    # ENGINE.md §2 and §3 "The recurrent child": a seq_rm of a negative seq id matches
    # every sequence in the recurrent child (`seq_id >= 0 && (uint32_t) seq_id >=
    # n_seq_max`, angt/llama.cpp d5437c2), so a whole-range one clears every sequence;
    # False: the child refuses it (`(uint32_t) seq_id >= n_seq_max`, ggml-org/llama.cpp
    # 0054ee8) and so does the hybrid memory (KP008). docs/ENGINE-NOTES.md
    recurrent_seq_rm_matches_any: bool = True

    def __post_init__(self) -> None:
        if self.padding not in PADDING_POLICIES:
            raise ValueError(f"padding must be one of {PADDING_POLICIES}, not {self.padding!r}")


CACHE_SAFE = EngineVersion(
    name="cache-safe",
    description="llama.cpp before PR #29994: re-pool every pool while cells are shared",
    seq_cp_whole_only=False,
    seq_cp_stales_src=True,
    restale_all_when_shared=True,
    repool_all_when_shared=True,
    mark_once_per_rep=False,
)

REP_ONCE = EngineVersion(
    name="rep-once",
    description="llama.cpp PR #29994: whole-sequence seq_cp only, each rep row marked once",
    seq_cp_whole_only=True,
    seq_cp_stales_src=False,
    restale_all_when_shared=False,
    repool_all_when_shared=False,
    mark_once_per_rep=True,
)

TAIL_TRUNCATE = replace(
    REP_ONCE,
    name="tail-truncate",
    description="rep-once plus a fork's MTP patch: a stale unshared sequence is truncated "
                "at its stale position instead of rebuilt",
    truncate_stale_tail=True,
)

VERSIONS: dict[str, EngineVersion] = {v.name: v for v in (CACHE_SAFE, REP_ONCE, TAIL_TRUNCATE)}
DEFAULT_VERSION = REP_ONCE.name


class VersionError(Exception):
    """An engine name that is neither registered nor a loadable `module:Name`."""


def load_version(spec: str) -> EngineVersion:
    """A registered name, or `package.module:Name` naming an EngineVersion.

    Only the command line may name a `module:Name` (a trace's `engine:` and a settings
    file's `engines` are checked against `VERSIONS`): kpool imports the module, which
    runs the user's code, and calls nothing: `Name` must be an EngineVersion object
    (`replace(REP_ONCE, ...)`), anything else (a function, a class) is refused. What
    the import does (raise, `sys.exit`) is a `VersionError`, never an exit status of
    its own."""
    if spec in VERSIONS:
        return VERSIONS[spec]
    known = ", ".join(VERSIONS)
    if not spec.strip():
        raise VersionError(f"empty engine name: give one of {known}, or package.module:Name")
    if ":" not in spec:
        raise VersionError(f"unknown engine {spec!r}: known engines are {known}, "
                           "or give package.module:Name")
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise VersionError(f"engine {spec!r}: give package.module:Name, both parts non-empty")
    try:
        mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        if e.name and mod_name.startswith(e.name) and mod_name[len(e.name):][:1] in ("", "."):
            raise VersionError(
                f"engine {spec!r}: no module named {e.name!r} on Python's import path. "
                "Plug-in engines are imported like any Python module: from the installed "
                "packages and the directories in PYTHONPATH; the current directory is not "
                "searched. Install the package, or run with PYTHONPATH=DIR where "
                f"DIR/{mod_name.replace('.', '/')}.py (or a package of that name) lives"
            ) from None
        raise VersionError(f"engine {spec!r}: importing {mod_name!r} failed: {e}") from None
    except (Exception, SystemExit) as e:  # the user's module may fail in any way on import
        raise VersionError(f"engine {spec!r}: importing {mod_name!r} failed: "
                           f"{_described(e)}") from None
    # read the module's own namespace (a module-level __getattr__ would run), and look
    # at the type itself (isinstance would ask a __class__ property)
    obj = vars(mod).get(attr, _MISSING)
    if obj is _MISSING:
        raise VersionError(f"engine {spec!r}: module {mod_name!r} has no attribute {attr!r}")
    if type(obj) is not EngineVersion:
        raise VersionError(f"engine {spec!r}: {attr} is a {type(obj).__name__}, not a "
                           "kpool_cli.versions.EngineVersion (kpool calls nothing "
                           "it imports: build the version in the module, e.g. Name = "
                           "replace(REP_ONCE, name=..., ...))")
    for f in fields(EngineVersion):  # plain values only: no object of the plug-in's
        v = object.__getattribute__(obj, f.name)
        if type(v) is not _FIELD_TYPES[f.name]:
            raise VersionError(f"engine {spec!r}: {attr}.{f.name} is a {type(v).__name__}, "
                               f"not a {_FIELD_TYPES[f.name].__name__}")
    if obj.name in VERSIONS and VERSIONS[obj.name] != obj:
        obj = replace(obj, name=f"{obj.name}@{spec}")
    return obj


_MISSING = object()
# each policy's plain type (bool, or str for the names and `padding`)
_FIELD_TYPES = {f.name: bool if f.type in ("bool", bool) else str
                for f in fields(EngineVersion)}


def _described(e: BaseException) -> str:
    if isinstance(e, SystemExit):
        return f"it called sys.exit({e.code!r})"
    return f"{type(e).__name__}: {e}"
