"""The ``uedp`` commands (the entry point, :mod:`uedp.cli`, imports this module only when a command runs).
Every command has ``--help``; bad input prints one line and exits 2.

Prefect and the flows are imported inside commands, after the data home and Prefect's settings are
known, because Prefect reads its settings at import time.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, TypeVar

import typer

from uedp.detection.categories import DEFAULT_CATEGORIES
from uedp.errors import UedpError
from uedp.options import CONFIG_HELP, SET_HELP, default_of, derived_parameters, list_fields, merged, with_options
from uedp.privacy.mechanisms import registry
from uedp.services.config import DemoConfig, MechanismSettings, RunSettings, SanitizeConfig, SweepConfig, TrainConfig
from uedp.services.pretrain import PretrainConfig

if TYPE_CHECKING:
    from uedp.services.privacy_budget import LedgerView

app = typer.Typer(
    name="uedp",
    help="Train language models on private text with user-, entity- and token-level differential privacy.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

F = TypeVar("F", bound=Callable[..., Any])

STORE_HELP = ("fsspec URL of a table store shared by several machines (s3://bucket/uedp, gs://..., file:///mnt/uedp): "
              "tables are read from and published to it; the local data home caches them.")
PROCESSES_HELP = ("torchrun processes for this training, one per GPU: each trains a share of every round's users "
                  "or examples (dpsgd: the same model as one process; userdp/uedp: the same epsilon).")
SEEDED_OPTION = typer.Option(False, "--seeded", help="Draw sampling and noise from --seed instead of the operating "
                             "system: reproducible, for tests and demos. The guarantee does not hold against anyone who "
                             "knows the seed; the run is tagged uedp.randomness=seeded.")
PRIVACY_DOC = "docs/PRIVACY.md"
HOME_OPTION = typer.Option(None, "--home", help="Data home (default: $UEDP_HOME or ./.uedp).", show_default=False)
CONFIG_OPTION = typer.Option(None, "--config", help=CONFIG_HELP, show_default=False)
SET_OPTION = typer.Option(None, "--set", help=SET_HELP, show_default=False)
MECHANISMS_HELP = ", ".join(registry.names())
ALIASES = {"model_size": ["--model-config"], "strategy": ["--sanitize-strategy"]}
# Every shared run setting and every mechanism parameter is a flag of train (and of sweep); its default
# and help come from the configuration models, where each is defined once.
TRAIN_OPTIONS = derived_parameters([RunSettings, TrainConfig, MechanismSettings], skip={"dataset", "params"},
                                   aliases=ALIASES)
SWEEP_OPTIONS = derived_parameters([RunSettings, MechanismSettings], aliases=ALIASES)
DEMO_OPTIONS = derived_parameters([MechanismSettings], aliases=ALIASES)
PLAN_OPTIONS = derived_parameters([MechanismSettings], skip={"embeddings", "k", "mapping", "metric", "strategy", "keep",
                                                             "vocab_limit", "attack_model", "epsilon"})
SANITIZE_OPTIONS = derived_parameters([SanitizeConfig], skip={"dataset", "randomness"}, aliases=ALIASES)
PRETRAIN_OPTIONS = derived_parameters([PretrainConfig], skip={"home", "files", "eval_files"},
                                      aliases={"dataset": ["--name"]})
LISTED = list_fields(RunSettings, TrainConfig, MechanismSettings, SanitizeConfig)


INTERRUPTED = ("interrupted (Ctrl-C). Run the same command again: finished work is reused, and a training resumes "
               "from its last checkpoint in the same MLflow run (--checkpoint-every sets how often one is saved)")


def _one_line(exc: BaseException) -> str:
    """A single readable line for errors users can fix (pydantic errors name the field)."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        # Settings may sit in nested blocks (params.<mechanism>, settings, run): name the setting itself.
        loc = [str(p) for p in first.get("loc", ())]
        while len(loc) > 1 and loc[0] in ("params", "settings", "run", *registry.names()):
            loc = loc[1:]
        field = ".".join(loc) or "input"
        message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        return f"invalid {field}: {message}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def user_errors(command: F) -> F:
    """Turn errors caused by bad input into ``error: ...`` on stderr and exit code 2."""
    from pydantic import ValidationError

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (UedpError, ValidationError) as exc:
            typer.echo(f"error: {_one_line(exc)}", err=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            typer.echo(f"\n{INTERRUPTED}", err=True)
            raise  # typer exits with 130, as a shell does for Ctrl-C

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def prefect_api(home: Any) -> Iterator[str]:
    """The Prefect API a command's flows run against (a temporary one of uedp's own when none is set)."""
    from uedp.prefect_server import prefect_api as api

    with api(home) as url:
        yield url


def _prepare_runtime(home_override: Optional[Path]):  # type: ignore[no-untyped-def]
    """Resolve the data home and point Prefect at it (no server needed) before Prefect is imported."""
    from uedp.storage.home import DataHome

    home = DataHome.from_env(home_override)
    if "PREFECT_API_URL" not in os.environ:
        os.environ.setdefault("PREFECT_HOME", str(home.prefect_home))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Without a server nobody reads Prefect's run logs; the CLI prints its own summary and a one-line
    # error, so keep Prefect's console from repeating failures as tracebacks. With a server, log fully.
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "CRITICAL" if "PREFECT_API_URL" not in os.environ else "INFO")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Categories named in a configuration (train --categories) resolve with this home's labels file, here and in
    # the processes a command starts (torchrun, workers): detection/categories.py reads it where no home is at hand.
    os.environ["UEDP_LABELS"] = str(home.labels_file)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # transformers' "Loading weights" / "Writing model shards" bars on every logged model: uedp reports its own.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # MLflow announces creating and migrating its SQLite store on every first use: not the user's business.
    for noisy in ("mlflow.store.db.utils", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return home


def _print_version(value: bool) -> None:
    """Runs while the options are parsed, before Click asks for a command (so `uedp --version` alone works)."""
    if value:
        from uedp import __version__

        typer.echo(f"uedp {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True,
                                 callback=_print_version),
) -> None:
    """uedp: user- and entity-level DP training of language models, as one Prefect + MLflow pipeline."""


