"""Getting text in and finding what is sensitive in it: ``uedp ingest``, ``detect``, ``entities``,
``sanitize`` (a local-DP release) and ``ner train``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from uedp.commands.common import (
    CONFIG_OPTION,
    HOME_OPTION,
    PRIVACY_DOC,
    SET_OPTION,
    STORE_HELP,
    app,
    csv_list,
    prefect_api,
    prepare_runtime,
    user_errors,
)
from uedp.commands.config_options import LISTED, SANITIZE_OPTIONS
from uedp.detection.categories import DEFAULT_CATEGORIES
from uedp.errors import UedpError
from uedp.options import derived_parameters, list_fields, merged, with_options
from uedp.services.sanitize_config import SanitizeConfig


def _ingest_settings() -> tuple[list[Any], set[str], str, str]:
    """``uedp ingest``'s flags, derived from the ingest settings' model (each defined once, there, with its help,
    default and checks); which of them are comma-separated; the help of FORMAT (from the format registry) and of
    --split-of (a repeatable option of its own, so not derived). Imported here, not at the top, to keep
    storage out of the CLI's import block."""
    from uedp.storage.formats.registry import formats
    from uedp.storage.ingest import IngestOptions

    formats_help = "The corpus format. " + "; ".join(f"{name}: {f.summary}" for name, f in formats().items()) + "."
    return (derived_parameters([IngestOptions], skip={"format", "split_of"}), list_fields(IngestOptions),
            formats_help, IngestOptions.model_fields["split_of"].description or "")


INGEST_OPTIONS, INGEST_LISTED, FORMATS_HELP, SPLIT_OF_HELP = _ingest_settings()

# The ingest flow's settings that are not reading options (what to read, where the tables go): the rest is checked
# as IngestOptions before Prefect is imported (tests/test_format_registry.py keeps this equal to the flow's own).
INGEST_FLOW_FIELDS = ("home", "dataset", "files", "store", "public")


@app.command()
@user_errors
@with_options(INGEST_OPTIONS)
def ingest(
    format: str = typer.Argument(..., help=FORMATS_HELP, show_default=False),
    paths: list[str] = typer.Argument(..., help="Input files, folders (their files of FORMAT, sorted) or fsspec URLs "
                                      "(s3://raw/eng.train); .gz, .bz2 and .xz are read transparently."),
    name: str = typer.Option(..., "--name", help="Dataset name (a folder under the data home)."),
    split_of: Optional[list[str]] = typer.Option(None, "--split-of", metavar="FILE=SPLIT", help=SPLIT_OF_HELP,
                                                 show_default=False),
    store: Optional[str] = typer.Option(None, help=STORE_HELP),
    public: Optional[str] = typer.Option(None, "--public", metavar="WHY", show_default=False, help=(
        "Declare the dataset public, saying why (its source: 'Reuters-21578, public 1987 news'): a search's proxy "
        "or a pretraining corpus. Its runs and local-DP releases are charged to no privacy ledger and their "
        "statements name the declaration; refused while a private dataset of the home holds the same text. "
        "Ingesting without it makes the dataset private again.")),
    home: Optional[Path] = HOME_OPTION,
    config_file: Optional[Path] = CONFIG_OPTION,
    set_: Optional[list[str]] = SET_OPTION,
    **settings: Any,
) -> None:
    """Turn corpus files into the dataset's Parquet `sentences` and `users` tables (DuckDB-queryable).

    Re-ingesting unchanged inputs with the same options is a no-op that says so; a bad line anywhere
    is reported as FILE:LINE and leaves no partial table. Every setting is a flag (defaults shown below),
    a key of --config, or --set key=value.
    """
    data_home = prepare_runtime(home)
    from uedp.storage.home import validate_dataset_name
    from uedp.storage.ingest import IngestOptions, check_local_inputs

    values = merged(config_file, {**settings, "split_of": split_of or None, "store": store, "public": public}, set_,
                    INGEST_LISTED)
    # The settings and the local files are checked before Prefect and the flow are imported (seconds).
    validate_dataset_name(name)
    # Every setting but the flow's own is a reading option; an unknown one is refused here as the flow's form would.
    IngestOptions.model_validate({k: v for k, v in values.items() if k not in INGEST_FLOW_FIELDS} | {"format": format})
    check_local_inputs(list(paths), format)
    from uedp.flows.ingest import IngestConfig, ingest_flow

    # The command line's FORMAT, files and --name win over a config file's.
    config = IngestConfig(**{**values, "format": format, "files": list(paths), "dataset": name,
                             "home": str(data_home.root)})  # validated here, before any work starts
    with prefect_api(data_home):
        result = ingest_flow(config, progress=True)
    if result.reused:
        typer.echo(f"{name}: inputs and options unchanged, reused the existing tables (nothing redone)")
    for folder, names in result.folders.items():
        typer.echo(f"{folder}: {len(names)} {format} file(s): {', '.join(names)}")
    splits = ", ".join(f"{s} {result.per_split[s]}" for s in ("train", "valid", "test") if result.per_split.get(s))
    typer.echo(f"{name}: {result.sentences} sentences ({splits}), {result.users} users "
               f"[users = {config.user_strategy}]")
    typer.echo(f"tables: {data_home.dataset_dir(name)}/{{sentences,users}}/data.parquet")
    for line in result.public.splitlines():  # the declaration made or withdrawn; a warning on stderr
        typer.echo(line, err=line.startswith("warning:"))
    for warning in (result.warning, result.user_warning):
        if warning:
            typer.echo(f"warning: {warning}", err=True)


