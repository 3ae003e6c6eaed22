"""`kpool explain`, `kpool schema`, `kpool engines`: what kpool knows, printed."""

from __future__ import annotations

import sys

import click

from ..contracts.report_format import check_schema, diff_schema, report_schema
from ..report.json_text import dumps
from ..trace.schema import trace_schema
from ..versions import VERSIONS
from ..wording import visible
from .io import fail, hanging


@click.command("explain")
@click.argument("code", required=False)
@click.option("--list", "list_codes", is_flag=True, help="List every finding code.")
@click.option("--color/--no-color", "color", default=None,
              help="Colour [default: on a terminal, unless NO_COLOR is set].")
def explain_cmd(code: str | None, list_codes: bool, color: bool | None) -> None:
    """Explain finding CODE: what it means and how to fix the engine.

    CODE is a code (KP001) or its name (scatter-race). Shown: what the finding
    flags, why it is harmful, a minimal trace that triggers it, and the fix."""
    from ..report.terminal import Manners, make_console
    from ..report.view import print_code_list, print_explanation
    from ..verdict.codes import CODES
    from ..verdict.explain import EXPLANATIONS, explain_text, resolve

    if list_codes and code is not None:
        fail("give a CODE (kpool explain KP001) or --list, not both")
    if not list_codes and code is None:
        fail("give a CODE (kpool explain KP001) or --list")
    manners = Manners.detect(sys.stdout, color=color)
    rich = manners.is_terminal or manners.color
    if list_codes:
        if rich:
            print_code_list(make_console(sys.stdout, manners))
        else:
            for c in CODES.values():
                click.echo(hanging(f"{c.code}  {c.name:16} {c.severity:8} ", c.summary))
        return
    found = resolve(code or "")
    if found is None:
        fail(f"unknown finding code {code!r}: known codes are {', '.join(CODES)} "
             "(kpool explain --list)")
    if rich:
        print_explanation(make_console(sys.stdout, manners), EXPLANATIONS[found])
    else:
        click.echo(explain_text(found), nl=False)


_SCHEMAS = {"trace": trace_schema, "report": report_schema, "check": check_schema,
            "diff": diff_schema}


@click.command("schema")
@click.argument("which", type=click.Choice(list(_SCHEMAS)))
def schema_cmd(which: str) -> None:
    """Print the JSON Schema of a trace, a report, check or diff JSON.

    \b
    trace   a trace, as its YAML parses
    report  a report of `kpool replay --format json`
    check   the output of `kpool check --output-format json`
    diff    the output of `kpool diff --format json`"""
    click.echo(dumps(_SCHEMAS[which](), indent=True))


@click.command("engines")
def engines_cmd() -> None:
    """List the engine versions, bases and patches.

    Each base and patch with the repository, file and commit it was read from; which
    bases a patch applies to, and what to use on the others; the shipped versions
    (what `--engine all` runs)."""
    from ..versions import BASE_ORIGINS, BASES, COMBINATIONS, PATCHES, applies_to, instead

    names = [*BASES, *PATCHES, *VERSIONS]
    width = max(len(name) for name in names)
    pad = " " * (width + 2)

    def row(name: str, *lines: str) -> None:
        """The name and its lines at the description's column; an origin (a repository
        path can be long) on lines of its own under the name."""
        click.echo(hanging(f"  {visible(name):{width}}  ", visible(lines[0])))
        for line in lines[1:]:
            lead = "      " if line.startswith("read from ") else f"  {pad}"
            click.echo(hanging(lead, visible(line)))

    click.echo("Bases (--engine BASE):")
    for name, base in BASES.items():
        row(name, base.description, f"read from {BASE_ORIGINS[name]}")
    click.echo("\nPatches (--engine BASE+PATCH[+PATCH...]):")
    for name, patch in PATCHES.items():
        bases = applies_to(patch)
        where = (f"applies to {', '.join(bases)}" if len(bases) < len(BASES)
                 else "applies to every base")
        # on a base it cannot apply to, its port or the patch it ports (`tail-truncate`
        # on rep-once: the shipped version of that name is its port, not this patch)
        others = [f"on {b}, {hint}" for b in BASES
                  if b not in bases and (hint := instead(b, name))]
        row(name, patch.description, f"{where}" + (f": {patch.why}" if patch.why else ""),
            *others, f"read from {patch.origin}")
    click.echo("\nShipped versions (--engine all):")
    for name in VERSIONS:
        if name in BASES:
            row(name, "the base")
        else:
            spec, what, origin = COMBINATIONS[name]
            row(name, *([f"= {spec}", what] if spec != name else [what]),
                *([f"read from {origin}"] if origin else []))
