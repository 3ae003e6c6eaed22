"""The defects a ninth hostile-input campaign found on 7 December 2026
(docs/robustness.md, "The ninth round"): plug-ins that fail at import in ways the
loader did not expect, a plug-in's text that is not Unicode, and `kpool check`'s JSON
and SARIF of a file name that is not UTF-8. Each test runs what the campaign ran, or
the function it reached, and asserts what a user sees.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from test_untrusted import RACE_BODY, ROOT, kpool

from kpool_cli.versions import VersionError, load_version

RACE = ROOT / "traces" / "shared-prefix-race.yaml"
NOT_UTF8 = os.fsdecode(b"race\xff.yaml")  # a file name a Python str holds as a surrogate


def _on_path(tmp_path: Path) -> dict[str, str]:
    return {"PYTHONPATH": f"{os.environ.get('PYTHONPATH', '')}:{tmp_path}"}


def _strings(value: object) -> list[str]:
    """Every string of a JSON value, keys too."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _unicode_text(path: Path) -> object:
    """The JSON document at `path`, once each of its strings is known to be Unicode text
    (UTF-8 encodes it: no lone surrogate, which a strict reader refuses)."""
    doc = json.loads(path.read_text())
    for s in _strings(doc):
        s.encode("utf-8")
    return doc


# -- a plug-in that fails at import --------------------------------------------------------


@pytest.mark.parametrize("body, line, says", [
    ("class Stop(BaseException):\n    pass\nraise Stop('no')\n", 3, "Stop: no"),
    ("raise GeneratorExit('gone')\n", 1, "GeneratorExit: gone"),
])
def test_a_plug_in_that_raises_a_base_exception_at_import_is_exit_2(tmp_path, body, line,
                                                                     says):
    """An exception that is not an Exception (a BaseException of the plug-in's own,
    GeneratorExit) went past every handler: a Python traceback and exit 1, which
    means findings. It is told, after the plug-in's line that raised it."""
    (tmp_path / "pgbase.py").write_text(body)
    r = kpool("replay", str(RACE), "--backend", "none", "--engine", "pgbase:V",
              env=_on_path(tmp_path))
    assert r.returncode == 2, r.stderr
    assert r.stderr == (f"kpool: engine 'pgbase:V': importing 'pgbase' failed: "
                        f"{tmp_path / 'pgbase.py'}:{line}: {says}\n")
    assert r.stdout == ""


@pytest.mark.parametrize("name, body, line, says", [
    ("pgstr", "class E(Exception):\n    def __str__(self):\n        raise RuntimeError\n"
     "raise E()\n", 4, "E: (its message raised RuntimeError)"),
    ("pgexit", "import sys\nclass C:\n    def __repr__(self):\n        raise TypeError\n"
     "sys.exit(C())\n", 5, "(its message raised TypeError)"),
    ("pgnamed", "raise ModuleNotFoundError('odd', name=5)\n", 1, "ModuleNotFoundError: odd"),
    ("pgsurr", "raise ValueError('a\\udcffb \\ud800')\n", 1,
     "ValueError: a\\udcffb \\ud800"),
])
def test_a_plug_in_whose_error_cannot_be_worded_as_it_is_is_still_named(
        tmp_path, monkeypatch, name, body, line, says):
    """The loader worded the import's exception with `str`, `repr` and a string test of
    ModuleNotFoundError's `name`, each the plug-in's own: one that raises (or a `name`
    that is no string) was "kpool: internal error: RuntimeError" (TypeError). A lone
    surrogate in the message is written as its escape, so the message is text a JSON
    output can hold."""
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(VersionError) as e:
        load_version(f"{name}:V")
    assert str(e.value) == (f"engine '{name}:V': importing '{name}' failed: "
                            f"{tmp_path / (name + '.py')}:{line}: {says}")
    str(e.value).encode("utf-8")


_RAISES = "        raise RuntimeError('kpool ran me')\n"
_META = "class M(type):\n    @property\n    def __name__(cls):\n" + _RAISES


