"""Engine versions: the policies that differ between releases of the k-pool engine,
the bases and patches they are made of, a registry of the known ones, and loading a
user's own (`--engine pkg.mod:Name`).

Owns: `EngineVersion` (a frozen record of policies); the bases `CACHE_SAFE`
(llama.cpp before PR #29994) and `REP_ONCE` (PR #29994); the `Patch`es the field
applies to them, each with the `Origin` it was read from and the base policies its
anchors need; `compose` (`BASE+PATCH[+PATCH...]`); `VERSIONS`, the shipped versions
(the bases and the named `COMBINATIONS`); `registered` (a shipped name or a
composition; `unknown_engine`, the one refusal of a name that is neither;
`named_by_data`, why a trace or a settings file may not name one) and `load_version`
(those, or a plug-in); `plugin_files`, the files a plug-in is imported from (inputs
no output may overwrite); `instead`, what to run on a base a patch cannot apply to
(its port there, `Patch.port_of`, or the patch a port ports). docs/versions.md.

Invariants: a composed version's name is its spec (`cache-safe+tail-truncate`); a
patch applies only to a base whose policies its anchors need (`Patch.needs`), and
two patches never set the same policy; a refusal of a patch on a base names what
`instead` finds, so `rep-once+tail-truncate` points at the shipped `tail-truncate`;
a plug-in named as a registered version it is not is named `name@spec`.

A third version is a few lines:

    >>> from dataclasses import replace
    >>> mine = replace(REP_ONCE, name="rep-once-no-dedup", mark_once_per_rep=False)
    >>> mine.seq_cp_whole_only
    True

Every policy names the ENGINE.md section whose rule it switches.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
import sys
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Literal, TypeGuard, TypeVar

from .wording import quoted, suggest, unicode_text

PADDING_POLICIES = ("unused-rows", "row-zero", "repeat-pool")
TRUNCATE_SPARES = ("no-shared-cell", "flagged-shared")


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
    # rep ("unused-rows"), all of them row 0 ("row-zero", a naive engine), or all of them
    # a real pool's row, pooled from its own members ("repeat-pool", the glm5next
    # branch's `any_rep_src`: engine/scatter.py `repeated_pool`)
    padding: Literal["unused-rows", "row-zero", "repeat-pool"] = "unused-rows"
    # ENGINE.md §5 step 2, a fork's patch for MTP: a stale sequence the cut does not
    # spare (`truncate_spares`) is not rebuilt but truncated at its stale position (its
    # pairs below it and the pools that end below it kept, unchecked: the staleness
    # contract says they did not change), then extended by the append path
    truncate_stale_tail: bool = False
    # ENGINE.md §5 step 2, which sequences the truncate spares (rebuilds instead):
    # "no-shared-cell", those holding a cell another sequence holds (the port onto
    # PR #29994, which has no `sq.shared`); "flagged-shared", those whose `sq.shared`
    # flag (step 3's sharing scan, as of the last update) is set: the fork's
    # `!sq.shared` on the cache-safe base it patches
    truncate_spares: str = "no-shared-cell"
    # ENGINE.md §4: a seq_rm that removes no cell of the attention cache stales nothing
    # (the no-op seq_rm after a fully accepted draft; docs/versions.md) ...
    seq_rm_noop_keeps_clean: bool = False
    # ... on every cache, or only on one of a single sequence (n_seq_max 1: the fork's
    # eligibility, `sequences != 1` is "unsupported_cache"), and there only for a
    # seq_rm of seq 0 (`llama_qsa_noop::inspect`: `sequence == 0`; a seq_rm(-1) stales
    # as on the base, ariera-j/llama.cpp-evox2-windows src/llama-qsa-noop-policy.h)
    seq_rm_noop_one_seq_only: bool = False
    # ENGINE.md §2 and §3 "The recurrent child": a seq_rm of a negative seq id matches
    # every sequence in the recurrent child (`seq_id >= 0 && (uint32_t) seq_id >=
    # n_seq_max`, angt/llama.cpp d5437c2), so a whole-range one clears every sequence;
    # False: the child refuses it (`(uint32_t) seq_id >= n_seq_max`, ggml-org/llama.cpp
    # 0054ee8) and so does the hybrid memory (KP008). docs/ENGINE-NOTES.md
    recurrent_seq_rm_matches_any: bool = True
    # ENGINE.md §2: a non-unified seq_keep(s) empties every other stream too (angt's
    # llama_kv_cache::seq_keep loops over every stream: "with per-sequence streams the
    # cells of the other sequences live in other streams and have to be removed as
    # well", angt/llama.cpp d5437c2); False: only s's own stream is touched
    # (ggml-org/llama.cpp 001d906). docs/ENGINE-NOTES.md
    seq_keep_every_stream: bool = False

    def policies(self) -> tuple[bool | str, ...]:
        """The policies alone (no name, no description): equal for two versions that
        behave alike."""
        return tuple(getattr(self, f.name) for f in fields(self)
                     if f.name not in ("name", "description"))

    def __post_init__(self) -> None:
        for name, known in (("padding", PADDING_POLICIES), ("truncate_spares", TRUNCATE_SPARES)):
            value = getattr(self, name)
            if value not in known:
                raise ValueError(f"{name} must be one of {', '.join(known)}, not {value!r}")


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

@dataclass(frozen=True, slots=True)
class Origin:
    """Where a base or a patch was read: a repository, a file and a commit (or, for a
    patch kept outside llama.cpp's tree, the patch file itself)."""

    repo: str
    path: str
    commit: str

    def __str__(self) -> str:
        return f"{self.repo} {self.path} @ {self.commit}"


@dataclass(frozen=True, slots=True)
class Patch:
    """A change the field applies to a base: the policies it sets (`sets`), the base
    policies its anchors need (`needs`, with `why`: the code it anchors on), where
    it was read (`origin`), and, for a port, the patch it ports onto the bases that
    one cannot apply to (`port_of`: `instead` names either for the other's base)."""

    name: str
    description: str
    origin: Origin
    sets: tuple[tuple[str, bool | str], ...]
    needs: tuple[tuple[str, bool | str], ...] = ()
    why: str = ""
    port_of: str = ""


BASE_ORIGINS = {
    CACHE_SAFE.name: Origin("ggml-org/llama.cpp", "src/llama-memory-hybrid-idx.cpp",
                            "the parent of 43fe9c64281ef735046adc025e9e7559a1f659a5 "
                            "(before PR #29994)"),
    REP_ONCE.name: Origin("ggml-org/llama.cpp", "src/llama-memory-hybrid-idx.cpp",
                          "43fe9c64281ef735046adc025e9e7559a1f659a5 (PR #29994)"),
}
BASES: dict[str, EngineVersion] = {v.name: v for v in (CACHE_SAFE, REP_ONCE)}

_FORK = Origin("audiagentic/bigcherry", "patches/1292_kpool_tail_truncate/patch.py",
               "133fb7113dc4fd952d5562d979a6083692c45b49 (on llama.cpp 0504396140d1, "
               "promoted 2026-10-05)")

_GLM5NEXT = Origin("ggml-org/llama.cpp", "src/llama-kv-cache-kpool.cpp",
                   "048799f098a19e52ec11a4dec93dbf9fead1233d (the glm5next branch), "
                   "lines 496-513")
_ANGT = Origin("angt/llama.cpp", "src/llama-memory-hybrid-idx.cpp",
               "f46848f9ddcb07e23ffa3bbf37ddc72fe1be3184")
_ANGT_KV = Origin("angt/llama.cpp", "src/llama-kv-cache.cpp",
                  "d5437c26f2ffc62dc6640509e72c284301dc1842 (`llama_kv_cache::seq_keep`)")

PATCHES: dict[str, Patch] = {p.name: p for p in (
    Patch("tail-truncate",
          "a fork's MTP patch to kpool_layout_update, as it ships: a stale sequence "
          "whose sq.shared flag is clear is cut at its stale position, not rebuilt",
          _FORK,
          sets=(("truncate_stale_tail", True), ("truncate_spares", "flagged-shared")),
          needs=(("repool_all_when_shared", True),),
          why="it anchors on `size_t n_kept = 0;` and gates on `!sq.shared` in "
              "kpool_layout_update, which PR #29994 removed with the sharing scan"),
    Patch("tail-truncate-port",
          "kpool's port of the fork's patch onto PR #29994: the cut spares a sequence "
          "holding a cell another sequence holds (there is no sq.shared to read)",
          _FORK,
          sets=(("truncate_stale_tail", True), ("truncate_spares", "no-shared-cell")),
          needs=(("repool_all_when_shared", False),),
          why="it reads the cells' sharing where PR #29994 dropped sq.shared",
          port_of="tail-truncate"),
    Patch("noop-seq-rm",
          "a seq_rm that removes no cell stales nothing (a fully accepted draft's "
          "seq_rm of the empty tail leaves the layout clean)",
          Origin("ariera-j/llama.cpp-evox2-windows",
                 "docs/evox2/R4-COMMON002-QSA-NOOP-WALL-VALIDATION-2026-10-04.md",
                 "e76ca92bae2ae3c5ed9f345c6ecaf3da1460a5b7 (the fork's measurement; its "
                 "own skip is gated: noop-seq-rm-one-seq)"),
          sets=(("seq_rm_noop_keeps_clean", True),)),
    Patch("noop-seq-rm-one-seq",
          "the no-op seq_rm patch where the fork enables it: a seq_rm of seq 0 on a "
          "cache of one sequence only (n_seq_max 1), where no cell can be shared",
          Origin("ariera-j/llama.cpp-evox2-windows", "src/llama-qsa-noop-policy.h",
                 "8f42138625294ace3be2c5839c572dd90473bd18 (opt-in, "
                 "LLAMA_QSA_SKIP_NOOP_INVALIDATION=1)"),
          sets=(("seq_rm_noop_keeps_clean", True), ("seq_rm_noop_one_seq_only", True))),
    Patch("seq-keep-every-stream",
          "a non-unified seq_keep empties every other sequence's stream too, not only "
          "the kept sequence's own (angt's llama_kv_cache::seq_keep)",
          _ANGT_KV, sets=(("seq_keep_every_stream", True),)),
    Patch("padding-repeats-pool",
          "every padding entry re-pools the first pool of a sequence in the ubatch into "
          "its rep row (\"the duplicate write is a no-op in effect\"), not a row of its own",
          _GLM5NEXT, sets=(("padding", "repeat-pool"),)),
)}

# the shipped combinations: name -> (spec, what it is, where it was read: None when
# its base and patches say it)
COMBINATIONS: dict[str, tuple[str, str, Origin | None]] = {
    "tail-truncate": ("rep-once+tail-truncate-port",
                      "kpool's port of the fork's patch onto PR #29994, under the name "
                      "it shipped with", None),
    "cache-safe+tail-truncate": ("cache-safe+tail-truncate",
                                 "the fork's version as its users run it: its pin "
                                 "0504396 predates PR #29994", None),
    "angt-f46848f": ("rep-once+seq-keep-every-stream",
                     "PR #29994's engine on angt's kv cache, whose non-unified seq_keep "
                     "empties every stream; its seq-id checks that return early and the "
                     "gather mode of set_input_kpool no valid trace reaches "
                     "(docs/versions.md)", _ANGT),
    "glm5next-048799f0": ("rep-once+padding-repeats-pool",
                          "the glm5next branch's padding, on PR #29994's engine: that "
                          "branch's own layout (absolute pools, a dirty flag) is another "
                          "design, not modelled (docs/versions.md)", _GLM5NEXT),
}


class VersionError(Exception):
    """An engine name that is neither registered nor a loadable `module:Name`, or a
    composition whose patch cannot apply to its base."""


def compose(spec: str) -> EngineVersion:
    """`BASE+PATCH[+PATCH...]`: the base's policies with each patch's set over them,
    named by the spec. Raises VersionError naming the base and the patch when a patch
    does not apply (its anchors need a policy the base has otherwise), when two patches
    set the same policy, or when a name is unknown."""
    base_name, *patch_names = [part.strip() for part in spec.split("+")]
    base = BASES.get(base_name)
    if base is None:
        raise VersionError(f"engine {spec!r}: unknown base {base_name!r}: the bases are "
                           f"{', '.join(BASES)}")
    changes: dict[str, bool | str] = {}
    set_by: dict[str, str] = {}
    for name in patch_names:
        patch = PATCHES.get(name)
        if patch is None:
            raise VersionError(f"engine {spec!r}: unknown patch {name!r}: the patches are "
                               f"{', '.join(PATCHES)}")
        for field_name, want in patch.needs:
            if getattr(base, field_name) != want:
                hint = instead(base_name, name, [base_name, *patch_names])
                raise VersionError(f"engine {spec!r}: patch {name!r} cannot apply to base "
                                   f"{base_name!r}: {patch.why}"
                                   + (f"; for {base_name}, {hint}" if hint else ""))
        for field_name, value in patch.sets:
            if field_name in set_by:
                raise VersionError(f"engine {spec!r}: patches {set_by[field_name]!r} and "
                                   f"{name!r} both change {field_name}")
            set_by[field_name] = name
            changes[field_name] = value
    if not patch_names:
        return base
    described = "; ".join(PATCHES[n].description for n in patch_names)
    return replace(base, name="+".join([base_name, *patch_names]),
                   description=f"{base.name} plus {described}", **changes)  # type: ignore[arg-type]


def applies_to(patch: Patch) -> tuple[str, ...]:
    """The bases `patch` can apply to (those whose policies its anchors need)."""
    return tuple(name for name, base in BASES.items()
                 if all(getattr(base, f) == want for f, want in patch.needs))


def instead(base_name: str, patch_name: str, parts: list[str] | None = None) -> str:
    """What to run on base `base_name` in place of patch `patch_name`, which cannot
    apply to it: its port there, or the patch it ports (`Patch.port_of`), in the spec
    `parts` (BASE, PATCH...; default: the base and the patch alone) with the one
    replaced, and the shipped version that spec is (by its policies): `use its port:
    rep-once+tail-truncate-port, the shipped version `tail-truncate` (not the patch
    of that name)`. "" when no patch stands in for it on that base."""
    patch = PATCHES[patch_name]
    for other in PATCHES.values():
        if other.port_of == patch_name:
            how = "its port"
        elif other.name == patch.port_of:
            how = "the patch it ports"
        else:
            continue
        if base_name not in applies_to(other):
            continue
        parts = parts or [base_name, patch_name]
        spec = "+".join(other.name if p == patch_name else p for p in parts)
        said = f"use {how}: {spec}"
        try:
            policies = compose(spec).policies()
        except VersionError:  # another of the patches does not apply: compose says so
            return said
        shipped = next((name for name, v in VERSIONS.items()
                        if name != spec and v.policies() == policies), None)
        if shipped is None:
            return said
        same_name = " (not the patch of that name)" if shipped == patch_name else ""
        return f"{said}, the shipped version `{shipped}`{same_name}"
    return ""


def _shipped(name: str) -> EngineVersion:
    spec, what, _ = COMBINATIONS[name]
    v = compose(spec)
    return replace(v, name=name, description=f"{spec}: {what}")


TAIL_TRUNCATE = _shipped("tail-truncate")

# the shipped versions, bases first: `kpool engines`, `--engine all`; a trace and a
# settings file may name these and any composition of BASES and PATCHES
VERSIONS: dict[str, EngineVersion] = {
    **BASES, **{name: _shipped(name) for name in COMBINATIONS}}
DEFAULT_VERSION = REP_ONCE.name


# the fields of a comparison (diff/compare.py) a policy changes on purpose: two
# versions that differ in it are compared on everything else. The no-op seq_rm patch
# stales less, so it marks and scatters less: it is judged on the tokens, the layout's
# pool count, the events and the findings (with a value backend, KP003 sees a pooled
# row it should have refreshed)
_STALES_LESS = ("n_new", "n_new_g", "pools", "scatter", "stale")
BY_DESIGN = {"seq_rm_noop_keeps_clean": _STALES_LESS, "seq_rm_noop_one_seq_only": _STALES_LESS}


def by_design(a: str, b: str) -> tuple[str, ...]:
    """The comparison fields versions `a` and `b` (registered names or compositions)
    differ in by design; () when either is not registered (a plug-in, a report's
    unknown engine): then everything is compared."""
    try:
        va, vb = registered(a), registered(b)
    except VersionError:
        return ()
    return tuple(sorted({f for policy, fields in BY_DESIGN.items()
                         if getattr(va, policy) != getattr(vb, policy) for f in fields}))


ALL = "all"  # `--engine all`: every shipped version


def expand_all(specs: Iterable[str]) -> tuple[str, ...]:
    """`specs` with `all` replaced by every shipped version, each named once, in order."""
    out: list[str] = []
    for spec in specs:
        out += list(VERSIONS) if spec == ALL else [spec]
    return tuple(dict.fromkeys(out))


def is_registered(name: str) -> bool:
    """Whether `name` is a shipped version or a composition that applies (what data,
    a trace or a settings file, may name: it imports no code)."""
    try:
        registered(name)
    except VersionError:
        return False
    return True


def unknown_engine(name: str, also: str = "") -> str:
    """The one refusal of an engine name that is no registered version and no
    composition: the name (clipped), a near one, the known ones, then `also` (what
    else the place that named it takes, or why it takes no plug-in)."""
    return (f"unknown engine {quoted(name)}{suggest(name, VERSIONS)}: known engines are "
            f"{', '.join(VERSIONS)}, BASE+PATCH (kpool engines){also}")


def registered(name: str, also: str = "") -> EngineVersion:
    """A shipped version or a composition of registered bases and patches (what a trace,
    a settings file and `--engine` may name without importing code). Any other name is
    refused by `unknown_engine` (with `also`), a composition that does not apply by
    `compose`'s reason."""
    if name in VERSIONS:
        return VERSIONS[name]
    if "+" in name and ":" not in name:
        return compose(name)
    raise VersionError(unknown_engine(name, also))


def named_by_data(name: str, data: str, also: str = "") -> str | None:
    """Why `data` (a trace, a settings file: files that import no code) may not name
    the engine `name`, or None when it may: `registered`'s refusal, which for a
    plug-in's `module:Name` says where one is given."""
    note = (f"; {data} is data and names registered versions only: a plug-in "
            "(module:Name) is given with --engine" if ":" in name else "")
    try:
        registered(name, also + note)
    except VersionError as e:
        return str(e)
    return None


def plugin_files(spec: str | None) -> tuple[str, ...]:
    """The files the module of a `module:Name` engine spec and its parent packages are
    loaded from, as its import finds them (inputs: no output of kpool's may overwrite
    them); none for a registered name, or where none is found (`load_version` then
    says why)."""
    if spec is None or spec in VERSIONS or ":" not in spec:
        return ()
    mod_name = spec.partition(":")[0]
    if not mod_name:
        return ()
    own = sys.modules.get(mod_name)
    origin = getattr(own, "__file__", None)
    if own is None:
        try:  # a dotted name imports its parents, as its loading will
            found = importlib.util.find_spec(mod_name)
        except KeyboardInterrupt:  # Ctrl-C while a parent imports: the run's end
            raise
        except BaseException:  # any way a parent fails: what it says, `load_version` says
            return ()
        if found is None or not found.has_location:
            return ()
        origin = found.origin
    parts = mod_name.split(".")
    files = [getattr(sys.modules.get(".".join(parts[:n])), "__file__", None)
             for n in range(1, len(parts))]
    paths = [f for f in (*files, origin) if isinstance(f, str)]
    # a module imported from a zip archive (zipimport: `archive.zip/pkg/mod.py`) is read
    # from the archive, which is the file to keep
    return tuple(dict.fromkeys(a for f in paths for a in (_archive_of(f), f) if a))


def _archive_of(path: str) -> str | None:
    """The zip archive a module's path lies in (`/x/p.zip/m.py` -> `/x/p.zip`), or None
    for a path on the file system."""
    p = Path(path)
    for parent in p.parents:
        if parent.is_file():
            return str(parent)
    return None


def _module_of_file(path: str, attr: str) -> str:
    """What to write for a plug-in named by its file (`mypkg/engine.py:Name`): its
    module's dotted name (a package's `__init__.py` is the package), and the
    PYTHONPATH it is found on; where a part of that name is no Python identifier
    (`my-patch/`, `engine.txt`), no name imports it, and none is made up."""
    p = Path(path)
    module_file = p.suffix == ".py"
    p = p.with_suffix("") if module_file else p
    if p.name == "__init__":  # a package's own file: the package
        p, module_file = p.parent, False
    parts = [part for part in p.parts if part != "."]
    outside = p.is_absolute() or ".." in parts  # found on PYTHONPATH=its folder
    named = [p.name] if outside else parts
    how = "name the module, not its file:"
    if not named or not all(part.isidentifier() for part in named):
        return (f"{how} --engine package.module:{attr}, each part of the module's dotted "
                "name a Python identifier, with the folder that holds its top package "
                "on PYTHONPATH")
    if outside:
        return f"{how} --engine {p.name}:{attr}, with PYTHONPATH={p.parent}"
    held = f"{parts[0]}.py" if len(parts) == 1 and module_file else f"{parts[0]}/"
    return (f"{how} --engine {'.'.join(parts)}:{attr}, with PYTHONPATH=. in the folder "
            f"that holds {held}")


def load_version(spec: str) -> EngineVersion:
    """A registered name, or `package.module:Name` naming an EngineVersion.

    Only the command line may name a `module:Name` (a trace's `engine:` and a settings
    file's `engines` are checked against `VERSIONS`): kpool imports the module, which
    runs the user's code, and calls nothing: `Name` must be an EngineVersion object
    (`replace(REP_ONCE, ...)`), anything else (a function, a class) is refused. What
    the import does (raise any exception, a BaseException of its own too, `sys.exit`)
    is a `VersionError`, worded even when the exception's own `str`, `repr`, class name
    or attributes raise, naming the file and line of the user's module where it
    raised, never an exit status of its own; only Ctrl-C (a KeyboardInterrupt, as
    kpool's SIGTERM is) ends the run as a signal. The version's name and description are
    Unicode text: a lone surrogate in them is written as its escape (`\\udcff`)."""
    known = ", ".join(VERSIONS)
    if not spec.strip():
        raise VersionError(f"empty engine name: give one of {known}, or package.module:Name")
    if spec == ALL:
        raise VersionError(f"engine {ALL!r} (every shipped version) is taken by kpool check "
                           f"--engine and kpool fuzz --engine only; name one version here: "
                           f"{known}, BASE+PATCH or package.module:Name")
    if ":" not in spec:
        # `pkg.mod.Name`, a Python path where kpool takes `pkg.mod:Name`: said as such
        module, _, name = spec.rpartition(".")
        near = (f" (did you mean {quoted(f'{module}:{name}')}?)"
                if module and all(part.isidentifier() for part in spec.split(".")) else "")
        return registered(spec, ", or give package.module:Name" + near)
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise VersionError(f"engine {spec!r}: give package.module:Name, both parts non-empty")
    if "/" in mod_name:  # no module's name holds a `/`: a file was given
        raise VersionError(f"engine {spec!r}: {_module_of_file(mod_name, attr)}")
    try:
        mod = importlib.import_module(mod_name)
    except KeyboardInterrupt:  # Ctrl-C (and kpool's SIGTERM) while it imports: the run's end
        raise
    except ModuleNotFoundError as e:
        # the importer's own (a subclass, or a `name` not a str, is the plug-in's doing)
        if (type(e) is ModuleNotFoundError and type(e.name) is str and e.name
                and mod_name.startswith(e.name) and mod_name[len(e.name):][:1] in ("", ".")):
            if mod_name.endswith(".py"):
                raise VersionError(f"engine {spec!r}: {_module_of_file(mod_name, attr)}"
                                   ) from None
            raise VersionError(
                f"engine {spec!r}: no module named {e.name!r} on Python's import path. "
                "Plug-in engines are imported like any Python module: from the installed "
                "packages and the directories in PYTHONPATH; the current directory is not "
                "searched. Install the package, or run with PYTHONPATH=DIR where "
                f"DIR/{mod_name.replace('.', '/')}.py (or a package of that name) lives"
            ) from None
        raise VersionError(f"engine {spec!r}: importing {mod_name!r} failed: "
                           f"{_described(e)}") from None
    except BaseException as e:  # the user's module may fail in any way on import
        raise VersionError(f"engine {spec!r}: importing {mod_name!r} failed: "
                           f"{_described(e)}") from None
    # read the module's own namespace (a module-level __getattr__ would run), and look
    # at the type itself (isinstance would ask a __class__ property)
    names = vars(mod)
    obj = names.get(attr, _MISSING)
    if obj is _MISSING:
        held = [n for n, v in names.items() if type(n) is str and type(v) is EngineVersion]
        raise VersionError(f"engine {spec!r}: module {mod_name!r} has no attribute {attr!r}"
                           f"{suggest(attr, held)}; its EngineVersion objects: "
                           f"{', '.join(held[:8]) + (', ...' if len(held) > 8 else '') or 'none'}")
    if type(obj) is not EngineVersion:
        raise VersionError(f"engine {spec!r}: {attr} is a {_kind(type(obj))}, not a "
                           "kpool_cli.versions.EngineVersion (kpool calls nothing "
                           "it imports: build the version in the module, e.g. Name = "
                           "replace(REP_ONCE, name=..., ...))")
    for f in fields(EngineVersion):  # plain values only: no object of the plug-in's
        v = object.__getattribute__(obj, f.name)
        if type(v) is not _FIELD_TYPES[f.name]:
            raise VersionError(f"engine {spec!r}: {attr}.{f.name} is a {_kind(type(v))}, "
                               f"not a {_FIELD_TYPES[f.name].__name__}")
    try:  # the values' own checks, which `object.__setattr__` after building skips
        obj.__post_init__()
    except ValueError as e:
        raise VersionError(f"engine {spec!r}: {attr}.{e}") from None
    # a plug-in named as a registered version (a shipped one, or a composition such as
    # rep-once+noop-seq-rm) but other than it is shown `name@spec`: a report, a diff's
    # fields left out by design (`by_design`) and check's results read the name
    if is_registered(obj.name) and registered(obj.name) != obj:
        obj = replace(obj, name=f"{obj.name}@{spec}")
    # a lone surrogate (`name="a\udcff"`, or a module file's undecodable byte in the
    # spec) is no text UTF-8, a JSON reader or kpool's own report reader takes: the
    # plug-in's text is written with its escape (`\udcff`, as the views show it), once,
    # here, so every report, diff and check output of the version reads back
    name, description = unicode_text(obj.name), unicode_text(obj.description)
    if (name, description) != (obj.name, obj.description):
        obj = replace(obj, name=name, description=description)
    return obj


_MISSING = object()
# each policy's plain type (bool, or str for the names and `padding`)
_FIELD_TYPES = {f.name: bool if f.type in ("bool", bool) else str
                for f in fields(EngineVersion)}


_Raised = TypeVar("_Raised", bound=BaseException)


def _is(e: BaseException, cls: type[_Raised]) -> TypeGuard[_Raised]:
    """isinstance(e, cls), asked of e's type: isinstance would ask a `__class__`
    property of the plug-in's."""
    return issubclass(type(e), cls)


def _kind(cls: type) -> str:
    """A class's own name, as Unicode text: read from the type itself (`type.__name__`),
    which a metaclass of the plug-in's cannot word otherwise, nor make raise."""
    return unicode_text(vars(type)["__name__"].__get__(cls))


def _said(e: BaseException) -> str:
    """What a plug-in's exception says, as Unicode text: `str(e)`, or for `sys.exit`
    its code; one whose `__str__` or `__repr__` raises says that instead."""
    try:
        return unicode_text(f"it called sys.exit({e.code!r})" if _is(e, SystemExit)
                        else str(e))
    except KeyboardInterrupt:
        raise
    except BaseException as inner:  # the plug-in's code: any way to fail
        return f"(its message raised {_kind(type(inner))})"


# what the compiler raises for a module that does not compile (a plug-in's subclass of
# them holds what its own code says)
_COMPILER_ERRORS = (SyntaxError, IndentationError, TabError)
# what `replace(REP_ONCE, mark_once_per_repp=...)` raises: a policy misspelt
_UNKNOWN_FIELD = re.compile(r"EngineVersion\.__init__\(\) got an unexpected keyword "
                            r"argument '\w+'")


def _described(e: BaseException) -> str:
    """What a plug-in's import raised (`_said`), after the place in its code where it
    raised (`mypkg/engine.py:5: `, `_raised_at`), and for a field EngineVersion does not
    have (a misspelt policy), the fields it has. Nothing of the plug-in's runs here but
    in `_said`: its class is asked of its type (`_is`, `_kind`), and attributes are read
    of the compiler's classes only."""
    said = _said(e)
    if _is(e, SystemExit):
        return f"{_raised_at(e)}{said}"
    kind = _kind(type(e))
    if (_is(e, SyntaxError) and type(e) in _COMPILER_ERRORS and type(e.filename) is str
            and type(e.lineno) is int and type(e.msg) is str):
        # raised by the compiler, before the module ran: its own place
        return f"{_shown(e.filename)}:{e.lineno}: {kind}: {unicode_text(e.msg)}"
    fields_are = ""
    if _is(e, TypeError) and _UNKNOWN_FIELD.fullmatch(said):
        fields_are = f"; its fields are {', '.join(f.name for f in fields(EngineVersion))}"
    return f"{_raised_at(e)}{kind}: {said}{fields_are}"


def _raised_at(e: BaseException) -> str:
    """`FILE:LINE: `, the line of the innermost module whose import raised `e` (the
    last frame of a module's own code in the traceback): the plug-in's line, or that
    of a module of the user's it imports; "" when the traceback holds none."""
    # the traceback Python holds (a `__traceback__` property of the plug-in's would run),
    # its frames as they are: no source line is read (`extract_tb` would open files)
    held = vars(BaseException)["__traceback__"].__get__(e)
    for frame, line in reversed(list(traceback.walk_tb(held))):
        name, path = frame.f_code.co_name, frame.f_code.co_filename
        # a code object the plug-in built may hold a str subclass, or no line table
        if (type(name) is str and name == "<module>" and type(path) is str
                and not path.startswith("<") and line is not None):
            return f"{_shown(path)}:{line}: "
    return ""


def _shown(path: str) -> str:
    """A module's path as the user wrote it where it can be (relative to the current
    directory when it lies below it), as Unicode text."""
    with contextlib.suppress(ValueError, OSError):
        rel = os.path.relpath(path)
        if not rel.startswith(os.pardir):
            path = rel
    return unicode_text(path)