@app.command()
@user_errors
def detect(
    dataset: str = typer.Argument(..., help="An ingested dataset."),
    home: Optional[Path] = HOME_OPTION,
    detector: str = typer.Option("gold", help="Comma-separated detectors: gold, spacy, presidio."),
    spacy_model: Optional[str] = typer.Option(None, help="spaCy pipeline: installed package (en_core_web_lg) or folder."),
    presidio_entities: Optional[str] = typer.Option(None, help="Presidio entity types to ask for (default: all)."),
    recognizers: Optional[Path] = typer.Option(None, help="YAML file of extra recognizers (Presidio's format: regex, "
                                               "deny lists), added to Presidio's and uedp's own."),
    default_recognizers: bool = typer.Option(True, help="uedp's recall-first recognizers (phone, e-mail, card, IBAN, "
                                             "SSN, IP and URL shapes, valid or not; detection/recognizers.yaml)."),
    score_threshold: float = typer.Option(0.4, help="Drop Presidio results scored below this."),
    label: Optional[list[str]] = typer.Option(
        None, "--label", metavar="LABEL=CATEGORY", show_default=False, help="Map a corpus' or recognizer's label "
        "outside the taxonomy onto a category (group=ORG, creative-work=WORK_OF_ART), or add a category of that "
        "name (TRACKING_NUMBER=TRACKING_NUMBER); repeatable. Saved to the data home's labels.yaml (which you may "
        "edit too), so later commands (entities, train --categories) know the same names."),
    workers: int = typer.Option(1, help="Worker processes for the spaCy + Presidio pass (each loads the pipeline)."),
    batch_size: int = typer.Option(256, help="Texts per nlp.pipe batch."),
    shard_rows: Optional[int] = typer.Option(None, help="Scale out: cut the corpus into shards of N sentences, "
                                             "detect them as parallel tasks, then merge (same table)."),
    runner: str = typer.Option("dask", help="Shards run on: dask (worker processes, or --dask-address) or threads."),
    dask_address: Optional[str] = typer.Option(None, help="Scheduler of an existing Dask cluster (tcp://host:8786); "
                                               "default: a local cluster of --dask-workers processes."),
    dask_workers: int = typer.Option(2, help="Worker processes of the local Dask cluster."),
    store: Optional[str] = typer.Option(None, help=STORE_HELP),
    ignore_entities: Optional[Path] = typer.Option(
        None, "--ignore-entities", metavar="FILE", help="Text file of surfaces that are not entities (detector false "
        "positives such as a greeting or <unk>), dropped from the entities table: one a line, or 'CATEGORY: surface' "
        "to drop it in that category only; '#' starts a comment line, blank lines are skipped. Matched "
        "case-insensitively, whitespace collapsed (as entities are identified). Part of the detection cache key. "
        "Listed surfaces are not protected as entities (each training run's caveats say how many)."),
) -> None:
    """Find sensitive entities in every sentence and write the dataset's `entities` table.

    Detection is cached by corpus content and detector configuration; choosing other categories later
    (`uedp entities`, `uedp demo --categories`) is a query and never re-runs it.
    """
    data_home = prepare_runtime(home)
    from uedp.detection.pipeline import DetectorConfig

    if label:  # saved (atomically) before detecting, so every later command resolves the same names
        from uedp.detection.categories import parse_label_option, save_labels

        tax = save_labels(data_home.labels_file, label)
        mapped = ", ".join(f"{name} -> {tax.canonical_of(name)}" for name, _ in map(parse_label_option, label))
        typer.echo(f"labels: {mapped} (saved to {data_home.labels_file})")
    config = DetectorConfig(
        detectors=csv_list(detector), spacy_model=spacy_model, presidio_entities=csv_list(presidio_entities) or None,
        recognizers=str(recognizers) if recognizers else None, score_threshold=score_threshold, workers=workers,
        batch_size=batch_size, default_recognizers=default_recognizers,
        ignore_entities=str(ignore_entities.resolve()) if ignore_entities else None,
    )
    from uedp.storage.catalog import require_tables

    require_tables(data_home, dataset, store)
    from uedp.flows.detect import ScaleOut, detect_flow  # Prefect, spaCy, Presidio (seconds): after the input

    scale_out = ScaleOut(rows_per_shard=shard_rows, runner=runner, dask_address=dask_address,
                         dask_workers=dask_workers, store=store)
    with prefect_api(data_home):
        result = detect_flow(dataset, config, home=str(data_home.root), progress=True, scale_out=scale_out)
    verb = "reused (same corpus and detector configuration)" if result.reused else "wrote"
    shards = f" in {result.shards} shards" if result.shards > 1 else ""
    typer.echo(f"{dataset}: {verb} {result.entities} entity spans from {result.detector}{shards}")
    _print_common_entities(data_home, dataset)