@pytest.mark.parametrize("name, body, line, says", [
    # a `__class__` property (what isinstance asks when the type is not the class)
    ("pgcls", "class E(Exception):\n    @property\n    def __class__(self):\n" + _RAISES
     + "raise E('m')\n", 5, "E: m"),
    # a metaclass that words a class's __name__ its own way
    ("pgmeta", _META + "class E(Exception, metaclass=M):\n    pass\nraise E('m')\n", 7,
     "E: m"),
    ("pgmetamsg", _META + "class Inner(Exception, metaclass=M):\n    pass\n"
     "class E(Exception):\n    def __str__(self):\n        raise Inner\nraise E()\n", 10,
     "E: (its message raised Inner)"),
    # properties over the attributes the loader reads
    ("pgtb", "class E(Exception):\n    @property\n    def __traceback__(self):\n" + _RAISES
     + "raise E('m')\n", 5, "E: m"),
    ("pgsynattr", "class S(SyntaxError):\n    @property\n    def filename(self):\n" + _RAISES
     + "raise S('m')\n", 5, "S: m"),
    ("pgmnfattr", "class E(ModuleNotFoundError):\n    @property\n    def name(self):\n"
     + _RAISES + "raise E('m')\n", 5, "E: m"),
    # a code object of the plug-in's own making: its file a str subclass that raises
    # when read, or no line table (a frame at no line)
    ("pgcode", "class S(str):\n    def startswith(self, *a):\n" + _RAISES
     + "code = compile('raise ValueError(1)', 'f.py', 'exec')\n"
     "exec(code.replace(co_filename=S('f.py')))\n", 5, "ValueError: 1"),
    ("pgnoline", "code = compile('raise ValueError(1)', 'f.py', 'exec')\n"
     "exec(code.replace(co_linetable=b''))\n", 2, "ValueError: 1"),
])
def test_a_plug_in_whose_exception_is_hostile_to_read_is_still_placed(
        tmp_path, monkeypatch, name, body, line, says):
    """The loader read the exception's class name, its `filename`, `name` and
    `__traceback__`, and its frames' file names as Python attributes, each of which the
    plug-in's code can answer: a property or a metaclass that raised was "kpool:
    internal error: RuntimeError" (a str subclass's `startswith` too), and a frame of no
    line was placed at `f.py:None`. The class's own name and the traceback Python holds
    are read instead, and a frame without a plain file and line is skipped."""
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _refusal(f"{name}:V") == (f"engine '{name}:V': importing '{name}' failed: "
                                     f"{tmp_path / (name + '.py')}:{line}: {says}")


def test_a_plug_in_object_whose_class_name_raises_is_refused_as_not_a_version(
        tmp_path, monkeypatch):
    """`V = X()`, X's metaclass raising for `__name__`: "internal error", where any other
    object that is not an EngineVersion is refused by its class's name."""
    (tmp_path / "pgobj.py").write_text(_META + "class X(metaclass=M):\n    pass\nV = X()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _refusal("pgobj:V").startswith("engine 'pgobj:V': V is a X, not a "
                                          "kpool_cli.versions.EngineVersion")


def _refusal(spec: str) -> str:
    """What `load_version` says of `spec`; else the class of what escaped it, named
    here, as the plug-in's hostile exception (its context) would break pytest's report."""
    try:
        load_version(spec)
    except VersionError as e:
        return str(e)
    except Exception as e:
        return f"escaped: {vars(type)['__name__'].__get__(type(e))}"
    return "loaded"


def test_a_plug_in_package_that_raises_a_base_exception_is_exit_2(tmp_path):
    """`--engine pkg.mod:V`, pkg/__init__.py raising a BaseException of its own: the
    outputs' check (`plugin_files`, which finds the module and so imports its package)
    caught Exception and SystemExit only, as the loader did before this round: a
    Python traceback and exit 1. It is the loader's error, at the package's line."""
    (tmp_path / "pgpkg").mkdir()
    (tmp_path / "pgpkg" / "__init__.py").write_text(
        "class Stop(BaseException):\n    pass\nraise Stop('no')\n")
    (tmp_path / "pgpkg" / "mod.py").write_text("")
    r = kpool("replay", str(RACE), "--backend", "none", "--engine", "pgpkg.mod:V",
              env=_on_path(tmp_path))
    assert r.returncode == 2, r.stderr
    assert r.stderr == ("kpool: engine 'pgpkg.mod:V': importing 'pgpkg.mod' failed: "
                        f"{tmp_path / 'pgpkg' / '__init__.py'}:3: Stop: no\n")


