"""Where numba caches kpool's compiled kernels, decided once before the first is
jitted, and the decorator the compiled core's kernels use.

Layer 1 (docs/ARCHITECTURE.md): it holds signals while numba loads.

Owns: `cache_for` (the choice, per kernel file), `cache_loads_only` (loading a
cached kernel without numba's refresh of its whole target context, nor its
plug-ins, nor a parse of its LLVM module before a compilation links it:
`_unserialize_lazily`), numba's plug-in discovery imported when it first runs
(`_plugins_when_compiling`), `kernel` and `inner`. Imported only by
modules that hold numba kernels (backend/kernels.py, compiled/kernels.py), so a
command that runs none never imports numba.

numba looks in NUMBA_CACHE_DIR, then the package's `__pycache__`, then the user's
cache directory, and refuses every `cache=True` function ("cannot cache function")
when it can write none of them: a shared install, a read-only home. So before the
first kernel is jitted, this module asks numba (`_numba_can_cache`, numba's own
check on a function it never compiles); when it cannot, it points numba at a
private directory under the system's temporary directory (`kpool-numba-<uid>`,
mode 0700, refused if someone else owns it or others can write it), and when even
that fails the kernels are jitted without a cache (a slower start, the same
results). `cache_for` says which: "numba" (numba's own place), a directory, or ""
(none).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import stat
import struct
import sys
import tempfile
import types
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .signals import masked

_PLUGINS = "numba.core.entrypoints"


def _plugins_when_compiling() -> types.ModuleType | None:
    """numba's plug-in discovery (`numba.core.entrypoints`), imported when it is first
    run rather than with numba.

    numba imports it as it is imported, and it imports `importlib.metadata` (with
    email, zipfile and csv: 20-40 ms of every replay that loads a kernel) to find the
    packages' `numba_extensions` entry points, which it runs before each compilation
    and each load of a cached kernel. Loading machine code needs no plug-in (one that
    mattered to a kernel's types was there when it was compiled); a compilation runs
    them as ever, from the target context's refresh (`cache_loads_only`). So a stand-in
    takes the module's place until `init_all` is first called, which imports the real
    module and runs it. Returns the stand-in; None when numba was imported before
    (then nothing is changed)."""
    if "numba" in sys.modules or _PLUGINS in sys.modules:
        return None
    stand_in = types.ModuleType(_PLUGINS, "numba's plug-in discovery, imported on first use "
                                "(kpool_cli/jit.py)")

    def real() -> Any:
        """The module itself, in the stand-in's place from now on."""
        if sys.modules.get(_PLUGINS) is stand_in:
            del sys.modules[_PLUGINS]
        module = importlib.import_module(_PLUGINS)
        numba_core: Any = sys.modules["numba.core"]
        numba_core.entrypoints = module
        return module

    def init_all() -> None:
        real().init_all()

    # `init_all` runs them; any other name (PEP 562) is the module's own
    vars(stand_in).update(init_all=init_all, __getattr__=lambda name: getattr(real(), name))
    sys.modules[_PLUGINS] = stand_in
    return stand_in


_stand_in = _plugins_when_compiling()

import numba  # noqa: E402 - after the stand-in, which numba's import takes

if _stand_in is not None and "entrypoints" not in vars(numba.core):
    # the import system binds a submodule to its package only when it loads it
    vars(numba.core)["entrypoints"] = _stand_in

F = TypeVar("F", bound=Callable[..., Any])


def _numba_can_cache(probe: Callable[..., Any]) -> bool:
    """Whether numba finds a writable cache for the file of `probe` (its own locators;
    `probe` is never compiled)."""
    try:
        numba.njit(cache=True)(probe)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return False
    return True


def _private_cache_dir() -> str | None:
    """`<tmp>/kpool-numba-<uid>`, made private to this user, or None when it cannot be
    (a cache is loaded with pickle: another user's directory must never be used)."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    path = os.path.join(tempfile.gettempdir(), f"kpool-numba-{uid if uid is not None else 'user'}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if (not stat.S_ISDIR(st.st_mode) or (uid is not None and st.st_uid != uid)
            or st.st_mode & 0o022 or not os.access(path, os.W_OK | os.X_OK)):
        return None
    return path


def _choose_cache(probe: Callable[..., Any]) -> str:
    """Decide where numba caches the kernels of `probe`'s file, before any is jitted
    (module docstring)."""
    if _numba_can_cache(probe):
        return "numba"
    path = _private_cache_dir()
    if path is not None:
        # numba reads NUMBA_CACHE_DIR into its config at import and again when the
        # environment changes: set both, so a later reload keeps this choice
        config: Any = numba.config  # its settings are set at run time: no stubs know them
        before = os.environ.get("NUMBA_CACHE_DIR"), config.CACHE_DIR
        os.environ["NUMBA_CACHE_DIR"] = path
        config.CACHE_DIR = path
        if _numba_can_cache(probe):
            return path
        if before[0] is None:
            del os.environ["NUMBA_CACHE_DIR"]
        else:
            os.environ["NUMBA_CACHE_DIR"] = before[0]
        config.CACHE_DIR = before[1]
    return ""


_chosen: dict[str, str] = {}  # a kernel file -> its choice


def cache_for(probe: Callable[..., Any]) -> str:
    """The cache of the kernels in `probe`'s file (numba's locators are per file; a
    private directory, once set, serves every file)."""
    where = probe.__code__.co_filename
    if where not in _chosen:
        _chosen[where] = _choose_cache(probe)
    return _chosen[where]


@contextlib.contextmanager
def cache_loads_only() -> Iterator[bool]:
    """numba's cache loads without the refresh of its target context they start with.

    Before numba loads a cached function (`Cache.load_overload`) it refreshes the
    whole target context: it imports and registers every typing and lowering
    implementation it has (numpy, lists, dicts, random, jitclass ...), about 0.25 s,
    half of a warm replay's time in numba. Loading machine code needs none of it
    but the runtime (NRT), which every kernel's arrays use (their reference counts,
    a view returned), and which this starts itself, its compiled functions read from
    the cache once a process has saved them (`_initialize_nrt`). A
    function that is not in the cache is compiled as ever: numba's compiler refreshes
    the context itself first, so what a compilation sees is unchanged. Nor does a load
    run the packages' numba plug-ins (`_compilation_chain_init_hook`, which numba
    runs before any compilation or load): a compilation runs them from that refresh.
    Yields whether the load was replaced: not when this numba lacks the methods it
    relies on (every load then refreshes, as numba does); the originals are back
    once the block ends."""
    from numba.core import caching, codegen
    from numba.core.runtime import nrt

    cache: Any = caching.Cache  # private methods: no stubs know them
    original = cache.__dict__.get("load_overload")
    # the dispatcher class that runs the plug-ins before a compilation or a load
    hooked: Any = next((c for c in numba.core.dispatcher.Dispatcher.__mro__
                        if "_compilation_chain_init_hook" in c.__dict__), None)
    if original is None or hooked is None or not all(hasattr(cache, name) for name in (
            "_load_overload", "_guard_against_spurious_io_errors")):
        yield False
        return
    hook = hooked.__dict__["_compilation_chain_init_hook"]

    def load_overload(self: Any, sig: Any, target_context: Any) -> Any:
        # all a loaded kernel needs of the refresh
        _initialize_nrt(nrt, target_context, getattr(self, "cache_path", None))
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)

    cache.load_overload = load_overload
    # numba runs the packages' plug-ins before a load too: a compilation runs them
    # from the refresh (`_plugins_when_compiling`)
    hooked._compilation_chain_init_hook = lambda self: None
    library: Any = codegen.CPUCodeLibrary  # private methods, as above
    unserialize = library.__dict__.get("_unserialize")
    if _unserialize_lazily_fits(library, unserialize):
        library._unserialize = classmethod(_unserialize_lazily(unserialize.__func__))
    try:
        with _no_masked_arrays():
            yield True
    finally:
        cache.load_overload = original
        hooked._compilation_chain_init_hook = hook
        if unserialize is not None:
            library._unserialize = unserialize


class _NoMaskedArray:
    """numpy.ma's MaskedArray before numpy.ma is imported: nothing is one."""