def _print_common_entities(data_home: Any, dataset: str) -> None:
    """The entities held by the most users, and a warning for each held by too many (likely false positives).
    Entity text and exact counts: printed to this terminal only, never logged (docs/PRIVACY.md, rule 2)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from uedp.services.detect import SHARED_ENTITY_WARNING, entity_checks

    checks = entity_checks(data_home, dataset)
    if checks is None or not checks.common:
        return
    table = Table(title=f"{dataset}: entities held by the most users", caption="entity text: this terminal only")
    for column in ("category", "surface", "users", "share of users"):
        table.add_column(column, justify="right" if column in ("users", "share of users") else "left")
    for e in checks.common:
        table.add_row(e.category, escape(e.surface), f"{e.users} of {e.of_users}", f"{e.share:.1%}")
    Console(width=120).print(table)
    for warning in checks.warnings():
        typer.echo(f"warning: {warning}", err=True)
    if checks.widespread:
        typer.echo(f"(warned above {SHARED_ENTITY_WARNING:.0%} of users; real CoNLL-2003 entities reach 12%)", err=True)


@app.command()
@user_errors
@with_options(SANITIZE_OPTIONS)
def sanitize(
    dataset: str = typer.Argument(..., help="An ingested dataset (detected too, for --keep non-entities)."),
    seeded: bool = typer.Option(False, "--seeded", help="Draw from --seed instead of OS randomness: reproducible, and "
                                "the release gives no guarantee against anyone who knows the seed."),
    home: Optional[Path] = HOME_OPTION,
    config_file: Optional[Path] = CONFIG_OPTION,
    set_: Optional[list[str]] = SET_OPTION,
    **settings: Any,
) -> None:
    """Rewrite the train split of DATASET under local DP (the thesis' CusText or SanText) into a new dataset;
    valid and test stay original. Train it like any dataset (noiselessly: the text itself is private) and
    compare it in MLflow with the other mechanisms. Prints the per-token and per-record epsilon."""
    data_home = prepare_runtime(home)
    values = merged(config_file, settings, set_, LISTED) | ({"randomness": "seeded"} if seeded else {})
    config = SanitizeConfig(**{**values, "dataset": dataset})
    from uedp.storage.catalog import require_ingested

    require_ingested(data_home, dataset)
    from uedp.flows.sanitize import sanitize_flow  # torch and Prefect (seconds): after the input is checked
    from uedp.privacy.sanitization.release import local_dp_kind
    with prefect_api(data_home):
        result = sanitize_flow(config, home=str(data_home.root), progress=True)
    verb = "reused (same source and settings: the same release)" if result.reused else "wrote"
    typer.echo(f"{result.dataset}: {verb}")
    typer.echo(f"  {result.statement}")
    typer.echo(f"  per-record epsilon: median {result.record_epsilon_median:.4g}, max {result.record_epsilon_max:.4g}; "
               f"per-user max {result.user_epsilon_max:.4g}")
    typer.echo(f"  train tokens {result.tokens}: sanitized {result.sanitized_share:.1%}, unchanged after sanitizing "
               f"{result.unchanged_share:.1%} (of sanitized: {result.sanitized_unchanged_share:.1%}), "
               f"without embedding {result.unknown_share:.1%}")
    if result.mask_inference_success is not None:
        typer.echo(f"  mask-token inference attack: {result.mask_inference_success:.1%} of tokens recovered "
                   f"({result.mask_inference_success_sanitized:.1%} of sanitized ones; on the original text "
                   f"{result.mask_inference_success_original:.1%})")
    if local_dp_kind(config.mechanism).has_output_sets:
        typer.echo(f"  vocabulary tokens with no adjacent token (type 1-N, no guarantee): {result.unprotected_share:.1%}")
    for caveat in result.caveats:
        typer.echo(f"  not covered: {caveat}")
    typer.echo(f"  what this means: {PRIVACY_DOC}")
    typer.echo(f"train it: uedp train {result.dataset} --mechanism noiseless")


ner_app = typer.Typer(help="A spaCy NER of your own, trained offline from gold entity tags.", no_args_is_help=True)


app.add_typer(ner_app, name="ner")


@ner_app.command("train")
@user_errors
def ner_train(
    dataset: str = typer.Argument(..., help="An ingested dataset with gold entity tags (CoNLL-2003)."),
    out: Optional[Path] = typer.Option(None, help="Pipeline folder to write (default: <home>/models/ner-DATASET)."),
    epochs: int = typer.Option(15, min=1, help="Passes over the train split (about 23 s each on CoNLL-2003, 2 CPU cores)."),
    max_minutes: float = typer.Option(10.0, min=0, help="Stop after the first epoch that ends past this (0: no limit)."),
    seed: int = typer.Option(0, help="Seed of initialisation and shuffling."),
    train_split: str = typer.Option("train", help="The split it learns from: train, or valid to detect this same dataset "
                                    "with it (a NER fitted to a dataset's train split may not detect that dataset: "
                                    "its spans would depend on other users' text)."),
    home: Optional[Path] = HOME_OPTION,
) -> None:
    """Train spaCy's NER on a split's gold tags (CPU, nothing downloaded), print each epoch's loss and F1
    on the valid split (when it learns from train), then exact-span precision/recall/F1 per category on the
    test split, and save a pipeline folder that `uedp detect --spacy-model FOLDER` loads: for another
    corpus, or, trained on the valid split, for this one."""
    if train_split not in ("train", "valid"):
        raise UedpError(f"--train-split {train_split}: train or valid (the test split scores the NER)")
    data_home = prepare_runtime(home)
    from rich.console import Console
    from rich.table import Table

    from uedp.services.ner import train_dataset_ner

    def progress(report) -> None:  # type: ignore[no-untyped-def]
        dev = f", F1 on valid {report.dev_f1:.3f}" if report.dev_f1 is not None else ""
        typer.echo(f"epoch {report.epoch}/{epochs}: loss {report.loss:.1f}{dev} ({report.seconds:.0f} s)")

    typer.echo(f"training a spaCy NER on {dataset}'s gold tags ({train_split} split; at most {epochs} epochs"
               + (f", {max_minutes:g} min)" if max_minutes else ")"))
    result = train_dataset_ner(data_home, dataset, out, epochs=epochs, max_minutes=max_minutes or None, seed=seed,
                               on_epoch=progress, train_split=train_split,
                               dev_split="valid" if train_split != "valid" else "")
    if result.stopped:
        typer.echo(result.stopped)
    table = Table(title=f"held-out test split: exact-span scores after {result.epochs} epochs ({result.seconds:.0f} s)")
    for column in ("category", "precision", "recall", "F1"):
        table.add_column(column, justify="left" if column == "category" else "right")
    for label, s in result.per_label.items():
        table.add_row(label, f"{s.precision:.3f}", f"{s.recall:.3f}", f"{s.f1:.3f}")
    o = result.overall
    table.add_row("all", f"{o.precision:.3f}", f"{o.recall:.3f}", f"{o.f1:.3f}")
    Console(width=100).print(table)
    on = "DATASET" if train_split == "train" else dataset
    typer.echo(f"pipeline: {result.path}   (use it: uedp detect {on} --detector spacy,presidio "
               f"--spacy-model {result.path}" + (f"; not on {dataset}, whose train split it learnt from)"
                                                 if train_split == "train" else ")"))


@app.command()
@user_errors
def entities(
    dataset: str = typer.Argument(..., help="A dataset with an entities table."),
    home: Optional[Path] = HOME_OPTION,
    categories: Optional[str] = typer.Option(None, show_default=False, help="Categories, aliases (PER) or composites "
                                             "(PII, PLACE, CONTACT) (default: the categories `uedp train` treats as "
                                             f"sensitive, {','.join(sorted(DEFAULT_CATEGORIES))})"),
    coverage: bool = typer.Option(False, help="Precision/recall of each automatic detector against gold tags, per "
                                  "split (train, valid, test, and valid+test: the held-out figures an epsilon's "
                                  "recall rests on); a split a `uedp ner train` NER learnt from is marked as its own "
                                  "training split."),
    common: bool = typer.Option(False, "--common", help="Also list the entities held by the most users (all "
                                "categories; entity text, this terminal only) and warn about those held by so many "
                                "that they are likely detector false positives: what `uedp detect` printed."),
) -> None:
    """How many entities, sensitive sentences and users each category covers (UeDP paper, Table II).

    Prints counts only, never entity text, except the --common listing (to this terminal only).
    """
    data_home = prepare_runtime(home)
    from rich.console import Console
    from rich.table import Table

    from uedp.detection.categories import default_categories, taxonomy
    from uedp.storage.catalog import Catalog

    chosen = taxonomy(data_home.labels_file).resolve(categories or default_categories())
    if categories is None:
        typer.echo(f"categories: {','.join(chosen)} (the default of uedp train and uedp entities; --categories to choose)")
    console = Console(width=120)
    with Catalog(data_home, dataset) as catalog:
        table = Table(title=f"{dataset}: entities by category")
        for column in ("category", "entities", "sensitive sentences", "users"):
            table.add_column(column, justify="left" if column == "category" else "right")
        for row in catalog.category_counts(chosen):
            table.add_row(row.category, str(row.entities), str(row.sentences), str(row.users))
        console.print(table)
        totals = catalog.totals(chosen)
        typer.echo(", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in totals.items()))
        if coverage:
            detectors = catalog.detectors()
            if "gold" not in detectors:
                raise UedpError(f"dataset {dataset!r} has no gold entities to compare with; detect with --detector gold,...")
            from uedp.services.coverage import coverage_by_split

            cov = Table(title=f"{dataset}: detectors against gold tags (CoNLL classes), per split")
            for column in ("detector", "split", "class", "gold", "predicted", "exact", "precision", "recall",
                           "overlap recall"):
                cov.add_column(column, justify="left" if column in ("detector", "split", "class") else "right")
            figures = coverage_by_split(data_home, dataset)
            for f in figures:
                cov.add_row(f.detector, f.split_label, f.cls, str(f.gold), str(f.predicted), str(f.exact),
                            f"{f.precision:.3f}", f"{f.recall:.3f}", f"{f.overlap_recall:.3f}")
            console.print(cov)
            typer.echo("the recall an entity-level epsilon rests on is measured on valid+test (held-out)"
                       + ("; figures on the NER's own training split overstate it" if any(f.own_training_split
                                                                                         for f in figures) else ""))
    if common:
        _print_common_entities(data_home, dataset)
