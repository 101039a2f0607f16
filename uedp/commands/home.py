"""Looking into a data home: ``uedp sql`` (DuckDB over its tables), ``budget`` (the privacy ledger) and
``datasets``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from uedp.commands.common import HOME_OPTION, app, prepare_runtime, user_errors
from uedp.errors import UedpError

if TYPE_CHECKING:
    from uedp.services.privacy_budget import LedgerView


@app.command()
@user_errors
def sql(
    dataset: str = typer.Argument(..., help="An ingested dataset."),
    query: str = typer.Argument(..., help="DuckDB SQL over the dataset's views: sentences, users and (after "
                                "detection) entities."),
    home: Optional[Path] = HOME_OPTION,
) -> None:
    """Query a dataset's Parquet tables with DuckDB, with nothing else to install.

    Example: uedp sql conll "SELECT split, count(*) AS sentences FROM sentences GROUP BY split ORDER BY split"
    """
    data_home = prepare_runtime(home)
    import duckdb

    from uedp.storage.catalog import Catalog

    with Catalog(data_home, dataset) as catalog:
        try:
            relation = catalog.con.sql(query)
        except duckdb.Error as exc:
            raise UedpError(f"{str(exc).splitlines()[0]} (views: {', '.join(sorted(catalog.tables))})") from None
        typer.echo("done" if relation is None else str(relation).rstrip())


@app.command()
@user_errors
def budget(
    dataset: str = typer.Argument(..., help="A dataset in the data home."),
    home: Optional[Path] = HOME_OPTION,
    limit: Optional[float] = typer.Option(None, min=0, help="Set the dataset's budget: the epsilon each unit's composed "
                                          "total must stay within; a training or local-DP release that would exceed it "
                                          "is refused before it starts.", show_default=False),
    no_limit: bool = typer.Option(False, "--no-limit", help="Remove the dataset's budget."),
) -> None:
    """The privacy ledger of DATASET: every release from its private text (runs, local-DP releases), each
    unit's composed total, and the budget training must keep (set it with --limit).

    Each run's epsilon is for that run alone; the people in a dataset are exposed by all of them, so the
    releases of one unit compose (dp_accounting). Resuming a run, reusing a local-DP release, logging or
    attacking a trained model and --init-from add nothing.
    """
    data_home = prepare_runtime(home)
    from rich.console import Console
    from rich.table import Table

    from uedp.services import privacy_budget

    if limit is not None and no_limit:
        raise UedpError("give --limit or --no-limit, not both")
    if not data_home.dataset_dir(dataset).is_dir():
        raise UedpError(f"no dataset {dataset!r} in {data_home.root} (`uedp datasets` lists them)")
    ledger = privacy_budget.ledger_of(data_home, dataset)
    source = privacy_budget.derived_from(data_home, dataset)
    if source is not None and limit is not None:
        raise UedpError(f"{dataset!r} is a local-DP release of {source!r}: nothing trained on it is charged, so a "
                        f"budget here would hold nothing back; set it on the source: uedp budget {source} --limit "
                        f"{limit:g}")
    if limit is not None or no_limit:
        with ledger.editing() as editor:
            editor.set_limit(None if no_limit else limit)
    if source is not None:
        typer.echo(f"{dataset!r} is a local-DP release of {source!r}: training on it is post-processing of that release "
                   f"and costs nothing more. Its cost is in `uedp budget {source}`.")
    seen = privacy_budget.view(data_home, dataset)
    table = Table(title=f"{dataset}: privacy ledger ({ledger.path})")
    for column in ("when", "release", "mechanism", "unit [scope]", "epsilon", "delta", "status"):
        table.add_column(column, justify="right" if column in ("epsilon", "delta") else "left", overflow="fold")
    for entry in seen.entries:
        status = entry.status + (" (seeded)" if entry.randomness == privacy_budget.SEEDED else "")
        origin = seen.origin.get(entry.key, dataset)
        table.add_row(entry.when, f"{entry.name}\n{entry.key}" + (f"\n(on {origin!r})" if origin != dataset else ""),
                      entry.mechanism, entry.unit + (f" [{entry.scope}]" if entry.scope else ""),
                      "inf" if math.isinf(entry.epsilon) else f"{entry.epsilon:.4g}", f"{entry.delta:.3g}", status)
    Console(width=140).print(table)
    for line in _ledger_lines(dataset, seen):
        typer.echo(line)


def _ledger_lines(dataset: str, seen: LedgerView) -> list[str]:
    """What `uedp budget` says under the ledger's table: each unit's total, what no total includes, the budget."""
    from uedp.services import privacy_budget

    lines = [] if seen.entries else ["nothing released from this dataset's text yet"]
    others = sorted(set(seen.origin.values()) - {dataset})
    if others:
        lines.append(f"the same text is held by {', '.join(map(repr, others))} too (ingested under another name or "
                     "split): their releases expose the same people and are counted here")
    totals = privacy_budget.unit_totals(seen.entries)
    for total in totals:
        lines.append(f"{total.named}: epsilon {total.epsilon:.4g} at delta {total.delta:.3g} over {total.releases} "
                     "release(s), composed by dp_accounting")
        if total.mixed:
            lines.append("  its releases chose different categories or detections; they are composed into one total "
                         "because one entity can carry several categories (detectors disagree, homonyms share a unit). "
                         "An entity outside a run's categories is not protected by that run as an entity: it trains "
                         "there as ordinary text, like the text of another unit")
    without = [e for e in seen.entries if e.unit == privacy_budget.NO_UNIT or math.isinf(e.epsilon)]
    seeded = [e for e in seen.entries if privacy_budget.bounds_nothing(e) and e not in without]
    if without:
        lines.append(f"{len(without)} run(s) without a guarantee (noiseless, deid): their models are trained on this "
                     "text with no epsilon, so no total here bounds what someone who sees them learns")
    if seeded:
        lines.append(f"{len(seeded)} seeded release(s), not in any total: anyone who knows the seed (logged with each "
                     "run) can recompute the noise, so they bound nothing against them, and no total here bounds what "
                     "someone who sees them learns")
    if len(totals) > 1:
        lines.append("each total holds for its own unit; a person exposed by releases of several (a writer by a userdp "
                     "and a uedp run) has no single figure here, and a budget bounds each total, not their sum")
    if any(e.status == "reserved" for e in seen.entries):
        lines.append("reserved: a run still training, or one that stopped before it finished, counted at its planned "
                     "epsilon (running the same command again resumes it from its checkpoint, when it has one)")
    where = seen.limited_by or dataset
    lines.append(f"budget: epsilon {seen.limit:g} for each unit" + (f" (set on {where!r})" if where != dataset else "")
                 if seen.limit is not None else f"budget: none (set one: uedp budget {dataset} --limit EPSILON)")
    return lines


@app.command()
@user_errors
def datasets(home: Optional[Path] = HOME_OPTION) -> None:
    """List the datasets in the data home with their tables and row counts."""
    data_home = prepare_runtime(home)
    from uedp.storage.catalog import ingested_datasets
    from uedp.storage.tables import read_manifest

    complete = ingested_datasets(data_home)
    incomplete = [name for name in data_home.dataset_folders() if name not in complete]
    for dataset in complete:
        rows = {table: (read_manifest(data_home.table_dir(dataset, table)) or {}).get("rows")
                for table in ("sentences", "users", "entities")}
        typer.echo(f"{dataset}: " + " ".join(f"{table}={n}" for table, n in rows.items() if n is not None))
    if not complete:
        typer.echo(f"no datasets under {data_home.root}; try `uedp ingest` or `uedp demo`")
    for dataset in incomplete:
        typer.echo(f"not a dataset: {data_home.dataset_dir(dataset)} holds no complete sentences table (an ingest that "
                   f"was killed, or is still running); remove it with `rm -r {data_home.dataset_dir(dataset)}`", err=True)
