"""What a command imports at start-up (issue 23, point 5): behaviour, not time.

- numba, and the numba kernels, are imported by a replay that uses the numba value
  backend and by nothing else: not `kpool --help`, `validate`, `gen --help`,
  `engines`, nor a replay with `--backend none` or `--backend numpy`;
- `kpool --help` imports no command's module (the group's table, cli/main.py's
  `COMMANDS`, gives each command's line), and that table says what the commands'
  own docstrings say;
- a JSON replay into a file draws nothing, so it imports no rich, and neither does
  a text replay into a file (the plain view);
- the value kernels load from numba's cache without numba's array module (none of
  them allocates: an allocating kernel's load imports it, 0.1 s) nor numpy.ma;
- `leave`, the script's end: atexit handlers run and their output is kept, the exit
  status is the command's, and a live thread is waited for;
- `jit.cache_loads_only` (numba's cache loads without the refresh of its target
  context) gives back numba's own method, and a kernel compiled under it (a cache
  miss) and one loaded under it (a hit) compute what numba computes; numba's runtime
  is compiled once and loaded after (`_initialize_nrt`); a loaded kernel's LLVM
  module is parsed only when a compilation links it (`_unserialize_lazily`, with
  `_elf_defined` held to llvmlite's reading of the module); a kernel's first call
  types its arrays without importing numpy.ma (`_no_masked_arrays`);
- `arrays.unique` is `np.unique`, without its import of numpy.ma.

Each command runs in a fresh interpreter, in-process there (`cli.main(args,
standalone_mode=False)`), which then reports the modules it holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kpool_cli.arrays import unique

ROOT = Path(__file__).resolve().parent.parent
RACE = str(ROOT / "traces" / "shared-prefix-race.yaml")

_RUN = """
import json, sys
from kpool_cli.cli.main import cli
try:
    code = cli.main(json.loads(sys.argv[1]), prog_name="kpool", standalone_mode=False)
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "modules": sorted(m for m in sys.modules
                                                   if m.split(".")[0] in ("numba", "numpy",
                                                   "yaml", "rich", "multiprocessing",
                                                   "kpool_cli", "importlib"))}),
      file=sys.__stderr__)
