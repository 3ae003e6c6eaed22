"""The `kpool` command line: parse, call, render, pick the exit code. Nothing else.

Exit status of every command (TRACE_FORMAT.md): 0 pass, 1 findings at or above
`--fail-on`, 2 bad usage, an invalid trace, or an internal error. Never a
traceback; `--output` files are written whole or not at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import click

from . import __version__
from .backend.store import BACKENDS, DEFAULT_BACKEND, make_backend
from .engine.versions import DEFAULT_VERSION, VERSIONS, EngineVersion, VersionError, load_version
from .replay import replay
from .report.json_report import write_report
from .report.plain import write_plain
from .report.tally import FAIL_ON, Tally
from .trace.load import TraceError, load_trace
from .trace.schema import report_schema, trace_schema

EXIT_BAD_INPUT = 2


def _fail(message: str) -> None:
    click.echo(f"kpool: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


@contextlib.contextmanager
def _output(path: str | None) -> Iterator[TextIO]:
    """stdout, or a file that appears only when the run completes (written to a
    temporary beside it, then renamed)."""
    if path is None or path == "-":
        yield sys.stdout
        return
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                               dir=target.parent if str(target.parent) else ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _version_for(name: str | None, trace_engine: str | None) -> EngineVersion:
    try:
        return load_version(name or trace_engine or DEFAULT_VERSION)
    except VersionError as e:
        _fail(str(e))
        raise AssertionError from e  # unreachable: _fail exits


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kpool")
def cli() -> None:
    """Replay and inspect traces of llama.cpp's k-pool indexer cache."""


@cli.command("replay")
@click.argument("traces", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--engine", "engine", metavar="NAME",
              help="Engine version: cache-safe, rep-once, or package.module:Name. "
                   "Default: the trace's `engine:`, else rep-once.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="Text for people, JSON (TRACE_FORMAT.md) for machines.")
@click.option("--output", "-o", metavar="FILE",
              help="Write the report to FILE (atomically) instead of stdout.")
@click.option("--fail-on", type=click.Choice(FAIL_ON), default="error", show_default=True,
              help="Exit 1 when a finding of this severity or above is found.")
@click.option("--pools", type=click.Choice(["marked", "all"]), default="marked",
              show_default=True, help="List the marked pools of each ubatch, or every pool.")
@click.option("--check", is_flag=True,
              help="Fail (exit 1) when an `expect` of the trace does not hold.")
@click.option("--only-findings", is_flag=True, help="Text: show only ubatches with findings.")
@click.option("--backend", "backend", type=click.Choice(BACKENDS), default=DEFAULT_BACKEND,
              show_default=True,
              help="Value backend (key rows, pooling, KP001 values, KP003): numba, its numpy "
                   "twin, or none for the model-only replay.")
def replay_cmd(traces: tuple[str, ...], engine: str | None, fmt: str, output: str | None,
               fail_on: str, pools: str, check: bool, only_findings: bool,
               backend: str) -> None:
    """Replay TRACES through an engine version and report what each ubatch did.

    Exit status: 0 pass, 1 findings at or above --fail-on (or a failed expect with
    --check), 2 bad usage or an invalid trace."""
    loaded = []
    for path in traces:
        try:
            loaded.append(load_trace(path))
        except TraceError as e:
            _fail(f"invalid trace\n{e}")
    runs = [(t, _version_for(engine, t.engine)) for t in loaded]
    worst = 0
    try:
        with _output(output) as out:
            if fmt == "json" and len(runs) > 1:
                out.write("[\n")
            for n, (trace, version) in enumerate(runs):
                tally = Tally(fail_on=fail_on, check=check)
                records = replay(trace, version, make_backend(backend, trace),
                                 pools_all=pools == "all")
                if fmt == "json":
                    if n:
                        out.write(",\n")
                    write_report(out, trace, version.name,
                                 None if backend == "none" else backend, records, tally)
                else:
                    write_plain(out, trace, version.name, records, tally, only_findings)
                worst = max(worst, tally.exit_code)
            if fmt == "json":
                out.write("\n]\n" if len(runs) > 1 else "\n")
    except TraceError as e:
        _fail(f"invalid trace\n{e}")
    sys.exit(worst)


@cli.command("schema")
@click.argument("which", type=click.Choice(["trace", "report"]))
def schema_cmd(which: str) -> None:
    """Print the JSON Schema of the trace (YAML as parsed) or of the report."""
    doc = trace_schema() if which == "trace" else report_schema()
    click.echo(json.dumps(doc, indent=2))


@cli.command("engines")
def engines_cmd() -> None:
    """List the registered engine versions."""
    for v in VERSIONS.values():
        click.echo(f"{v.name:12} {v.description}")


def main() -> None:
    try:
        cli(standalone_mode=True)
    except BrokenPipeError:
        # `kpool replay ... | head`: the reader left; say nothing more
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except KeyboardInterrupt:
        click.echo("kpool: interrupted", err=True)
        sys.exit(130)
    except Exception as e:  # a bug in kpool, not in the input: no traceback, exit 2
        click.echo(f"kpool: internal error: {type(e).__name__}: {e}\n"
                   "Please report it with the trace that caused it "
                   "(KPOOL_TRACEBACK=1 shows where).", err=True)
        if os.environ.get("KPOOL_TRACEBACK"):
            raise
        sys.exit(EXIT_BAD_INPUT)
