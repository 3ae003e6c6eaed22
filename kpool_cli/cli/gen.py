"""`kpool gen SCENARIO`: one command per scenario of gen/scenarios.py, its options the
scenario's sizes."""

from __future__ import annotations

import click

from ..gen.scenarios import SCENARIOS, Scenario
from ..trace.format import SEED_MAX
from .io import fail, open_output, refuse_outputs
from .options import Int, quiet_option


def _gen_command(scenario: Scenario) -> click.Command:
    """`kpool gen NAME`: its options are the scenario's sizes (gen/scenarios.py)."""

    def run(seed: int, output: str | None, quiet: bool, **sizes: int) -> None:
        from ..report.text import write_trace
        from ..report.ticking import progress_bar

        refuse_outputs((), output=output)
        bar = progress_bar(0, f"kpool gen {scenario.name}", unit="ops",  # its delay: from now
                           quiet=quiet)
        try:
            trace = scenario.generate(seed, **sizes)
        except ValueError as e:
            fail(str(e))
        with open_output(output) as out, bar:
            write_trace(out, trace, bar)

    params: list[click.Parameter] = [
        click.Option(["--seed"], type=Int(0, SEED_MAX), default=0,
                     show_default=True, help="The seed: the same seed gives the same trace."),
        click.Option(["--output", "-o"], metavar="FILE",
                     help="Write the trace to FILE (whole or not at all) [default: stdout]."),
    ]
    params += [click.Option([size.option, size.name], type=Int(size.lo, size.hi),
                            default=size.default, show_default=True,
                            help=f"{size.doc}.")
               for size in scenario.sizes]
    return quiet_option(click.Command(scenario.name, callback=run, params=params,
                                      help=scenario.help, short_help=scenario.doc))


class _Scenarios(click.Group):
    """`kpool gen`'s commands are its scenarios, and it says so: `SCENARIO` in its
    usage, a `Scenarios` listing, and an unknown name answered with the scenarios
    (click says `COMMAND`, `Commands` and `No such command`)."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Scenarios"):
            formatter.write_dl([(name, s.doc) for name, s in SCENARIOS.items()])

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name = args[0]
        if (self.get_command(ctx, name) is None and not name.startswith("-")
                and not ctx.resilient_parsing):
            # the list on a line of its own: within 80 columns after `Error: `
            ctx.fail(f"No such scenario {name!r}. The scenarios are:\n  "
                     f"{', '.join(SCENARIOS)}")
        return super().resolve_command(ctx, args)


@click.group("gen", cls=_Scenarios, subcommand_metavar="SCENARIO [OPTIONS]")
def gen_cmd() -> None:
    """Write a generated trace (format v1).

    Each SCENARIO is seeded and deterministic, its sizes are its options (its
    --help lists them), and the trace's description says how to regenerate it."""


for _scenario in SCENARIOS.values():
    gen_cmd.add_command(_gen_command(_scenario))