@contextlib.contextmanager
def _no_masked_arrays() -> Iterator[None]:
    """numba's `typeof` of an array (a kernel's first call types its arguments) asks
    whether it is a `numpy.ma.MaskedArray`, which makes numpy import numpy.ma: 6-7 ms
    of a replay's first kernel call on this project's machine (W3's `find_slot`: 10
    -> 3.6 ms). Until numpy.ma is imported, no array can be one; so for the block,
    when it is not, `numpy.ma` is a stand-in whose `MaskedArray` nothing is an
    instance of, and any other name of it imports the real module (as an import of
    numpy.ma does, which puts the module in the stand-in's place). After the block,
    numpy's own lazy attribute is back."""
    import numpy

    if "numpy.ma" in sys.modules or "ma" in vars(numpy):
        yield
        return

    def real(name: str) -> Any:
        return getattr(importlib.import_module("numpy.ma"), name)

    stand_in = types.ModuleType("numpy.ma", "numpy.ma until it is imported (kpool_cli/jit.py)")
    vars(stand_in).update(MaskedArray=_NoMaskedArray, __getattr__=real)
    vars(numpy)["ma"] = stand_in
    try:
        yield
    finally:
        if vars(numpy).get("ma") is stand_in:
            del vars(numpy)["ma"]