def _csv(value: str | None) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``."""
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def _fmt(value: float, digits: int = 3) -> str:
    return "inf" if math.isinf(value) else f"{value:.{digits}g}"


@app.command()
@user_errors
@with_options(DEMO_OPTIONS)
def demo(
    home: Optional[Path] = HOME_OPTION,
    mechanisms: Optional[str] = typer.Option(None, help="Comma-separated mechanisms to train: "
                                             f"{MECHANISMS_HELP} {default_of(DemoConfig, 'mechanisms')}",
                                             show_default=False),
    categories: Optional[str] = typer.Option(None, help="Entity categories treated as sensitive (names, aliases such "
                                             "as PER, or composites such as PII) "
                                             f"{default_of(DemoConfig, 'categories')}", show_default=False),
    seed: Optional[int] = typer.Option(None, help="Seed for data splits, initialisation, sampling and noise "
                                       f"{default_of(DemoConfig, 'seed')}", show_default=False),
    secure: bool = typer.Option(False, "--secure", help="Draw sampling and noise from the operating system (as "
                                "`uedp train` does by default) instead of --seed: results then differ run to run."),
    device: Optional[str] = typer.Option(None, help=f"auto, cpu, cuda or cuda:N {default_of(DemoConfig, 'device')}",
                                         show_default=False),
    config_file: Optional[Path] = CONFIG_OPTION,
    set_: Optional[list[str]] = SET_OPTION,
    **settings: Any,
) -> None:
    """Run the whole pipeline on the bundled demo corpus: ingest, detect, train, evaluate, log to MLflow.

    Needs no server, network or GPU (uses one when present). A second run reuses the ingested data. The
    demo is seeded so its table is reproducible: its guarantee does not hold against anyone who knows
    the seed (the runs are tagged so); use --secure for real randomness. Every mechanism parameter is a
    flag (--rounds, --q-user, ...) or --set key=value.
    """
    data_home = _prepare_runtime(home)
    from uedp.flows.demo import demo_flow
    from uedp.services.tracking import dataset_link

    given = {"mechanisms": _csv(mechanisms) if mechanisms else None, "categories": categories, "seed": seed,
             "device": device, "randomness": "secure" if secure else None}
    values = merged(config_file, settings, set_, LISTED) | {k: v for k, v in given.items() if v is not None}
    config = DemoConfig(**{**values, "home": str(data_home.root)},
    )
    from uedp.services.launch import check_before_training

    check_before_training(config.train_configs(), config.device)
    typer.echo(f"uedp demo: data home {data_home.root}")
    with prefect_api(data_home):
        outcome = demo_flow(config)
    ing, det = outcome.ingest, outcome.detect
    typer.echo(
        f"ingest: {'reused existing' if ing.reused else 'ingested'} dataset {ing.dataset!r} "
        f"({ing.sentences} sentences, {ing.users} users){' - inputs unchanged, nothing redone' if ing.reused else ''}"
    )
    typer.echo(f"detect: {'reused' if det.reused else 'wrote'} {det.entities} {det.detector} entity spans")
    _print_summary(outcome.runs)
    typer.echo(f"\nBrowse the runs:  {dataset_link(data_home, ing.dataset)}")


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


@app.command()
@user_errors
@with_options(INGEST_OPTIONS)
def ingest(
    format: str = typer.Argument(..., help=FORMATS_HELP, show_default=False),
    paths: list[str] = typer.Argument(..., help="Input files or fsspec URLs (s3://raw/eng.train); .gz, .bz2 and .xz "
                                      "are read transparently."),
    name: str = typer.Option(..., "--name", help="Dataset name (a folder under the data home)."),
    split_of: Optional[list[str]] = typer.Option(None, "--split-of", metavar="FILE=SPLIT", help=SPLIT_OF_HELP,
                                                 show_default=False),
    store: Optional[str] = typer.Option(None, help=STORE_HELP),
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
    data_home = _prepare_runtime(home)
    from uedp.flows.ingest import IngestConfig, ingest_flow

    values = merged(config_file, {**settings, "split_of": split_of or None, "store": store}, set_, INGEST_LISTED)
    # The command line's FORMAT, files and --name win over a config file's.
    config = IngestConfig(**{**values, "format": format, "files": list(paths), "dataset": name,
                             "home": str(data_home.root)})  # validated here, before any work starts
    with prefect_api(data_home):
        result = ingest_flow(config, progress=True)
    if result.reused:
        typer.echo(f"{name}: inputs and options unchanged, reused the existing tables (nothing redone)")
    splits = ", ".join(f"{s} {result.per_split[s]}" for s in ("train", "valid", "test") if result.per_split.get(s))
    typer.echo(f"{name}: {result.sentences} sentences ({splits}), {result.users} users "
               f"[users = {config.user_strategy}]")
    typer.echo(f"tables: {data_home.dataset_dir(name)}/{{sentences,users}}/data.parquet")
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
    data_home = _prepare_runtime(home)
    from uedp.detection.pipeline import DetectorConfig
    from uedp.flows.detect import ScaleOut, detect_flow

    if label:  # saved (atomically) before detecting, so every later command resolves the same names
        from uedp.detection.categories import parse_label_option, save_labels

        tax = save_labels(data_home.labels_file, label)
        mapped = ", ".join(f"{name} -> {tax.canonical_of(name)}" for name, _ in map(parse_label_option, label))
        typer.echo(f"labels: {mapped} (saved to {data_home.labels_file})")
    config = DetectorConfig(
        detectors=_csv(detector), spacy_model=spacy_model, presidio_entities=_csv(presidio_entities) or None,
        recognizers=str(recognizers) if recognizers else None, score_threshold=score_threshold, workers=workers,
        batch_size=batch_size, default_recognizers=default_recognizers,
        ignore_entities=str(ignore_entities.resolve()) if ignore_entities else None,
    )
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
    data_home = _prepare_runtime(home)
    from uedp.flows.sanitize import sanitize_flow
    from uedp.privacy.sanitization.release import local_dp_kind

    values = merged(config_file, settings, set_, LISTED) | ({"randomness": "seeded"} if seeded else {})
    config = SanitizeConfig(**{**values, "dataset": dataset})
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
    data_home = _prepare_runtime(home)
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
    data_home = _prepare_runtime(home)
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


@app.command()
@user_errors
@with_options(PLAN_OPTIONS)
def epsilon(
    mechanism: str = typer.Option(..., help="A mechanism with a planner: "
                                  + ", ".join(n for n, spec in registry.mechanisms().items() if spec.plan) + "."),
    users: int = typer.Option(..., "--users", "--units", min=1, help="Number of privacy units: training users "
                              "(userdp; for uedp the writers with a sentence that names no detected entity) or "
                              "sequences (dpsgd)."),
    count_public: bool = typer.Option(False, "--count-public", help="Plan a run that declares the number of units "
                                      "public (--public-count); default: training's DP count, composed in."),
    count_noise: Optional[float] = typer.Option(None, "--count-noise", help="Noise std of that DP count "
                                                f"\\[default: {RunSettings.model_fields['count_noise'].default}]",
                                                show_default=False),
    choose_sampling: bool = typer.Option(False, "--choose-sampling", help="userdp, uedp-bounded, uedp with a "
                                         "target epsilon: choose --q-user and --rounds, the split of the compute "
                                         "budget (--user-updates) with the least noise-to-signal, and plan that."),
    user_updates: Optional[float] = typer.Option(None, "--user-updates", min=1, help="--choose-sampling: the compute "
                                                 "budget, rounds x expected users a round \\[default: the "
                                                 "configuration's, rounds x q_user x users]", show_default=False),
    config_file: Optional[Path] = CONFIG_OPTION,
    set_: Optional[list[str]] = SET_OPTION,
    **settings: Any,
) -> None:
    """Plan a privacy budget without training: epsilon for a noise multiplier, or z for a target epsilon.

    Reads the same defaults as training (every mechanism parameter is a flag or --set key=value). With
    --choose-sampling the planner chooses a user-level run's sampling rate and rounds for its budget.

    Example: uedp epsilon --mechanism uedp --users 946 --q-user 0.05 --q-entity 0.05 --rounds 500 --noise-multiplier 2
    """
    from uedp.privacy.accounting import check_delta
    from uedp.privacy.population import COUNTED_IN_WORDS, Population

    spec = registry.get(mechanism) if mechanism in registry.names() else None
    if spec is None or spec.plan is None:
        raise UedpError(f"unknown mechanism {mechanism!r} for planning; valid: "
                        + ", ".join(n for n, s in registry.mechanisms().items() if s.plan))
    values = {k: v for k, v in merged(config_file, settings, set_, LISTED).items()
              if k in MechanismSettings.model_fields or k == "steps"}  # a file may hold run settings too
    if values.get("noise_multiplier") is not None and values.get("target_epsilon") is not None:
        raise UedpError("give at most one of --noise-multiplier and --target-epsilon")
    # Strict: a parameter this mechanism does not take is an error, not a silently different plan.
    params = TrainConfig(**{**values, "dataset": "plan", "mechanism": mechanism}).params
    noise = count_noise if count_noise is not None else RunSettings.model_fields["count_noise"].default
    try:
        warning = check_delta(params.delta, users)  # type: ignore[attr-defined]
        # Training's count of units: declared public, or a DP count (planned at its expected value).
        population = Population.declared(users) if count_public else Population(float(users), "dp-count", noise)
        if choose_sampling:
            params = _chosen_sampling(spec, params, population, user_updates)
        plan = spec.plan(params, population)
    except ValueError as exc:
        raise UedpError(str(exc)) from None
    units = COUNTED_IN_WORDS[spec.counts or "users"]
    counted = "" if count_public or spec.counts is None else f" (incl. the DP count of {units}, noise std {noise:g})"
    lines = list(plan.lines)
    typer.echo(lines[0] + counted)
    for line in lines[1:]:
        typer.echo(line)
    if plan.noise_to_signal is not None:
        typer.echo(plan.noise_to_signal.line())
        if (unlikely := plan.noise_to_signal.warning()) is not None:
            typer.echo(f"warning: {unlikely}", err=True)
    if warning:
        typer.echo(f"warning: {warning}", err=True)


def _chosen_sampling(spec: Any, params: Any, population: Any, user_updates: float | None) -> Any:
    """``uedp epsilon --choose-sampling``: print the planner's split of the budget and return the parameters
    with it (``q_user`` and ``rounds``)."""
    from uedp.privacy.mechanisms.auto_sampling import choose_for

    if not hasattr(params, "q_user") or getattr(params, "target_epsilon", None) is None:
        raise ValueError("--choose-sampling chooses a user-level run's q_user and rounds (userdp, uedp-bounded, "
                         "uedp) for a --target-epsilon")
    chosen, choice = choose_for(spec.plan, params, population, user_updates)
    typer.echo(choice.reason)
    for line in choice.table():
        typer.echo(line)
    return chosen


@app.command()
@user_errors
@with_options(TRAIN_OPTIONS)
def train(
    dataset: str = typer.Argument(..., help="An ingested (and detected) dataset."),
    mechanism: Optional[str] = typer.Option(None, help=f"One of {MECHANISMS_HELP} (or `mechanism:` in --config).",
                                            show_default=False),
    seeded: bool = SEEDED_OPTION,
    store: Optional[str] = typer.Option(None, help=STORE_HELP),
    home: Optional[Path] = HOME_OPTION,
    config_file: Optional[Path] = CONFIG_OPTION,
    set_: Optional[list[str]] = SET_OPTION,
    **settings: Any,
) -> None:
    """Train one configuration and log it to MLflow; prints the run id.

    Every shared setting and every mechanism parameter is a flag (defaults from the configuration, shown
    below), a key of --config, or --set key=value. Rerunning the same configuration after a crash resumes
    from its last checkpoint (weights and accountant), continuing the same MLflow run.
    """
    data_home = _prepare_runtime(home)
    from uedp.services.launch import run_training
    from uedp.services.tracking import run_link

    values = merged(config_file, settings, set_, LISTED)
    config = _train_config(dataset, mechanism, seeded, values)
    from uedp.services.training_setup import categories_warning

    if (ignored := ignored_categories(config, values.get("categories"))) is not None:
        typer.echo(f"warning: {ignored}", err=True)
    if (warning := categories_warning(data_home, config)) is not None:
        typer.echo(f"warning: {warning}", err=True)
    result = run_training(data_home, config, store_url=store)  # says "resumed from ..." when it resumes
    guarantee = (f"epsilon {_fmt(result.epsilon, 4)} at delta {result.delta:g}" if math.isfinite(result.epsilon)
                 else "no privacy guarantee")
    typer.echo(f"{config.run_name()}: {guarantee}; test {result.utility_metric} {result.utility_test:.4g} "
               f"after {result.rounds} {config.step_word}s"
               + (f" (resumed after {config.step_word} {result.resumed_from})" if result.resumed_from else ""))
    if result.baselines:
        typer.echo(_baselines_line(result.baselines, result.utility_metric))
    if (warning := _baseline_warning(config.run_name(), result)) is not None:
        typer.echo(f"warning: {warning}", err=True)
    if result.detector_recall and math.isfinite(result.epsilon):
        typer.echo(f"this epsilon covers the detected entities: {result.detector_recall}")
    if result.notes:
        typer.echo(f"note: {result.notes}")
    if result.audit_epsilon is not None:
        typer.echo(f"one-run audit ({config.audit_canaries} canaries at the unit): epsilon >= "
                   f"{result.audit_epsilon:.3g} at 95% confidence, beside the accounted {_fmt(result.epsilon, 4)} "
                   f"(details: uedp attack {result.run_id} --kind audit)")
    _print_guarantee(result)
    typer.echo(f"MLflow run: {result.run_id}   (browse: {run_link(data_home, result.run_id)})")


def ignored_categories(config: Any, given: Any) -> str | None:
    """Said when --categories other than the default are given to a mechanism that trains the same whatever
    the categories (a logged configuration fed back with --config holds the default: nothing to say)."""
    if given is None or config.spec.uses_categories(config.params):
        return None
    if set(config.categories) == set(DEFAULT_CATEGORIES):
        return None
    shown = given if isinstance(given, str) else ",".join(given)
    unit = "no privacy unit" if config.spec.unit == "none" else f"its unit: {config.spec.unit}"
    return (f"{config.mechanism} ignores --categories {shown}: it trains the same whatever entities a sentence names "
            f"({unit}; its report says 'any'). To protect entities of these categories as such, train "
            "uedp-bounded, uedp or selective")


def _train_config(dataset: str, mechanism: Optional[str], seeded: bool, values: dict[str, Any]) -> Any:
    """The configuration ``uedp train`` (and ``uedp tune``) builds from its flags, config file and --set
    values, with the command line's own checks (one name per count, a known mechanism)."""
    from uedp.services.config import parameter_names

    if mechanism is not None:
        values["mechanism"] = mechanism
    if "mechanism" not in values:
        raise UedpError(f"--mechanism is required (one of {MECHANISMS_HELP})")
    if values.get("mechanism") not in registry.names():
        raise UedpError(f"unknown mechanism {values.get('mechanism')!r}; valid: {MECHANISMS_HELP}")
    if values.get("noise_multiplier") is not None and values.get("target_epsilon") is not None:
        raise UedpError("give at most one of --noise-multiplier and --target-epsilon")
    if seeded:
        values["randomness"] = "seeded"
    from uedp.services.tuned import TUNABLE

    if values.get("tuned") and (given := [n for n in TUNABLE if values.get(n) is not None]):
        raise UedpError(f"--tuned {values['tuned']} sets the searched values: drop --"
                        f"{' and --'.join(g.replace('_', '-') for g in given)} (or drop --tuned)")
    for name, names in parameter_names(registry.get(values["mechanism"]).params).items():
        given = [n for n in names if values.get(n) is not None]
        if len(given) > 1:  # e.g. --rounds and --steps: one count under two names
            raise UedpError(f"{values['mechanism']} counts {name}: give --{name.replace('_', '-')} only "
                            f"(--{' and --'.join(g.replace('_', '-') for g in given[1:])} "
                            f"{'is its alias' if len(given) == 2 else 'are its aliases'})")
    return TrainConfig(**{**values, "dataset": dataset})  # the named dataset wins over a config file's