"""


def loaded(*args: str, env: dict[str, str] | None = None) -> tuple[int, set[str]]:
    """Run `kpool ARGS` in a fresh interpreter (the click group, in-process there): its
    exit status and the modules of interest it imported."""
    r = subprocess.run([sys.executable, "-c", _RUN, json.dumps(list(args))],
                       capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "NO_COLOR": "1", **(env or {})}, timeout=300)
    report = json.loads(r.stderr.strip().splitlines()[-1])
    return report["code"] or 0, set(report["modules"])  # None: the command returned


@pytest.mark.parametrize("args", [
    ("--help",),
    ("validate", RACE),
    ("gen", "--help"),
    ("engines",),
    ("replay", "--help"),
    ("replay", RACE, "-q", "--format", "json", "--backend", "none"),
    ("replay", RACE, "-q", "--format", "json", "--backend", "numpy"),
], ids=lambda a: " ".join(Path(x).name for x in a))
def test_only_a_numba_replay_imports_numba(args: tuple[str, ...], tmp_path: Path) -> None:
    out = ("-o", str(tmp_path / "r.json")) if "replay" in args and "--help" not in args else ()
    code, modules = loaded(*args, *out)
    assert code in (0, 1), (args, code)
    assert "numba" not in modules
    assert "kpool_cli.backend.kernels" not in modules


def test_a_numba_replay_does_import_numba(tmp_path: Path) -> None:
    """The other side, and the check that the report above sees what it should."""
    code, modules = loaded("replay", RACE, "-q", "--format", "json", "--backend", "numba",
                           "-o", str(tmp_path / "r.json"))
    assert code in (0, 1)
    assert {"numba", "kpool_cli.backend.kernels"} <= modules
    assert "rich" not in modules  # nothing is drawn: JSON into a file, no progress bar
    assert "numba.np.arrayobj" not in modules  # no value kernel allocates
    assert "numpy.ma" not in modules  # typing the kernels' arrays (jit._no_masked_arrays)


@pytest.mark.parametrize("trace", ["shared-prefix-race", "mtp3-speculative", "non-unified"])
def test_a_compiled_replay_loads_no_array_library(trace: str, tmp_path: Path) -> None:
    """The compiled core's kernels allocate nothing (compiled/kernels.py: the caller
    sizes every array and scratch), so loading them from numba's cache never imports
    numba's array library, `numba.np.arrayobj` and the unicode and charseq modules it
    pulls in: about 40 ms of every compiled replay (a cached kernel that calls
    `np.empty` rebuilds its environment by importing it). The second of two runs:
    the first compiles what conftest.py's warm-up did not (a compile imports it), so
    the second sees loads alone."""
    args = ("replay", str(ROOT / "traces" / f"{trace}.yaml"), "-q", "--format", "json",
            "--core", "compiled", "--backend", "numba", "-o", str(tmp_path / "r.json"))
    loaded(*args)
    code, modules = loaded(*args)
    assert code in (0, 1)
    assert "kpool_cli.compiled.kernels" in modules
    assert "numba.np.arrayobj" not in modules
    assert "numpy.ma" not in modules
    # nor numba's plug-in discovery, which imports importlib.metadata: a load runs no
    # plug-in (jit.py `_plugins_when_compiling`)
    assert "importlib.metadata" not in modules


def test_the_json_writers_kernels_load_with_numba_alone(tmp_path: Path) -> None:
    """context-shift has a ubatch of 30 tokens, which the JSON writer writes by its
    listing kernel once numba is loaded (report/json_kernels.py): a replay on the
    reference core without the numba backend writes it in Python and imports
    neither numba nor the kernels; one with numba loads the kernel (the second of
    two runs: loaded, not compiled) without numba's array library."""
    trace = str(ROOT / "traces" / "context-shift.yaml")
    out = ("-q", "--format", "json", "-o", str(tmp_path / "r.json"))
    code, modules = loaded("replay", trace, "--core", "reference", "--backend", "none", *out)
    assert code in (0, 1)
    assert not {"numba", "kpool_cli.jit", "kpool_cli.report.json_kernels"} & modules
    with_numba = ("replay", trace, "--core", "compiled", "--backend", "numba", *out)
    loaded(*with_numba)
    code, modules = loaded(*with_numba)
    assert code in (0, 1)
    assert "kpool_cli.report.json_kernels" in modules
    assert "numba.np.arrayobj" not in modules


def test_a_text_replay_into_a_file_imports_no_rich(tmp_path: Path) -> None:
    code, modules = loaded("replay", RACE, "-q", "-o", str(tmp_path / "r.txt"))
    assert code in (0, 1)
    assert (tmp_path / "r.txt").read_text().startswith("trace ")
    assert "rich" not in modules


def test_only_the_commands_that_draw_pages_load_their_modules(tmp_path: Path) -> None:
    """The pages (`--html`) are written by modules no other replay or diff loads."""
    pages = {"kpool_cli.report.trace_page", "kpool_cli.report.diff_page"}
    _, modules = loaded("replay", RACE, "-q", "-o", str(tmp_path / "r.txt"))
    assert not modules & pages
    _, modules = loaded("diff", RACE, "-o", str(tmp_path / "d.txt"))
    assert not modules & pages
    _, modules = loaded("replay", RACE, "-q", "-o", str(tmp_path / "r2.txt"), "--html",
                        str(tmp_path / "r.html"))
    assert "kpool_cli.report.trace_page" in modules
    _, modules = loaded("diff", RACE, "-o", str(tmp_path / "d2.txt"), "--html",
                        str(tmp_path / "d.html"))
    assert "kpool_cli.report.diff_page" in modules


