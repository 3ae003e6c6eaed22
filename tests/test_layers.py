"""The house's layers (docs/ARCHITECTURE.md, "Layers"): every import of kpool_cli, the
lazy ones inside functions included, goes to a module of its own room or of a room
below it, and no module imports itself back through others (no file circle).

The rooms, lowest first. A room may import its own modules and the rooms of lower
layers, never a room of its own layer or above: so the contracts (records, findings,
the tally, the report format, output files, exit statuses) import no renderer and no
command, the engine imports no verdict, and only the CLI imports everything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "kpool_cli"

LAYERS: list[set[str]] = [
    {"__init__", "arrays", "wording", "inputs", "signals", "cluster"},
    {"versions"},
    {"trace", "jit", "workers"},
    {"cache", "contracts"},
    {"engine"},
    {"compiled"},
    {"backend"},
    {"verdict"},
    {"replay"},
    {"check", "diff"},
    {"gen"},
    {"report", "settings"},
    {"cli"},
    {"__main__"},
]
LAYER_OF = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(path: Path) -> set[str]:
    """Every kpool_cli module `path` imports, at any depth of its code."""
    mod = module_name(path)
    package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            target, names = "", [a.name for a in node.names]
        else:
            continue
        # `from .pkg import module` imports the module (its package runs first, as for
        # any import of a submodule: no edge of its own); `from .mod import name`, mod
        modules = [n for n in names if n.startswith("kpool_cli") and _exists(n)]
        if not modules and target.startswith("kpool_cli") and _exists(target):
            modules = [target]
        out.update(modules)
    return out - {mod}


def _exists(module: str) -> bool:
    p = ROOT.joinpath(*module.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def graph() -> dict[str, set[str]]:
    g = {module_name(p): imports_of(p) for p in sorted(PKG.rglob("*.py"))}
    # verdict/rules/__init__.py imports its rule modules by discovery (importlib)
    rules = "kpool_cli.verdict.rules"
    g[rules] |= {m for m in g if m.startswith(rules + ".")}
    return g


def upward(g: dict[str, set[str]]) -> list[str]:
    """Imports into a room of the same layer or above (or a room with no layer)."""
    bad = []
    for src, targets in g.items():
        a = room_of(src)
        for dst in sorted(targets):
            b = room_of(dst)
            if a == b:
                continue
            if a not in LAYER_OF or b not in LAYER_OF or LAYER_OF[b] >= LAYER_OF[a]:
                bad.append(f"{src} -> {dst}")
    return bad


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_every_room_has_a_layer() -> None:
    rooms = {room_of(m) for m in graph()}
    assert rooms <= set(LAYER_OF), f"rooms without a layer: {sorted(rooms - set(LAYER_OF))}"


def test_no_import_runs_up_or_sideways() -> None:
    assert upward(graph()) == []


def test_no_module_imports_itself_back() -> None:
    assert circles(graph()) == []


def test_the_checks_catch_what_they_are_for() -> None:
    g = graph()
    # a contract importing a renderer runs up; a rule importing the registry closes a circle
    g["kpool_cli.contracts.tally"] = g["kpool_cli.contracts.tally"] | {
        "kpool_cli.report.view"}
    g["kpool_cli.verdict.rules.kp001_scatter_race"] |= {"kpool_cli.verdict.codes"}
    assert upward(g) == ["kpool_cli.contracts.tally -> kpool_cli.report.view"]
    assert any("kpool_cli.verdict.codes" in c for c in circles(g))


@pytest.mark.parametrize("source", ["from ..report import view\n", "from .. import report\n",
                                    "def f():\n    from ..report.view import RichView\n"])
def test_lazy_and_package_imports_are_seen(tmp_path: Path, source: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    fake = PKG / "contracts" / "zz_probe_for_test_layers.py"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: source if self == fake
                        else Path.read_bytes(self).decode())
    assert imports_of(fake) & {"kpool_cli.report.view", "kpool_cli.report"}