def _initialize_nrt(nrt: Any, ctx: Any, where: str | None) -> None:
    """numba's runtime (NRT) initialized, its few compiled functions loaded from a file
    in the cache directory `where` (a kernel's) rather than compiled each process.

    numba compiles them from LLVM IR whenever a process first loads or compiles a
    kernel, and caches them nowhere: 15-17 ms of every replay with kernels on this
    project's machine (loaded: about 1 ms). The first process compiles them as numba
    does, with the object code kept, and saves them (`kpool-nrt-<key>.nbn`, written
    whole or not at all); the key names numba's and llvmlite's versions and the CPU
    the code is for (`magic_tuple`, as numba keys its own cache). A file that does
    not load, and a directory that cannot be written, leave numba's way. The file is
    read with pickle, as numba's own cache files in the same directory are."""
    if getattr(nrt.rtsys, "_init", True) or not where:
        nrt.rtsys.initialize(ctx)
        return
    import hashlib
    import pickle

    import llvmlite  # type: ignore[import-untyped]
    from numba.core.runtime import nrtdynmod

    codegen = ctx.codegen()
    key = hashlib.sha256(repr((numba.__version__, llvmlite.__version__,
                               codegen.magic_tuple())).encode()).hexdigest()[:20]
    path = os.path.join(where, f"kpool-nrt-{key}.nbn")
    numbas = nrtdynmod.compile_nrt_functions

    def compiled(ctx: Any) -> Any:
        # numba's way below, for a file that is missing or does not load
        with contextlib.suppress(Exception), open(path, "rb") as f:
            return codegen.unserialize_library(pickle.load(f))
        module, library = nrtdynmod.create_nrt_module(ctx)
        library.add_ir_module(module)
        library.enable_object_caching()
        library.finalize()
        with contextlib.suppress(OSError):
            fd, tmp = tempfile.mkstemp(dir=where, prefix=".kpool-nrt-")
            try:
                with os.fdopen(fd, "wb") as f:
                    pickle.dump(library.serialize_using_object_code(), f)
                os.replace(tmp, path)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        return library

    nrtdynmod.compile_nrt_functions = compiled
    try:
        nrt.rtsys.initialize(ctx)
    finally:
        nrtdynmod.compile_nrt_functions = numbas


def _unserialize_lazily_fits(library: Any, unserialize: Any) -> bool:
    """Whether this numba unserializes a cached library as `_unserialize_lazily`
    expects (its own methods are used otherwise)."""
    return (isinstance(unserialize, classmethod)
            and all(hasattr(library, name) for name in (
                "enable_object_caching", "_set_compiled_object", "_finalize_final_module",
                "_get_module_for_linking")))