_LEAVE = """
import atexit, sys, threading, time
from kpool_cli.cli.main import leave
atexit.register(lambda: print("atexit ran", flush=False))
if sys.argv[1] == "raises":
    atexit.register(lambda: 1 / 0)
if sys.argv[1] == "signal":  # SIGTERM once the command is done (not SIGINT: a
    import os, signal          # background job's children ignore it)
    atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM),
                             [i for i in range(10**5)]))  # Python work: a signal lands
if sys.argv[1] == "thread":
    def late():
        time.sleep(0.3)
        print("thread done", flush=True)
    threading.Thread(target=late).start()
sys.stdout.write("written, ")
leave(3)
"""


@pytest.mark.parametrize("thread", ["none", "thread", "raises", "signal"])
def test_leave_keeps_atexit_output_and_the_status(thread: str) -> None:
    r = subprocess.run([sys.executable, "-c", _LEAVE, thread], capture_output=True,
                       text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 3
    assert ("ZeroDivisionError" in r.stderr) == (thread == "raises")
    assert "KeyboardInterrupt" not in r.stderr
    want = "written, thread done\natexit ran\n" if thread == "thread" else "written, atexit ran\n"
    assert r.stdout == want


def test_leave_fails_as_the_interpreter_does_when_the_last_flush_fails() -> None:
    """What is left to write cannot be (stdout on /dev/full): status 120, as
    Py_FinalizeEx gives, not the command's 3."""
    with open(os.devnull if not os.path.exists("/dev/full") else "/dev/full", "w") as full:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        r = subprocess.run([sys.executable, "-c", _LEAVE, "none"], stdout=full, env=env,
                           stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == (120 if os.path.exists("/dev/full") else 3)


def test_help_imports_no_command() -> None:
    code, modules = loaded("--help")
    assert code == 0
    commands = {m for m in modules if m.startswith("kpool_cli.cli.")} - {
        "kpool_cli.cli.main", "kpool_cli.cli.io"}
    assert commands == set()
    assert not modules & {"numpy", "yaml", "rich", "multiprocessing"}


def test_validate_imports_no_pool_and_no_rich_off_a_terminal() -> None:
    code, modules = loaded("validate", RACE)
    assert code == 0
    assert not modules & {"rich", "multiprocessing", "numpy.ma"}


def test_the_command_table_says_what_the_commands_say() -> None:
    """`kpool --help` lists each command by COMMANDS' sentence, whole: it is the first
    sentence of the command's own help (shortened at any width, the two agree)."""
    from kpool_cli.cli.main import COMMANDS, cli

    assert sorted(cli.list_commands(None)) == sorted(COMMANDS)  # type: ignore[arg-type]
    for name, (module, attr, sentence) in COMMANDS.items():
        cmd = cli.get_command(None, name)  # type: ignore[arg-type]
        assert cmd is not None and cmd.name == name and not cmd.hidden
        assert cmd is getattr(sys.modules[f"kpool_cli.cli.{module}"], attr)
        listed = type(cmd)(name, help=sentence)
        for limit in range(10, 240):
            assert listed.get_short_help_str(limit) == cmd.get_short_help_str(limit), (
                name, limit)


_KERNEL = '''
import sys
import numba, numpy as np
from numba.core import caching
from numba.core.runtime import nrtdynmod
from kpool_cli.jit import cache_loads_only
original = caching.Cache.load_overload
made = []  # numba's runtime functions compiled from IR
create = nrtdynmod.create_nrt_module
nrtdynmod.create_nrt_module = lambda ctx: made.append(1) or create(ctx)
with cache_loads_only() as replaced:
    assert replaced
    assert caching.Cache.load_overload is not original

    @numba.njit("f4[::1](f4[::1], i8[::1])", cache=True)
    def pick(a, rows):
        out = np.empty(rows.size, dtype=np.float32)
        for j in range(rows.size):
            out[j] = a[rows[j]] * np.float32(3.0)
        return out

assert caching.Cache.load_overload is original
a = np.arange(10, dtype=np.float32)
got = pick(a, np.array([9, 0, 4], dtype=np.int64))
assert got.tolist() == [27.0, 0.0, 12.0], got
print(len(pick.stats.cache_hits), len(pick.stats.cache_misses), len(made))
'''


def _python(script: Path, cache: Path, *args: str) -> str:
    """What `script` prints, run by a fresh interpreter (from the repository's root)
    with numba's on-disk cache in `cache`; a failure fails the test with its stderr."""
    r = subprocess.run([sys.executable, str(script), *args], capture_output=True,
                       text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "NUMBA_CACHE_DIR": str(cache)})
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_cache_loads_only_compiles_a_miss_and_loads_a_hit(tmp_path: Path) -> None:
    """Under `cache_loads_only`, a kernel not in the cache is compiled (numba's compiler
    refreshes the context itself) and saved; the next process loads it without the
    refresh and it computes the same; numba's method is back after the block. numba's
    runtime (NRT), which the kernel's array uses, is compiled by the first process
    and saved beside the kernel (`jit._initialize_nrt`); the second loads it."""
    script = tmp_path / "kernel.py"
    script.write_text(_KERNEL)
    runs = [_python(script, tmp_path / "numba").split() for _ in range(2)]
    saved = list((tmp_path / "numba").rglob("kpool-nrt-*.nbn"))
    assert runs == [["0", "1", "1"], ["1", "0", "0"]] and len(saved) == 1
    # a file that does not load: numba's way, and a file that does is written again
    saved[0].write_bytes(b"not a pickle")
    assert _python(script, tmp_path / "numba").split() == ["1", "0", "1"]
    assert saved[0].read_bytes() != b"not a pickle"


_PLUGIN = """
import pathlib
pathlib.Path(__file__).with_name("ran").open("a").write("plug-in\\n")
def init():
    pathlib.Path(__file__).with_name("ran").open("a").write("init\\n")
"""

_PLUGGED = '''
import sys
import kpool_cli.jit  # first, as kpool's kernel modules import it: numba after it
import numba
from kpool_cli.jit import cache_loads_only, kernel

def triple(a):
    return a * 3

with cache_loads_only():
    k = numba.njit("i8(i8)", cache=True)(triple)
print(k(14), "importlib.metadata" in sys.modules)
'''


def test_a_kernel_load_runs_no_numba_plug_in_and_a_compilation_does(tmp_path: Path) -> None:
    """A package's numba plug-in (a `numba_extensions` entry point `init`): a kernel
    compiled under `cache_loads_only` (a cache miss) runs it, as numba does; the next
    process loads the kernel and neither runs it nor imports `importlib.metadata`,
    and the kernel computes the same."""
    site = tmp_path / "site"
    (site / "plug").mkdir(parents=True)
    (site / "plug" / "__init__.py").write_text(_PLUGIN)
    info = site / "plug-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plug\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[numba_extensions]\ninit = plug:init\n")
    script = tmp_path / "plugged.py"
    script.write_text(_PLUGGED)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
           "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    ran = site / "plug" / "ran"
    outs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           cwd=tmp_path, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        outs.append((r.stdout.split(), ran.read_text() if ran.exists() else ""))
    assert outs == [(["42", "True"], "plug-in\ninit\n"), (["42", "False"], "plug-in\ninit\n")]


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.intp])
def test_unique_is_np_unique(dtype: type) -> None:
    rng = np.random.default_rng(23)
    cases = [np.empty(0, dtype), np.array([5], dtype), np.array([3, 3, 3], dtype),
             rng.integers(0, 7, size=(4, 5)).astype(dtype)]
    cases += [rng.integers(0, n, size=n).astype(dtype) for n in (2, 10, 100, 1000)]
    for a in cases:
        want = np.unique(a)
        got = unique(a)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want)