@app.command()
@user_errors
@with_options(TRAIN_OPTIONS)
def tune(
    dataset: str = typer.Argument(..., help="A public proxy dataset (e.g. the base's corpus, ingested with about as "
                                  "many writers or pseudo-writers as the private dataset); never the private one."),
    mechanism: Optional[str] = typer.Option(None, help=f"One of {MECHANISMS_HELP} (or `mechanism:` in --config).",
                                            show_default=False),
    grid_axes: Optional[list[str]] = typer.Option(None, "--grid", show_default=False, help="NAME=V1,V2,...: values "
                                                  "to try, for server_lr, clip, local_lr or lr; repeatable (every "
                                                  "combination is one trial)."),
    seeded: bool = SEEDED_OPTION,
    home: Optional[Path] = HOME_OPTION,
    config_file: Optional[Path] = CONFIG_OPTION,
    set_: Optional[list[str]] = SET_OPTION,
    **settings: Any,
) -> None:
    """Choose learning rates and clip on public text: one training run per grid point on DATASET with the
    settings the private run will use, keeping the least validation perplexity.

    Prints the search's key; `uedp train PRIVATE --tuned KEY` takes its values and names the search in its
    privacy statement. A private run whose own text is the searched dataset's is refused (a search on private
    data is a release its epsilon does not count). The same search again reuses its record.
    """
    data_home = _prepare_runtime(home)
    from uedp.services.tune import tune as run_search

    config = _train_config(dataset, mechanism, seeded, merged(config_file, settings, set_, LISTED))
    record = run_search(data_home, config, _grid_axes(grid_axes or []), say=typer.echo)
    for trial in record.trials:
        chosen = "*" if trial.values == record.chosen else " "
        typer.echo(f"  {chosen} {', '.join(f'{k} {v:g}' for k, v in trial.values.items())}: validation perplexity "
                   f"{trial.perplexity_valid:.4g} (run {trial.run_id})")
    typer.echo(f"--tuned {record.key}")