def test_ctrl_c_while_a_plug_in_imports_is_still_an_interrupt(tmp_path, monkeypatch):
    """The loader takes every exception of the import now, but not a KeyboardInterrupt:
    Ctrl-C (and kpool's SIGTERM, a KeyboardInterrupt) during a plug-in's import that
    never ends still ends the run as a signal, not as a bad engine."""
    (tmp_path / "pgctrlc.py").write_text("raise KeyboardInterrupt\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        load_version("pgctrlc:V")


# -- a plug-in's text that is not Unicode -----------------------------------------------------


def test_the_report_of_a_plug_in_named_with_a_lone_surrogate_reads_back(tmp_path):
    """The report wrote the plug-in's name as a lone surrogate (`\\udcff`), which the
    diff's reader refuses ("report.engine: not Unicode text"): kpool refused its own
    report. The name is written with its escape, the text the views show."""
    (tmp_path / "pgtext.py").write_text(
        "from dataclasses import replace\nfrom kpool_cli.versions import REP_ONCE\n"
        "V = replace(REP_ONCE, name='a\\udcffb', description='d\\ud800')\n")
    r = kpool("replay", str(RACE), "--backend", "none", "--engine", "pgtext:V",
              "--format", "json", "-o", "a.json", cwd=tmp_path, env=_on_path(tmp_path))
    assert r.returncode == 0, r.stderr
    report = _unicode_text(tmp_path / "a.json")
    assert isinstance(report, dict) and report["engine"] == "a\\udcffb"
    r = kpool("diff", "a.json", "a.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("kpool diff: base a\\udcffb vs head a\\udcffb\n")
    r = kpool("diff", str(RACE), "--head", "pgtext:V", "--format", "json", "-o", "d.json",
              cwd=tmp_path, env=_on_path(tmp_path))
    assert r.returncode == 0, r.stderr
    diff = _unicode_text(tmp_path / "d.json")
    assert isinstance(diff, dict) and diff["head"] == "a\\udcffb"


# -- kpool check's JSON and SARIF of a file name that is not UTF-8 ------------------------------


def test_check_json_of_a_file_name_that_is_not_utf8_is_unicode_text(tmp_path):
    """check's JSON wrote the path (in its result and in `versions`) as a lone surrogate,
    a string a strict JSON reader refuses, where the report writes `\\xff` since the
    fifth round."""
    (tmp_path / NOT_UTF8).write_text("kpool_trace: 1\n" + textwrap.dedent(RACE_BODY))
    r = kpool("check", NOT_UTF8, "--engine", "cache-safe", "--engine", "rep-once",
              "--backend", "none", "--no-config", "--output-format", "json", "-o", "c.json",
              cwd=tmp_path)
    assert r.returncode == 1, r.stderr  # the race, unpinned under cache-safe
    doc = _unicode_text(tmp_path / "c.json")
    assert isinstance(doc, dict)
    assert [x["path"] for x in doc["results"]] == ["race\\xff.yaml"] * 2
    assert [v["path"] for v in doc["versions"]] == ["race\\xff.yaml"]


@pytest.mark.parametrize("fmt", ["json", "sarif"])
def test_check_output_of_a_plug_in_module_named_not_utf8_is_unicode_text(tmp_path, fmt):
    """A plug-in imported from a file whose name is not UTF-8 (`pg\\xff.py`, named on
    the command line as its bytes): check's JSON (`engine`, `versions[].by` and
    `not_by`) and SARIF (`properties.engine`) wrote the spec as a lone surrogate. They
    name the version by its name now, as a report does (docs/versions.md), and a
    lone surrogate there is written as its escape too (`mine\\udcff`)."""
    plug = tmp_path / "plug"
    plug.mkdir()
    (plug / os.fsdecode(b"pg\xff.py")).write_text(
        "from dataclasses import replace\nfrom kpool_cli.versions import CACHE_SAFE\n"
        "V = replace(CACHE_SAFE, name='mine\\udcff')\n")
    (tmp_path / "race.yaml").write_text("kpool_trace: 1\n" + textwrap.dedent(RACE_BODY))
    spec = os.fsdecode(b"pg\xff:V")
    r = kpool("check", "race.yaml", "--engine", spec, "--engine", "rep-once",
              "--backend", "none", "--no-config", "--output-format", fmt, "-o", f"c.{fmt}",
              cwd=tmp_path, env=_on_path(plug))
    assert r.returncode == 1, r.stderr  # the race, unpinned under the plug-in
    doc = _unicode_text(tmp_path / f"c.{fmt}")
    assert isinstance(doc, dict)
    if fmt == "json":
        assert [x["engine"] for x in doc["results"]] == ["mine\\udcff", "rep-once"]
        assert doc["versions"][0]["by"][0]["engine"] == "mine\\udcff"
    else:
        assert {x["properties"]["engine"] for x in doc["runs"][0]["results"]} == {
            "mine\\udcff"}