def _unserialize_lazily(numbas: Callable[..., Any]) -> Callable[..., Any]:
    """numba's `CPUCodeLibrary._unserialize` (`numbas`) of a cached kernel's machine
    code, without parsing the LLVM module it keeps beside it until someone links
    with it.

    numba caches a kernel as its object code and its whole LLVM module (for a later
    compilation that inlines it). Loading it, numba parses that module only to learn
    which symbols the library defines: about 2 ms a kernel on this project's machine
    (the first calls of a W3 replay's 15 kernels: 69-73 ms with numba's method, 42-44
    ms with this one). The object code's own symbol table says the same
    (`_elf_defined`: every global symbol the module defines; the module's private
    constants, which nothing looks up by name, are all it adds), so this reads it
    there and parses the module only when a compilation asks for it
    (`_get_module_for_linking`, of the class `_linked_lazily` makes). An object that
    is not ELF (macOS, Windows) or not readable as such is loaded by numba's own
    method."""

    def load(cls: Any, codegen: Any, state: Any) -> Any:
        name, kind, data = state
        defined = _elf_defined(data[0]) if kind == "object" else None
        engine: Any = getattr(codegen, "_engine", None)
        if defined is None or not hasattr(engine, "_defined_symbols"):
            return numbas(cls, codegen, state)
        lib = codegen.create_library(name)
        try:
            lib.__class__ = _linked_lazily(type(lib))
        except TypeError:  # a library class whose layout a subclass cannot take
            return numbas(cls, codegen, state)
        lib.enable_object_caching()
        lib._set_compiled_object(data[0])
        lib._kpool_linking_bitcode = data[1]
        lib._finalize_final_module()
        engine._defined_symbols.update(defined)
        return lib

    return load


_LAZY: dict[type, type] = {}  # a library class -> its `_LinkedLazily` subclass


def _linked_lazily(cls: type) -> type:
    """`cls` (a numba code library class) with its module for linking parsed on first
    use from the bitcode `_unserialize_lazily` kept."""
    if cls not in _LAZY:
        from llvmlite import binding

        def _get_module_for_linking(self: Any) -> Any:
            if self._shared_module is None:
                self._shared_module = binding.parse_bitcode(self._kpool_linking_bitcode)
            return self._shared_module

        _LAZY[cls] = type(f"{cls.__name__}LinkedLazily", (cls,),
                          {"_get_module_for_linking": _get_module_for_linking})
    return _LAZY[cls]