@app.command()
@user_errors
@with_options(SWEEP_OPTIONS)
def sweep(
    dataset: str = typer.Argument(..., help="An ingested and detected dataset."),
    mechanisms: Optional[str] = typer.Option(None, help=f"Comma-separated: {MECHANISMS_HELP} "
                                             f"{default_of(SweepConfig, 'mechanisms')}", show_default=False),
    categories: Optional[list[str]] = typer.Option(None, show_default=False, help="A set of sensitive categories "
                                                   f"{default_of(SweepConfig, 'category_sets')}; repeat the "
                                         "option for several sets (e.g. --categories PERSON --categories PII)."),
    epsilons: Optional[str] = typer.Option(None, help="Comma-separated target epsilons for every private mechanism "
                                           "(default: the noise multiplier)."),
    seeds: Optional[str] = typer.Option(None, show_default=False, help="Comma-separated seeds (initial weights; "
                                        f"sampling and noise too with --seeded) {default_of(SweepConfig, 'seeds')}"),
    grid_axes: Optional[list[str]] = typer.Option(None, "--grid", show_default=False, help="NAME=V1,V2,...: one more "
                                                  "axis over a mechanism parameter; each mechanism that takes it runs "
                                                  "once per value (e.g. --grid holders_per_entity=1,4,16); repeatable."),
    seeded: bool = SEEDED_OPTION,
    store: Optional[str] = typer.Option(None, help=STORE_HELP),
    home: Optional[Path] = HOME_OPTION,
    config_file: Optional[Path] = CONFIG_OPTION,
    set_: Optional[list[str]] = SET_OPTION,
    **settings: Any,
) -> None:
    """Train every mechanism x category set x epsilon x seed as a Prefect flow; nested MLflow runs under one
    parent, and a privacy-utility report (PNG plots + Markdown) on the parent run and under the data home.

    The grid is set by the options above; the base configuration by every other flag (defaults from the
    configuration), --config or --set key=value."""
    data_home = _prepare_runtime(home)
    from uedp.flows.sweep import sweep_flow
    from uedp.services.tracking import run_link

    try:
        targets = [float(e) for e in _csv(epsilons)]
        seed_list = [int(s) for s in _csv(seeds)]
    except ValueError as exc:
        raise UedpError(f"--epsilons and --seeds take comma-separated numbers: {exc}") from None
    grid = {"mechanisms": _csv(mechanisms) if mechanisms else None, "category_sets": categories or None,
            "target_epsilons": targets or None, "seeds": seed_list or None, "store": store,
            "randomness": "seeded" if seeded else None, "grid": _grid_axes(grid_axes or []) or None}
    values = merged(config_file, settings, set_, LISTED) | {k: v for k, v in grid.items() if v is not None}
    config = SweepConfig(**{**values, "home": str(data_home.root), "dataset": dataset})
    from uedp.services.launch import preflight_sweep
    from uedp.services.sweep import SweepFailed

    items = preflight_sweep(data_home, config)
    typer.echo(f"uedp sweep: {len(items)} configurations on {dataset!r}")
    failed: SweepFailed | None = None
    with prefect_api(data_home):
        try:
            outcome = sweep_flow(config, progress=True)
        except SweepFailed as exc:  # what finished is still worth a table and a report
            failed, outcome = exc, exc.outcome
    if outcome.runs:
        _print_summary(outcome.runs, title=f"uedp sweep on {dataset}")
    typer.echo(f"\nreport: {outcome.report[0] if outcome.report else '-'}")
    typer.echo(f"MLflow parent run: {outcome.parent_run_id}   (browse: {run_link(data_home, outcome.parent_run_id)})")
    if failed is not None:
        for failure in outcome.failures:
            typer.echo(f"failed: {failure.describe()}", err=True)
        raise UedpError(f"{len(outcome.failures)} of {failed.total} configurations failed (causes above)")


