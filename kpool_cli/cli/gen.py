"""`kpool gen SCENARIO`: one command per scenario of gen/scenarios.py, its options the
scenario's sizes."""

from __future__ import annotations

import click

from ..gen.scenarios import SCENARIOS, Scenario
from ..trace.format import SEED_MAX
from .io import fail, open_output, refuse_outputs
from .options import Int


def _gen_command(scenario: Scenario) -> click.Command:
    """`kpool gen NAME`: its options are the scenario's sizes (gen/scenarios.py)."""

    def run(seed: int, output: str | None, **sizes: int) -> None:
        from ..report.text import write_trace
        from ..report.ticking import progress_bar

        refuse_outputs((), output=output)
        bar = progress_bar(0, f"kpool gen {scenario.name}", unit="ops")  # its delay: from now
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
    return click.Command(scenario.name, callback=run, params=params, help=scenario.help,
                         short_help=scenario.doc)


@click.group("gen")
def gen_cmd() -> None:
    """Write a generated trace (format v1): a seeded, deterministic scenario whose sizes
    are options; its description says how to regenerate it."""


for _scenario in SCENARIOS.values():
    gen_cmd.add_command(_gen_command(_scenario))