def test_a_signal_during_a_compiled_kernels_first_load_waits_for_it(monkeypatch) -> None:
    """jit.kernel's first call loads (or compiles) under signals.masked, as the value
    kernels do: a SIGINT that arrives meanwhile is held until the load is done, then
    raised as kpool's KeyboardInterrupt (exit 130 at the CLI), never inside numba."""
    import contextlib
    import os
    import signal

    from kpool_cli import jit, signals

    seen = []

    @contextlib.contextmanager
    def loading():  # type: ignore[no-untyped-def]
        os.kill(os.getpid(), signal.SIGINT)  # arrives while numba would be loading
        seen.append("loaded")  # reached: the signal did not cut the load short
        yield True

    monkeypatch.setattr(jit, "cache_loads_only", loading)

    def plus_one(x):  # type: ignore[no-untyped-def]
        return x + 1

    first = jit.kernel(plus_one)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signals.install()
    try:
        with pytest.raises(KeyboardInterrupt):
            first(1)
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    assert seen == ["loaded"]


_STUBS = """
import numpy as np
from kpool_cli.compiled import kernels
stubs = {name: fn for name, fn in vars(kernels).items()
         if getattr(fn, "stub_of", None) is not None}
assert {"_first_winners_k", "_sorted_add_k", "_race_groups_k"} <= set(stubs), sorted(stubs)
wrong = [(name, fn.__name__) for name, fn in stubs.items() if fn.__name__ != name]
kernels.first_winners(np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), True,
                      np.zeros(1, dtype=bool))
print(wrong, getattr(kernels._first_winners_k, "stub_of", None) is None,
      hasattr(kernels._first_winners, "py_func"))
"""