@app.command()
@user_errors
def report(
    dataset: str = typer.Argument(..., help="The dataset whose MLflow experiment holds the runs."),
    parent: Optional[str] = typer.Option(None, help="A sweep's parent run id: its runs, its report folder, and the "
                                         "report logged to it again."),
    runs: Optional[str] = typer.Option(None, help="Comma-separated run ids to put in one report (any runs of the "
                                       "dataset: several sweeps, single `uedp train` runs)."),
    title: Optional[str] = typer.Option(None, help="The plots' title."),
    home: Optional[Path] = HOME_OPTION,
) -> None:
    """Rebuild the privacy-utility report (Markdown table and PNG plots) from runs already in MLflow.

    With neither --parent nor --runs: every finished training run of the dataset. Failed, running and
    killed runs are left out (and counted).
    """
    data_home = _prepare_runtime(home)
    from uedp.services.report import rebuild_report

    if parent and runs:
        raise UedpError("give --parent or --runs, not both")
    files, used, skipped = rebuild_report(data_home, dataset, parent, _csv(runs) or None, title)
    left_out = f" ({skipped} not finished training runs left out)" if skipped else ""
    typer.echo(f"report of {used} runs{left_out}: {files[0]}")
    for path in files[1:]:
        typer.echo(f"  plot: {path}")


REPRODUCE_NAMES = ("uedp-conll", "selective-conll", "sanitize-conll", "selective-wikitext", "selective-customersim",
                   "sanitize-sst2", "uedp-agnews")  # uedp.reproduce.EXPERIMENTS (a test checks)


def _corpus_dir(env: str) -> Optional[Path]:
    return Path(os.environ[env]) if os.environ.get(env) else None


