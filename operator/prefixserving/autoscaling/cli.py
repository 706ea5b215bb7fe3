"""``prefixserving monitoring``: write or check the chart's alert, adapter and dashboard files."""

from __future__ import annotations

from pathlib import Path

import click

from prefixserving.autoscaling import chart

DEFAULT_CHART_DIR = "charts/prefixserving-operator"


@click.command()
@click.option(
    "--chart-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_CHART_DIR,
    show_default=True,
    help="The prefixserving-operator chart.",
)
@click.option("--check", is_flag=True, help="Only report files that are out of date (exit 1).")
def monitoring(chart_dir: Path, check: bool) -> None:
    """Write the chart's alert rules, prometheus-adapter rules and Grafana dashboard."""
    if not (chart_dir / "Chart.yaml").is_file():
        raise click.UsageError(f"{chart_dir}/Chart.yaml not found: pass --chart-dir <chart>")
    if check:
        stale = chart.drifted(chart_dir)
        for relative in stale:
            click.echo(f"out of date: {chart_dir / relative}", err=True)
        if stale:
            raise click.ClickException("run `prefixserving monitoring` and commit the files")
        return
    for path in chart.write(chart_dir):
        click.echo(f"wrote {path}")