def test_every_compiled_kernel_replaces_its_first_call_stub_where_it_is_bound() -> None:
    """jit.kernel's stub puts the kernel in its module under the name the stub is bound
    to: `first_winners = kernel(_first_winners)` once replaced `_first_winners`, so
    every call of `first_winners` went on through the stub, paying the signal mask
    and the loader's swap (about 12 us of a 1 us kernel) ever after. In a process of
    its own: a kernel called before (by another test) is no stub any more. (The
    kernel is `_first_winners_k` now, which `first_winners` calls with its scratch.)"""
    r = subprocess.run([sys.executable, "-c", _STUBS], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    # no stub bound under another name; _first_winners_k is the kernel after its first
    # call; _first_winners (an inner's Python function too) is left as it was
    assert r.stdout.split() == ["[]", "True", "False"]


_VALUE_STUBS = """
import numpy as np
from kpool_cli.backend.store import kernel_module
kernels = kernel_module("numba")
stubs = sorted(n for n, fn in vars(kernels).items() if getattr(fn, "stub_of", None) is not None)
print(len(stubs), "_least_pair" in stubs, "_scatter_fresh_into" in stubs)
got = kernels.least_pair(np.array([2, 0], dtype=np.int64), np.array([5, 6, 7], dtype=np.int64))
print(got == (5 << 20 | 0) or got, getattr(kernels._least_pair, "stub_of", None) is None,
      len(kernels._least_pair.signatures), "_scatter_fresh_into" in
      [n for n, fn in vars(kernels).items() if getattr(fn, "stub_of", None) is not None])
try:
    kernels._least_pair(np.zeros(1, dtype=np.int32), np.zeros(1, dtype=np.int64),
                        np.zeros(1, dtype=np.int64))
    print("took-int32")
except TypeError:
    print("refused-int32")
"""


def test_a_shared_kernel_takes_one_signature_as_text_and_returns_what_it_says() -> None:
    """`jit.kernel`'s `shared`: one signature, as text, or TypeError as the kernel is
    made; a function whose inferred return type is not the one the signature
    declares fails its first call, before it hands anything back (kpool's defect)."""
    from kpool_cli import jit

    def half(x):  # type: ignore[no-untyped-def]
        return x / 2  # float64, where the signature says i8

    for sig in (None, ["i8(i8)"]):
        with pytest.raises(TypeError, match="one signature"):
            jit.kernel(half, "half", sig, shared=True)
    with pytest.raises(AssertionError):
        jit.kernel(half, "half", "i8(i8)", shared=True)(4)


def test_a_value_kernel_loads_on_its_first_call_for_its_signature_alone() -> None:
    """backend/kernels.py's 26 value kernels are first-call stubs (`_value_kernel`,
    jit.kernel with a signature) after the module's import: `least_pair`'s first call
    loads `_least_pair` and binds the kernel in its stub's place, the others stay
    stubs (`scatter_fresh`'s among them), and the kernel takes its signature's types alone
    (int32 cells: numba's TypeError, not a new compile). The least pair of cells 2
    and 0 at positions 7 and 5: pos 5 << CELL_BITS | cell 0. In a process of its
    own, so no other test loaded a kernel first."""
    from kpool_cli.cache.cells import CELL_BITS

    code = _VALUE_STUBS.replace("<< 20", f"<< {CELL_BITS}")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["26", "True", "True", "True", "True", "1", "True",
                                "refused-int32"]


_THRESHOLDS = """
import gc, sys
from kpool_cli.cli.main import main
sys.argv = ["kpool", "validate", "traces/shared-prefix-race.yaml"]
try:
    main()
except SystemExit as e:
    print("status", e.code, *gc.get_threshold())
"""


def test_a_command_collects_cycles_less_often_than_python_does() -> None:
    """main() raises the collector's thresholds (cli/main.py GC_THRESHOLDS): with
    Python's 700 a W2 replay spent a quarter of its time rescanning records about to
    die by reference count. Cycles are still collected."""
    r = subprocess.run([sys.executable, "-c", _THRESHOLDS], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    status, gen0, gen1, gen2 = map(int, r.stdout.split("status ")[-1].split())
    assert status == 0
    assert gen0 >= 10_000 and gen1 > 0 and gen2 > 0


_LINKED = '''
import sys
import numba, numpy as np
from kpool_cli import jit

def _twice(x):
    return 2 * x

twice = jit.inner(_twice)

def first(a):
    return twice(a[0])

def second(a):
    return twice(a[1]) + 1

made = {}
with jit.cache_loads_only():
    for fn in (first, second):
        if fn.__name__ in sys.argv[1:]:
            made[fn.__name__] = numba.njit("i8(i8[::1])", cache=True)(fn)
a = np.array([5, 7], dtype=np.int64)
print(*(made[n](a) if n in made else "-" for n in ("first", "second")),
      sum(len(k.stats.cache_hits) for k in made.values()),
      sorted(c.__name__ for c in jit._LAZY.values()))
'''


def test_a_loaded_kernel_is_linked_lazily_and_a_compilation_links_it(tmp_path: Path) -> None:
    """`jit._unserialize_lazily`: a kernel loaded from the cache computes what it did
    when compiled, its library of the lazily linked class; and a kernel compiled in
    the same process (a cache miss) whose helper comes from the cache links that
    helper's module, parsed on first use: its own object code holds the helper, so a
    process that loads it alone runs it."""
    script = tmp_path / "linked.py"
    script.write_text(_LINKED)
    outs = [_python(script, tmp_path / "numba", *which).strip().split(None, 3)
            for which in (["first"], ["first", "second"], ["second"])]
    lazy = "['JITCodeLibraryLinkedLazily']" if sys.platform == "linux" else "[]"  # ELF
    assert outs[0] == ["10", "-", "0", "[]"]  # compiled: nothing loaded
    # loaded: `first` (a hit) and `twice` for `second`'s compilation, both lazily
    assert outs[1] == ["10", "15", "1", lazy]
    assert outs[2] == ["-", "15", "1", lazy]  # `second` alone


_COUNTED = '''
import sys
import warnings
import numba, numpy as np
from kpool_cli import jit

def _judge(rows, rep, pad, i):
    ok = True
    for j in range(2, rows.shape[1]):
        if rows[i, j] - rows[i, j - 1] != rows[i, 1] - rows[i, 0]:
            ok = False
    return ok and rep[i] == rows[i, rows.shape[1] - 1] and not pad[i]

def _tail(a, n):
    return a[n:]

judge, tail = jit.inner(_judge, views=sys.argv[1] == "views"), jit.inner(_tail, views=True)

@numba.njit
def judged(rows, rep, pad):
    c = 0
    for i in range(rows.shape[0]):
        c += judge(rows, rep, pad, i)
    return c, tail(rep, 1).sum()

rows = np.array([[0, 1, 2, 3], [4, 5, 6, 8], [8, 9, 10, 11]], dtype=np.int64)
rep = np.array([3, 8, 10], dtype=np.int64)
warnings.simplefilter("error")  # an inspection of code loaded from the cache is invalid
ir = "".join(judge.inspect_llvm().values()) if judged(rows, rep, np.zeros(3, bool)) else ""
print(*judged(rows, rep, np.zeros(3, dtype=bool)), ir.count("NRT_incref") + ir.count("NRT_decref"))
'''


def test_an_inner_function_counts_no_references_unless_it_hands_back_a_view(
        tmp_path: Path) -> None:
    """`jit.inner`: the helper a kernel calls for each pool (a branching judge of
    three arrays, as `kernels._scatter_regular`) is compiled without numba's
    reference counting, whose increfs and decrefs of its arrays would stay in each
    call LLVM does not inline; with `views=True` (a helper that hands back a view,
    which the counting must own: without it numba refuses to compile one that hands
    back a slice) they are there. Compiled afresh (an empty cache: numba does not
    inspect code it loaded), each judging the rows alike."""
    script = tmp_path / "counted.py"
    script.write_text(_COUNTED)
    # row 0 regular; row 1 steps 1, 1, 2; row 2's rep row is not its last member
    plain = _python(script, tmp_path / "plain", "plain").split()
    views = _python(script, tmp_path / "views", "views").split()
    assert plain[:2] == views[:2] == ["1", "18"]
    assert plain[2] == "0" and int(views[2]) > 0


_COMPILES = '''
from numba.core import event

compiled = []  # the dispatcher of each compilation, in order

class _Compiles(event.Listener):
    def on_start(self, ev):
        pass

    def on_end(self, ev):
        compiled.append(ev.data["dispatcher"])

event.register("numba:compile", _Compiles())
'''


_SHARED = _COMPILES + '''
import sys
import numba, numpy as np
from kpool_cli import jit

def _scale(a, k):
    return a[0] * k

scale_in = jit.inner(_scale)
scale = jit.kernel(_scale, "scale", "i8(i8[::1], i8)", shared=sys.argv[1] == "shared")

def outer(a):
    return scale_in(a, np.int64(3)) + 1  # the kernel's argument types

outer_k = jit.kernel(outer, "outer_k")
a = np.array([5, 7], dtype=np.int64)
print(scale(a, 2), outer_k(a), *sorted(d.py_func.__name__ for d in compiled))
'''


def test_a_shared_kernel_and_a_kernel_calling_its_function_compile_it_once(
        tmp_path: Path) -> None:
    """`jit.kernel`'s `shared`: a kernel under a signature, whose function another
    kernel calls (an `inner` of it) with the same argument types, is compiled under
    those types alone, the key numba's on-disk cache files a caller's compile of the
    function under: the caller's compile then loads the function, where without
    `shared` it compiles it a second time (backend/kernels.py's `one_step` and the
    three kernels of its passes: 1.1-1.3 s of a first replay)."""
    script = tmp_path / "shared.py"
    script.write_text(_SHARED)
    outs = [_python(script, tmp_path / shared, shared).split()
            for shared in ("shared", "apart")]
    assert outs == [["10", "16", "_scale", "outer"], ["10", "16", "_scale", "_scale", "outer"]]


_UNLITERAL = _COMPILES + '''
import numba, numpy as np
from kpool_cli import jit

def _add(a, k, flag):
    return a[0] + k + (1 if flag else 0)

def _add_numba(a, k, flag):  # a function of its own: numba's cache files each apart
    return a[0] + k + (1 if flag else 0)

add = jit.inner(_add)
add_numba = numba.njit(cache=True)(_add_numba)  # numba's own: a constant's value is its type

@numba.njit(cache=True)
def by_constants(a):
    return add(a, 0, False) + add_numba(a, 0, False)

@numba.njit(cache=True)
def by_values(a, k, flag):
    return add(a, k, flag) + add_numba(a, k, flag)

a = np.array([5, 7], dtype=np.int64)
print(by_constants(a), by_values(a, 2, True), sum(d is add for d in compiled),
      sum(d is add_numba for d in compiled))
'''


def test_an_inner_function_is_compiled_once_for_constants_and_values(
        tmp_path: Path) -> None:
    """`jit.inner`: a function two kernels call, one with constants (`0`, `False`) and
    one with values of their types, is compiled once; numba's own dispatcher compiles
    it for each constant's literal type and again for the values."""
    script = tmp_path / "unliteral.py"
    script.write_text(_UNLITERAL)
    assert _python(script, tmp_path / "numba").split() == ["10", "16", "1", "2"]


def test_elf_defined_names_the_modules_global_definitions() -> None:
    """`jit._elf_defined` reads, from a compiled kernel's object code, the names its
    LLVM module defines with a linkage others can see (llvmlite's own reading of the
    module, cached beside the object code); not ELF or cut short, None."""
    import numba
    from llvmlite import binding

    from kpool_cli.jit import _elf_defined

    @numba.njit("f8(f8[::1])")
    def total(a):  # type: ignore[no-untyped-def]
        s = 0.0
        for x in a:
            s += x
        return s

    _name, kind, (obj, bitcode) = total.overloads[total.signatures[0]].library \
        .serialize_using_object_code()
    assert kind == "object"
    module = binding.parse_bitcode(bitcode)
    hidden = {binding.Linkage.private, binding.Linkage.internal}
    want = {gv.name for gvs in (module.functions, module.global_variables) for gv in gvs
            if not gv.is_declaration and gv.linkage not in hidden}
    got = _elf_defined(obj)
    assert got == want and any("total" in n for n in got)
    assert _elf_defined(b"\xcf\xfa\xed\xfe" + obj[4:]) is None  # Mach-O's magic
    assert _elf_defined(obj[:0x30]) is None  # its section headers cut off
    assert _elf_defined(obj[:len(obj) // 2]) is None  # its section headers, at the end, gone


_MASKED = """
import sys
import numba, numpy as np
from kpool_cli import jit
with jit._no_masked_arrays():
    seen = [numba.typeof(np.zeros(2)).dtype, "numpy.ma" in sys.modules]
    import numpy.ma
    try:
        numba.typeof(numpy.ma.masked_array([1.0, 2.0]))
    except numba.core.errors.NumbaTypeError:
        seen.append("refused")
print(*seen, np.ma is sys.modules["numpy.ma"])
"""


def test_no_masked_arrays_types_arrays_and_still_refuses_a_masked_one() -> None:
    """`jit._no_masked_arrays`: numba types a plain array without importing numpy.ma;
    once numpy.ma is imported inside the block, a masked array is refused as numba
    refuses it; and numpy's own numpy.ma is in place after the block."""
    r = subprocess.run([sys.executable, "-c", _MASKED], capture_output=True, text=True,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["float64", "False", "refused", "True"]