@app.command()
@user_errors
@with_options(PRETRAIN_OPTIONS)
def pretrain(
    corpus: list[Path] = typer.Argument(..., help="The public corpus: Reuters-21578's reut2-*.sgm files or their "
                                        "folder (../shared/data/reuters21578), or files of --format."),
    eval_file: Optional[list[Path]] = typer.Option(None, "--eval-file", help="Held-out text to report the base's "
                                                   "perplexity on before any fine-tuning (repeatable), e.g. "
                                                   "CoNLL-2003's eng.testb.", show_default=False),
    home: Optional[Path] = HOME_OPTION,
    **settings: Any,
) -> None:
    """Build a public base model once: a BPE vocabulary and noiseless pretraining on a public corpus.

    Ingests the corpus, learns a byte-level BPE vocabulary from its train split, pretrains a GPT-2 or
    Llama-style model on it noiselessly (an MLflow run with its perplexities, on the corpus and on each
    --eval-file), and prints the flags that start a private run from it. The same inputs reuse the base;
    an interrupted pretraining resumes from its checkpoint.

    Example: uedp pretrain ../shared/data/reuters21578 --eval-file ../shared/data/conll2003/eng.testb
    """
    data_home = _prepare_runtime(home)
    from uedp.services.pretrain import pretrain as build_base

    config = PretrainConfig(files=[str(p) for p in corpus], eval_files=[str(p) for p in eval_file or ()],
                            **{k: v for k, v in settings.items() if v is not None})
    base = build_base(data_home, config, say=lambda line: typer.echo(line, err=True))
    typer.echo(f"base {base.key}: {base.model} {base.size}, {base.parameters / 1e6:.1f}M parameters, "
               f"{base.steps:,} steps" + (" (reused)" if base.reused else f", {base.minutes:.1f} minutes"))
    typer.echo(f"perplexity on {base.dataset}: valid {_fmt(base.perplexity_valid)}, test {_fmt(base.perplexity_test)}")
    for file_name, value in base.held_out.items():
        typer.echo(f"perplexity on {file_name} before fine-tuning: {_fmt(value)}")
    typer.echo(f"MLflow run: {base.run_id}")
    typer.echo(f"start a private run from it: uedp train DATASET {' '.join(base.start_flags())} ...")


@app.command()
@user_errors
def reproduce(
    name: str = typer.Argument(..., help=f"The experiment: {', '.join(REPRODUCE_NAMES)}."),
    scale: str = typer.Option("cpu", help="ci (a few documents and steps, seeded: minutes), cpu (the whole corpus, "
                              "under 30 minutes on 2 cores) or gpu (the larger configuration)."),
    conll_dir: Path = typer.Option(Path(os.environ.get("UEDP_CONLL_DIR", "../shared/data/conll2003")),
                                   help="Folder with CoNLL-2003's eng.train, eng.testa and eng.testb "
                                   "(default: $UEDP_CONLL_DIR or ../shared/data/conll2003)."),
    wikitext_dir: Optional[Path] = typer.Option(_corpus_dir("UEDP_WIKITEXT_DIR"), help="selective-wikitext: folder "
                                                "with WikiText-2's valid.txt, test.txt and, where you have "
                                                "it, train.txt (or wiki.*.tokens); without train.txt the page "
                                                "trains on valid.txt's first articles (default: "
                                                "$UEDP_WIKITEXT_DIR)."),
    simdial_dir: Optional[Path] = typer.Option(_corpus_dir("UEDP_SIMDIAL_DIR"), help="selective-customersim: "
                                               "folder with CustomerSim's train/, valid/ and test/ dialogs "
                                               "(default: $UEDP_SIMDIAL_DIR)."),
    sst2_dir: Optional[Path] = typer.Option(_corpus_dir("UEDP_SST2_DIR"), help="sanitize-sst2: folder with SST-2's "
                                            "train.tsv and dev.tsv (default: $UEDP_SST2_DIR)."),
    ag_dir: Optional[Path] = typer.Option(_corpus_dir("UEDP_AG_DIR"), help="uedp-agnews: folder with AG News' "
                                          "train.csv and test.csv (or train.jsonl and test.jsonl) "
                                          "(default: $UEDP_AG_DIR)."),
    start: str = typer.Option("auto", help="Where the models start, beside the from-scratch rows every page keeps "
                              "(uedp-conll, selective-conll): base (the public base `uedp pretrain` builds from "
                              "Reuters-21578, once per data home), a checkpoint FOLDER (e.g. GPT-2 117M saved with "
                              "save_pretrained), scratch (no second start), or auto (base at the cpu scale, scratch "
                              "otherwise)."),
    public_dir: Optional[Path] = typer.Option(None, help="--start base: folder with Reuters-21578's reut2-*.sgm "
                                              "(default: $UEDP_REUTERS_DIR or ../shared/data/reuters21578).",
                                              show_default=False),
    out: Optional[Path] = typer.Option(None, help="Folder of the results page (default: docs/results/NAME, "
                                       "or NAME-ci / NAME-gpu for those scales).", show_default=False),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    threads: int = typer.Option(1, min=1, help="Torch threads per training."),
    check: bool = typer.Option(False, help="Exit 1 when a claim the page makes at this scale does not hold."),
    page_only: bool = typer.Option(False, help="Rebuild the page in --out from its results.json, without training "
                                   "(after its text or claims changed); the figures, command and wall time stay."),
    home: Optional[Path] = HOME_OPTION,
) -> None:
    """Reproduce a seed paper's experiment with one command: ingest, detect, train every mechanism through
    `uedp sweep`, then write a results page (table, PNGs, the command, the machine, the wall time, the
    paper's own figures beside ours, and each claim checked).

    Each experiment reads its corpus from a folder you name (--conll-dir, --wikitext-dir, --simdial-dir,
    --sst2-dir, --ag-dir); uedp never downloads one, and the error for a missing folder says where to get it.

    The CoNLL pages also train every mechanism from a pretrained start (--start): the public base at the cpu
    scale, or a checkpoint folder you downloaded (the paper's GPT-2 117M at the gpu scale); the start's own
    text is treated as public, and the claims are judged on each start apart.

    Example: uedp reproduce uedp-conll --scale cpu --conll-dir ../shared/data/conll2003
    """
    data_home = _prepare_runtime(home)
    from uedp.reproduce import EXPERIMENTS, command_line, default_out, rerender
    from uedp.reproduce import reproduce as run_experiment
    from uedp.reproduce.common import CORPORA

    if name not in EXPERIMENTS:
        raise UedpError(f"unknown experiment {name!r}; valid: {', '.join(EXPERIMENTS)}")
    corpus = CORPORA[EXPERIMENTS[name].corpus]
    folders = {"conll": conll_dir, "wikitext": wikitext_dir, "simdial": simdial_dir, "sst2": sst2_dir, "ag": ag_dir}
    data_dir = folders.get(corpus.key)
    if data_dir is None and not page_only:
        raise UedpError(f"{name} reads {corpus.files}: give {corpus.option} (or {corpus.env}). Get it from "
                        f"{corpus.where}; uedp never downloads it.")
    if scale not in ("ci", "cpu", "gpu"):
        raise typer.BadParameter(f"{scale!r}: expected ci, cpu or gpu", param_hint="--scale")
    target = out or default_out(name, scale)  # type: ignore[arg-type]
    if page_only:
        page = rerender(name, data_home, target)
    else:
        typer.echo(f"uedp reproduce {name} ({scale} scale): {EXPERIMENTS[name].summary}")
        with prefect_api(data_home):
            page = run_experiment(name, scale, data_home, data_dir, target, device, threads,  # type: ignore[arg-type]
                                  say=lambda line: typer.echo(line, err=True), command=command_line(),
                                  conll_dir=conll_dir, start=start, public_dir=public_dir)
    for verdict in page.verdicts:
        typer.echo(f"  [{verdict.verdict}] {verdict.statement}: {verdict.ours}")
    typer.echo(f"page: {target / 'README.md'}")
    failed = [v for v in page.verdicts if not v.holds]
    if check and failed:
        typer.echo(f"error: {len(failed)} claim(s) do not hold at the {scale} scale", err=True)
        raise typer.Exit(1)