def _elf_defined(obj: bytes) -> set[str] | None:
    """The names of the global and weak symbols a 64-bit little-endian ELF object
    defines (its symbol tables' entries with a section, local ones left out); None
    when `obj` is not such an object or does not read as one."""
    if obj[:6] != b"\x7fELF\x02\x01":  # the magic, ELFCLASS64, ELFDATA2LSB
        return None
    try:
        shoff, = struct.unpack_from("<Q", obj, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
        names: set[str] = set()
        for i in range(shnum):
            head = shoff + i * shentsize
            if struct.unpack_from("<I", obj, head + 4)[0] != _SHT_SYMTAB:
                continue
            offset, size, link = struct.unpack_from("<QQI", obj, head + 0x18)
            entsize, = struct.unpack_from("<Q", obj, head + 0x38)
            strings, = struct.unpack_from("<Q", obj, shoff + link * shentsize + 0x18)
            for at in range(offset, offset + size - entsize + 1, entsize):
                name, info, _other, section = struct.unpack_from("<IBBH", obj, at)
                if section != _SHN_UNDEF and info >> 4 in (_STB_GLOBAL, _STB_WEAK):
                    start = strings + name
                    names.add(obj[start:obj.index(b"\0", start)].decode())
        return names
    except (struct.error, ValueError, UnicodeDecodeError):
        return None


_SHT_SYMTAB, _SHN_UNDEF, _STB_GLOBAL, _STB_WEAK = 2, 0, 1, 2


def _signature(sig: str) -> tuple[tuple[Any, ...], Any]:
    """(argument types, return type) of numba's signature text `sig`: the argument
    types as numba's typing hands a called function's to its compile (`kernel`'s
    `shared`)."""
    from numba.core import sigutils

    args, ret = sigutils.normalize_signature(sig)
    return tuple(args), ret


def inner(fn: F, views: bool = False) -> F:
    """`fn` as a numba function the kernels call (compiled into each caller, cached with
    it); never called from Python. A caller's constant argument is typed as its type,
    not as the constant: numba would compile the function again for each literal (`0`
    here, a variable there; `True` where a kernel's signature says `b1`): 20 of 95
    compiles in the first replays of four workloads. LLVM inlines what is small and
    folds the constant all the same. So an inner function never sees a literal: one
    that needs one to type (`numba.literally`, a tuple indexed by an argument) must
    be a kernel's own code, not an `inner`.

    An inner function counts no references (numba's `_nrt` off): the arrays it is
    handed are its caller's, alive for the call, so it needs none. With the counting
    on, numba increfs and decrefs each array argument it holds, atomic operations that
    its pruning leaves in place wherever the function branches, and that LLVM
    removes only when it inlines the function, which it does not for one with a few
    branches: 50-100 ns a call, where the work is a few ns (`kernels.pool_spans`,
    whose helpers judge each pool: 1.0-1.4 ms for 8,448 pools, 70-130 us without the
    counting; docs/performance.md, "fortieth session"). `views`: fn hands back a new
    view of an array (a slice, not an argument as it is), which the counting must
    own."""
    options: dict[str, Any] = {"cache": cache_for(fn) != "", "_nrt": views}
    jitted: Any = numba.njit(**options)(fn)
    jitted.get_call_template = _unliteral(jitted.get_call_template)
    return jitted


def _unliteral(get_call_template: Callable[..., Any]) -> Callable[..., Any]:
    """A dispatcher's `get_call_template` (how numba types a call of it from another
    function, compiling it for the argument types when it must) asked for the
    arguments' types without their literal values."""
    from numba.core.types import unliteral

    def unliteral_call(args: tuple[Any, ...], kws: dict[str, Any]) -> Any:
        return get_call_template(tuple(map(unliteral, args)),
                                 {k: unliteral(v) for k, v in kws.items()})

    return unliteral_call


def kernel(fn: F, name: str | None = None, sig: Any = None, shared: bool = False) -> F:
    """`fn` as a numba kernel compiled on its first call (for the argument types it is
    given, or for `sig` alone: numba's signature or signatures, as text or as numba's
    `Signature`, after which the kernel takes no other types), from numba's on-disk
    cache when `cache_for` allows: a run loads only the kernels it calls. No fastmath,
    no parallel. The first call loads under `cache_loads_only`, with SIGINT and SIGTERM
    held until the load is done, then puts the kernel itself in its module in place of
    this first-call stub (callers look it up there each call). `name`: the module
    attribute the stub is bound to, when it is not fn's own (`x = kernel(_x)`, where
    `_x` is an `inner` too): a stub left bound pays the signal mask and the loader's
    swap on every call (12 us alone, 40 us a call in a W2 replay).

    `shared`: other kernels call fn too (an `inner` of it), with the very argument
    types of the one signature `sig`. The kernel is then compiled under those types
    alone, its return type inferred, as a caller's compile asks for fn: numba files a
    compiled function in its on-disk cache under the signature as it was asked, so
    the two then share one entry, and whichever compiles fn first serves the other
    with a load (a second compile took 0.6-1.8 s a function in a first replay). The
    return type numba infers must be the one `sig` declares (checked as it compiles)."""
    if shared and not isinstance(sig, str):
        raise TypeError(f"{fn.__name__}: a shared kernel takes one signature, as text")
    cache = cache_for(fn) != ""
    # numba compiles (or loads) a signature's kernel as it is made: made on first call
    jitted: Any = numba.njit(cache=cache)(fn) if sig is None else None
    module = sys.modules[fn.__module__]
    bound = name or fn.__name__

    def first_call(*args: Any) -> Any:
        nonlocal jitted
        # numba loads (or compiles) here: a signal waits until it is done
        with masked(), cache_loads_only():
            if jitted is None and shared:
                types, declared = _signature(sig)
                jitted = numba.njit(types, cache=cache)(fn)
                # what the kernel hands back is what its signature says
                assert jitted.nopython_signatures[0].return_type == declared, fn
            elif jitted is None:
                jitted = numba.njit(sig, cache=cache)(fn)
            out = jitted(*args)
        setattr(module, bound, jitted)
        return out

    first_call.__doc__ = fn.__doc__
    first_call.__name__ = bound
    first_call.stub_of = fn  # type: ignore[attr-defined]  # marks the stub
    return first_call  # type: ignore[return-value]
