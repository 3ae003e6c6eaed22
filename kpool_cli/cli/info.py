"""`kpool explain`, `kpool schema`, `kpool engines`: what kpool knows, printed."""

from __future__ import annotations

import json
import sys

import click

from ..contracts.report_format import report_schema
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
    """What finding CODE (KP001, or its name: scatter-race) means, why it is harmful, a
    minimal trace that triggers it, and how to fix the engine."""
    from ..report.terminal import Manners, make_console
    from ..report.view import print_code_list, print_explanation
    from ..verdict.codes import CODES
    from ..verdict.explain import EXPLANATIONS, explain_text, resolve

    if list_codes == (code is not None):
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


@click.command("schema")
@click.argument("which", type=click.Choice(["trace", "report", "check"]))
def schema_cmd(which: str) -> None:
    """Print the JSON Schema of the trace (YAML as parsed), of the report, or of
    `kpool check --output-format json`."""
    from ..contracts.report_format import check_schema

    doc = {"trace": trace_schema, "report": report_schema, "check": check_schema}[which]()
    click.echo(json.dumps(doc, indent=2))


@click.command("engines")
def engines_cmd() -> None:
    """List the registered engine versions."""
    width = max(len(name) for name in VERSIONS)
    for v in VERSIONS.values():
        click.echo(hanging(f"{visible(v.name):{width}}  ", visible(v.description)))