def _grid_axes(axes: list[str]) -> dict[str, list[Any]]:
    """``--grid name=1,4,16`` -> ``{"name": [1, 4, 16]}`` (numbers where they parse, text otherwise)."""
    out: dict[str, list[Any]] = {}
    for axis in axes:
        name, sep, values = axis.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise UedpError(f"--grid takes NAME=V1,V2,... (e.g. holders_per_entity=1,4,16), got {axis!r}")
        out[name.strip().replace("-", "_")] = [_scalar(v) for v in _csv(values)]
    return out


def _scalar(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


@app.command()
@user_errors
def attack(
    run_id: str = typer.Argument(..., help="The MLflow run id `uedp train` printed (trained with --log-model, "
                                 "--canaries or --audit-canaries)."),
    kind: str = typer.Option("all", help="audit (the one-run audit of --audit-canaries), canary, mia, extraction "
                             "or all (comma-separated for several)."),
    members: int = typer.Option(500, min=1, help="Membership inference: members and non-members sampled at the "
                                "sentence and entity levels, exactly (a level with fewer is not attacked): a public "
                                "number, logged and shown beside the AUC, never the private count."),
    member_users: int = typer.Option(50, min=1, help="Membership inference: members and non-members sampled at the "
                                     "user level, exactly."),
    top_k: int = typer.Option(5, help="Extraction: beam width; an entity counts when it is among the top k."),
    extraction_limit: int = typer.Option(200, help="Extraction: entity occurrences tried at most."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    seed: int = typer.Option(0, help="Seed of the sampling of candidates."),
    reference_run: Optional[str] = typer.Option(None, help="Membership inference: calibrate against this run's "
                                                "model (one trained without the members, e.g. on public text)."),
    home: Optional[Path] = HOME_OPTION,
) -> None:
    """Attack a trained run and add the scores to that MLflow run: the one-run audit's lower bound on
    epsilon from the canaries --audit-canaries planted at the mechanism's privacy unit (Steinke, Nasr and
    Jagielski 2023; the secret coins are read from this data home), canary exposure, membership inference
    (sentence, user and entity level, on a sample of --members members and non-members; ROC AUC with its
    95% interval, TPR at 1% and 0.1% FPR, balanced accuracy) and entity extraction, next to the accounted
    epsilon."""
    data_home = _prepare_runtime(home)
    from uedp.services.attack import ATTACKS, attack_run, summary_rows
    from uedp.services.tracking import run_link

    kinds = list(ATTACKS) if kind == "all" else _csv(kind)
    outcome = attack_run(data_home, run_id, kinds, members=members, top_k=top_k, extraction_limit=extraction_limit,
                         device_name=device, seed=seed, reference_run=reference_run, everything=kind == "all",
                         member_users=member_users)
    from rich.console import Console
    from rich.table import Table

    accounted = ("accounted epsilon: none (no guarantee)" if outcome.accounted_epsilon is None else
                 f"accounted epsilon: {outcome.accounted_epsilon:.4g} at delta {outcome.delta:g}")
    table = Table(title=f"run {run_id[:8]}: attacks ({accounted})")
    for column in ("attack", "figure", "value", "random baseline"):
        table.add_column(column, justify="right" if column in ("value", "random baseline") else "left")
    for row in summary_rows(outcome):
        table.add_row(*row)
    Console(width=120).print(table)
    for note in outcome.notes:
        typer.echo(note)
    for name, why in outcome.skipped.items():
        typer.echo(f"skipped {name}: {why}")
    typer.echo(f"{len(outcome.metrics)} figures logged to MLflow run {run_id}   (browse: {run_link(data_home, run_id)})")
    if outcome.failed:
        raise UedpError("; ".join(f"{name} failed ({why})" for name, why in outcome.failed.items())
                        + " - the other attacks' figures are logged")


@app.command()
@user_errors
def serve(
    home: Optional[Path] = HOME_OPTION,
    prefect_port: int = typer.Option(4200, help="Prefect server (API and UI) port on 127.0.0.1."),
    mlflow_port: int = typer.Option(5000, help="MLflow tracking server (and UI) port on 127.0.0.1."),
) -> None:
    """Start the stack on this machine until Ctrl-C: Prefect server, MLflow server, the cpu and gpu work
    pools with one worker each, and the deployments of deployments/prefect.yaml."""
    data_home = _prepare_runtime(home)
    import signal
    import time

    from uedp.services.tracking import MODEL_TRAINING_VIEW
    from uedp.stack import LocalStack

    def terminate(signum: int, frame: object) -> None:  # kill -TERM stops the stack as Ctrl-C does
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second TERM must not cut the stopping short
        raise KeyboardInterrupt

    # Before anything starts: a TERM during start-up stops what has started, too (never orphaned servers).
    signal.signal(signal.SIGTERM, terminate)
    typer.echo(f"starting the uedp stack (logs: {data_home.root / 'stack'}) ...")
    with contextlib.suppress(KeyboardInterrupt), LocalStack(data_home, prefect_port, mlflow_port) as stack:
        typer.echo(f"Prefect UI  {stack.prefect_ui}   (deployments: {', '.join(stack.deployment_names())})")
        typer.echo(f"MLflow UI   {stack.mlflow_url}/{MODEL_TRAINING_VIEW}")
        typer.echo(f"CLI against it: export PREFECT_API_URL={stack.prefect_api} MLFLOW_TRACKING_URI={stack.mlflow_url}")
        typer.echo("Ctrl-C (or kill -TERM) stops everything.")
        sys.stdout.flush()
        while True:
            time.sleep(3600)
    typer.echo("stack stopped")


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
    data_home = _prepare_runtime(home)
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
    data_home = _prepare_runtime(home)
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
    data_home = _prepare_runtime(home)
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


def _print_summary(runs: list[Any], title: str = "uedp demo results") -> None:
    from rich.console import Console
    from rich.table import Table

    metric = runs[0].utility_metric if runs else "perplexity"
    table = Table(title=f"{title} (test {metric}; epsilon for the mechanism's privacy unit)")
    for column in ("mechanism", "categories", "epsilon", "delta", "z", "randomness", "rounds", metric, "MLflow run"):
        table.add_column(column, justify="right" if column in ("epsilon", "delta", "z", "rounds", metric) else "left")
    for r in runs:
        table.add_row(
            r.shown_as, ",".join(r.categories) or "any", _fmt(r.epsilon), f"{r.delta:g}" if r.delta else "-",
            f"{r.noise_multiplier:.3g}" if r.noise_multiplier else "-", r.randomness if r.randomness != "none" else "-",
            str(r.rounds), f"{r.utility_test:.4g}", r.run_id,
        )
    Console(width=160).print(table)
    if baselines := next((r.baselines for r in runs if r.baselines), None):
        typer.echo(_baselines_line(baselines, metric))
    for r in runs:
        if (warning := _baseline_warning(f"{r.shown_as} (categories {','.join(r.categories) or 'any'})", r)) is not None:
            typer.echo(f"warning: {warning}", err=True)
    for label, unit in dict.fromkeys((r.shown_as, r.unit) for r in runs if r.unit and math.isfinite(r.epsilon)):
        typer.echo(f"unit ({label}): {unit}")
    for r in runs:
        if r.notes:
            typer.echo(f"note ({r.mechanism}): {r.notes}")
    caveats = dict.fromkeys(c for r in runs for c in r.caveats)  # shared caveats once, in order
    for caveat in caveats:
        typer.echo(f"not covered by epsilon: {caveat}")
    if any(math.isfinite(r.epsilon) for r in runs):
        typer.echo(f"what each epsilon means (unit, adjacency, what is public): {PRIVACY_DOC}")


def _print_guarantee(result: Any) -> None:
    """What a single run's epsilon treats as public and does not cover, next to it."""
    if not math.isfinite(result.epsilon):
        return
    if result.unit:
        typer.echo(f"unit: {result.unit}")
    for line in result.public:
        typer.echo(f"public: {line}")
    for caveat in result.caveats:
        typer.echo(f"not covered by epsilon: {caveat}")
    typer.echo(f"what this epsilon means: {PRIVACY_DOC}")


# Each baseline as the lines below name it, in the order they list it.
_BASELINE_NAMES = {"majority": "majority class", "uniform": "uniform guess",
                   "unigram": "unigram (fitted on the validation split)"}


def _baselines_line(baselines: dict[str, float], metric: str) -> str:
    """A test figure means something only beside what a model that learnt nothing scores."""
    figures = ", ".join(f"{_BASELINE_NAMES[name]} {metric} {baselines[name]:.4g}"
                        for name in _BASELINE_NAMES if name in baselines)
    learnt = "" if metric == "error" else "; a model at or above these has learnt nothing beyond token frequencies"
    return f"baselines on the test split: {figures}{learnt}"


def _baseline_warning(name: str, result: Any) -> str | None:
    """The warning for a run whose test figure is no better than a uniform guess (it learnt nothing) or,
    for a language model, worse than a unigram (it has not even learnt which tokens are common)."""
    metric, test, baselines = result.utility_metric, result.utility_test, result.baselines
    if "uniform" in baselines and test >= baselines["uniform"]:
        return (f"{name} is no better than a uniform guess (test {metric} {test:.4g} >= {baselines['uniform']:.4g}): "
                "it has learnt nothing")
    if "unigram" in baselines and test > baselines["unigram"]:
        return (f"{name} is worse than a unigram model fitted on the validation split (test {metric} {test:.4g} > "
                f"{baselines['unigram']:.4g}): it has not even learnt which tokens are common")
    return None


def main() -> None:
    """Run the command ``sys.argv`` names (called by :func:`uedp.cli.main`)."""
    sys.exit(app())


if __name__ == "__main__":
    main()
