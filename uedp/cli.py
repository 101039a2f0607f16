"""The ``uedp`` command line. Every command has ``--help``; bad input prints one line and exits 2.

Prefect and the flows are imported inside commands, after the data home and Prefect's settings are
known, because Prefect reads its settings at import time.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import typer

from uedp.errors import UedpError

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
EMBEDDINGS_OPTION = typer.Option(None, "--embeddings", help="custext/santext: vector file (GloVe/word2vec text, "
                                 ".npz) or model:<pretrained folder>; the target epsilon is per token.")
K_OPTION = typer.Option(50, "--k", help="custext: size of each token's output set.")
SANITIZE_STRATEGY_OPTION = typer.Option("token", "--sanitize-strategy", help="custext/santext: token (one draw per "
                                        "occurrence; record and dataset were withdrawn, see docs/PRIVACY.md).")
SEEDED_OPTION = typer.Option(False, "--seeded", help="Draw sampling and noise from --seed instead of the operating "
                             "system: reproducible, for tests and demos. The guarantee does not hold against anyone who "
                             "knows the seed; the run is tagged uedp.randomness=seeded.")
PUBLIC_COUNT_OPTION = typer.Option(None, "--public-count", help="dpsgd/userdp/uedp: declare the number of privacy "
                                   "units (sequences; users) public and use it for sampling rates and denominators "
                                   "(named in the privacy statement). Default: a DP count, composed into epsilon.")
COUNT_NOISE_OPTION = typer.Option(10.0, "--count-noise", help="Standard deviation of the Gaussian noise on the DP "
                                  "count of units (sensitivity 1).")
PRIVACY_DOC = "docs/PRIVACY.md"
KEEP_OPTION = typer.Option("none", "--keep", help="custext/santext: none, stopwords or non-entities (of --categories).")
ATTACK_MODEL_OPTION = typer.Option(None, "--attack-model", help="custext/santext: masked-LM folder for the mask-token "
                                   "inference attack on the release.")
HOME_OPTION = typer.Option(None, "--home", help="Data home (default: $UEDP_HOME or ./.uedp).", show_default=False)


def _local_dp(embeddings: str | None, k: int, strategy: str, keep: str, attack_model: Path | None):  # noqa: ANN202
    """custext/santext settings from the CLI options, or None without --embeddings."""
    if embeddings is None:
        return None
    from uedp.tasks.config import LocalDpSettings

    return LocalDpSettings(embeddings=embeddings, k=k, strategy=strategy, keep=keep,  # type: ignore[arg-type]
                           attack_model=str(attack_model) if attack_model else None)


def _one_line(exc: BaseException) -> str:
    """A single readable line for errors users can fix (pydantic errors name the field)."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first.get("loc", ())) or "input"
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

    return wrapper  # type: ignore[return-value]


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
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    return home


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True),
) -> None:
    """uedp: user- and entity-level DP training of language models, as one Prefect + MLflow pipeline."""
    if version:
        from uedp import __version__

        typer.echo(f"uedp {__version__}")
        raise typer.Exit(0)


def _csv(value: str | None) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``."""
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def _fmt(value: float, digits: int = 3) -> str:
    return "inf" if math.isinf(value) else f"{value:.{digits}g}"


@app.command()
@user_errors
def demo(
    home: Optional[Path] = HOME_OPTION,
    mechanisms: str = typer.Option("noiseless,deid,userdp,uedp", help="Comma-separated mechanisms to train: "
                                   "noiseless, deid, dpsgd, selective, userdp, uedp, uedp-naive."),
    categories: str = typer.Option("PERSON,LOC,ORG,PHONE_NUMBER,EMAIL_ADDRESS",
                                   help="Entity categories treated as sensitive (names, aliases such as PER, or composites such as PII)."),
    steps: int = typer.Option(300, help="Optimizer steps for noiseless, deid and dpsgd."),
    rounds: int = typer.Option(30, help="DP-FedAvg rounds for userdp and uedp."),
    q_user: float = typer.Option(0.5, help="Poisson sampling probability of a user per round."),
    q_entity: float = typer.Option(0.5, help="uedp: sampling probability of a detected entity per round."),
    q_extended: float = typer.Option(0.5, help="uedp: sampling probability of a sentence with no entity."),
    noise_multiplier: float = typer.Option(1.0, help="Noise multiplier z (noise std = z * clip)."),
    target_epsilon: Optional[float] = typer.Option(None, help="Calibrate z to this epsilon instead."),
    clip: float = typer.Option(1.0, help="L2 bound on each user's model delta."),
    seed: int = typer.Option(0, help="Seed for data splits, initialisation, sampling and noise."),
    secure: bool = typer.Option(False, "--secure", help="Draw sampling and noise from the operating system (as "
                                "`uedp train` does by default) instead of --seed: results then differ run to run."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
) -> None:
    """Run the whole pipeline on the bundled demo corpus: ingest, detect, train, evaluate, log to MLflow.

    Needs no server, network or GPU (uses one when present). A second run reuses the ingested data. The
    demo is seeded so its table is reproducible: its guarantee does not hold against anyone who knows
    the seed (the runs are tagged so); use --secure for real randomness.
    """
    data_home = _prepare_runtime(home)
    from uedp.flows.demo import DemoConfig, demo_flow
    from uedp.tasks.tracking import ui_command

    config = DemoConfig(
        home=str(data_home.root), mechanisms=_csv(mechanisms),
        categories=categories, steps=steps, rounds=rounds, q_user=q_user, q_entity=q_entity, q_extended=q_extended,
        noise_multiplier=noise_multiplier,
        target_epsilon=target_epsilon, clip=clip, seed=seed, device=device,
        randomness="secure" if secure else "seeded",
    )
    _check_before_running(config)
    typer.echo(f"uedp demo: data home {data_home.root}")
    outcome = demo_flow(config)
    ing, det = outcome.ingest, outcome.detect
    typer.echo(
        f"ingest: {'reused existing' if ing.reused else 'ingested'} dataset {ing.dataset!r} "
        f"({ing.sentences} sentences, {ing.users} users){' - inputs unchanged, nothing redone' if ing.reused else ''}"
    )
    typer.echo(f"detect: {'reused' if det.reused else 'wrote'} {det.entities} {det.detector} entity spans")
    _print_summary(outcome.runs)
    typer.echo(f"\nBrowse the runs:  {ui_command(data_home)}")


@app.command()
@user_errors
def ingest(
    format: str = typer.Argument(..., help="conll2003, ag_news, sec, wikitext, jsonl or csv."),
    paths: list[str] = typer.Argument(..., help="Input files or fsspec URLs (s3://raw/eng.train); .gz, .bz2 and .xz "
                                      "are read transparently."),
    name: str = typer.Option(..., "--name", help="Dataset name (a folder under the data home)."),
    home: Optional[Path] = HOME_OPTION,
    users: Optional[str] = typer.Option(
        None, help="Who the users (privacy units) are: 'source' (ag_news news agency), 'chunk:N' (pseudo-users "
        "of N consecutive records), or --user-col. conll2003: document, sec: filer (CIK), wikitext: article."),
    text_col: Optional[str] = typer.Option(None, help="jsonl/csv: the text column."),
    user_col: Optional[str] = typer.Option(None, help="jsonl/csv: the user column."),
    label_col: Optional[str] = typer.Option(None, help="jsonl/csv: a label column to keep."),
    split_col: Optional[str] = typer.Option(None, help="jsonl/csv: a column holding train/valid/test."),
    split: str = typer.Option("auto", help="auto: from file names or --split-col, else by user; files; users."),
    split_seed: int = typer.Option(0, help="Seed of the by-user split."),
    valid_fraction: float = typer.Option(0.1, help="Share of users in valid (by-user split)."),
    test_fraction: float = typer.Option(0.1, help="Share of users in test (by-user split)."),
    detokenize: bool = typer.Option(False, help="wikitext: undo @-@ and tokenised punctuation spacing."),
    sec_document_types: str = typer.Option("", help="sec raw files: document types to read, e.g. 10-K,EX-99.1 "
                                           "(default: the submission's own type)."),
    store: Optional[str] = typer.Option(None, help=STORE_HELP),
) -> None:
    """Turn corpus files into the dataset's Parquet `sentences` and `users` tables (DuckDB-queryable).

    Re-ingesting unchanged inputs with the same options is a no-op that says so; a bad line anywhere
    is reported as FILE:LINE and leaves no partial table.
    """
    data_home = _prepare_runtime(home)
    from uedp.flows.ingest import IngestConfig, ingest_flow
    from uedp.storage.home import validate_dataset_name

    config = IngestConfig(
        home=str(data_home.root), dataset=validate_dataset_name(name), format=format, files=list(paths),
        users=users, text_col=text_col, user_col=user_col, label_col=label_col, split_col=split_col, split=split,
        split_seed=split_seed, valid_fraction=valid_fraction, test_fraction=test_fraction, detokenize=detokenize,
        sec_document_types=_csv(sec_document_types), store=store,
    )
    options = config.options()  # validate before any work starts
    result = ingest_flow(config, progress=sys.stderr.isatty())
    if result.reused:
        typer.echo(f"{name}: inputs and options unchanged, reused the existing tables (nothing redone)")
    splits = ", ".join(f"{s} {result.per_split[s]}" for s in ("train", "valid", "test") if result.per_split.get(s))
    typer.echo(f"{name}: {result.sentences} sentences ({splits}), {result.users} users "
               f"[users = {options.user_strategy}]")
    typer.echo(f"tables: {data_home.dataset_dir(name)}/{{sentences,users}}/data.parquet")


@app.command()
@user_errors
def detect(
    dataset: str = typer.Argument(..., help="An ingested dataset."),
    home: Optional[Path] = HOME_OPTION,
    detector: str = typer.Option("gold", help="Comma-separated detectors: gold, spacy, presidio."),
    spacy_model: Optional[str] = typer.Option(None, help="spaCy pipeline: installed package (en_core_web_lg) or folder."),
    presidio_entities: Optional[str] = typer.Option(None, help="Presidio entity types to ask for (default: all)."),
    recognizers: Optional[Path] = typer.Option(None, help="YAML file of extra recognizers (Presidio's format: regex, deny lists)."),
    score_threshold: float = typer.Option(0.4, help="Drop Presidio results scored below this."),
    workers: int = typer.Option(1, help="Worker processes for the spaCy + Presidio pass (each loads the pipeline)."),
    batch_size: int = typer.Option(256, help="Texts per nlp.pipe batch."),
    shard_rows: Optional[int] = typer.Option(None, help="Scale out: cut the corpus into shards of N sentences, "
                                             "detect them as parallel tasks, then merge (same table)."),
    runner: str = typer.Option("dask", help="Shards run on: dask (worker processes, or --dask-address) or threads."),
    dask_address: Optional[str] = typer.Option(None, help="Scheduler of an existing Dask cluster (tcp://host:8786); "
                                               "default: a local cluster of --dask-workers processes."),
    dask_workers: int = typer.Option(2, help="Worker processes of the local Dask cluster."),
    store: Optional[str] = typer.Option(None, help=STORE_HELP),
) -> None:
    """Find sensitive entities in every sentence and write the dataset's `entities` table.

    Detection is cached by corpus content and detector configuration; choosing other categories later
    (`uedp entities`, `uedp demo --categories`) is a query and never re-runs it.
    """
    data_home = _prepare_runtime(home)
    from uedp.detection.pipeline import DetectorConfig
    from uedp.flows.detect import ScaleOut, detect_flow

    config = DetectorConfig(
        detectors=_csv(detector), spacy_model=spacy_model, presidio_entities=_csv(presidio_entities) or None,
        recognizers=str(recognizers) if recognizers else None, score_threshold=score_threshold, workers=workers,
        batch_size=batch_size,
    )
    scale_out = ScaleOut(rows_per_shard=shard_rows, runner=runner, dask_address=dask_address,  # type: ignore[arg-type]
                         dask_workers=dask_workers, store=store)
    result = detect_flow(str(data_home.root), dataset, config, progress=sys.stderr.isatty(), scale_out=scale_out)
    verb = "reused (same corpus and detector configuration)" if result.reused else "wrote"
    shards = f" in {result.shards} shards" if result.shards > 1 else ""
    typer.echo(f"{dataset}: {verb} {result.entities} entity spans from {result.detector}{shards}")


@app.command()
@user_errors
def sanitize(
    dataset: str = typer.Argument(..., help="An ingested dataset (detected too, for --keep non-entities)."),
    mechanism: str = typer.Option("custext", help="custext (customized K-token output sets) or santext (whole vocabulary)."),
    epsilon: float = typer.Option(..., help="Per-token epsilon of the exponential mechanism."),
    k: int = typer.Option(50, "--k", help="custext: size of each token's output set."),
    embeddings: str = typer.Option(..., help="Vector file (GloVe/word2vec text or .npz) or model:<pretrained folder> "
                                   "(its input embeddings and tokenizer)."),
    mapping: str = typer.Option("balanced", help="custext: aggressive, balanced or conservative."),
    metric: str = typer.Option("euclidean", help="custext: euclidean or cosine."),
    strategy: str = typer.Option("token", help="token: one independent draw per occurrence (record and dataset were "
                                 "withdrawn: no per-token guarantee holds for them)."),
    keep: str = typer.Option("none", help="none; stopwords (the '+' variants); non-entities (sanitize only detected "
                             "entities of --categories)."),
    categories: str = typer.Option("PII", help="Entity categories for --keep non-entities."),
    vocab_limit: Optional[int] = typer.Option(None, help="Use the first N vectors of the file (the most frequent)."),
    seed: int = typer.Option(0, help="Seed of the draws with --seeded, and of the attack's sample."),
    seeded: bool = typer.Option(False, "--seeded", help="Draw from --seed instead of OS randomness: reproducible, and "
                                "the release gives no guarantee against anyone who knows the seed."),
    output: Optional[str] = typer.Option(None, help="Name of the sanitized dataset (default: derived from the settings)."),
    attack_model: Optional[Path] = typer.Option(None, help="Masked-LM folder (e.g. bert-base-uncased, save_pretrained "
                                                "form): run the mask-token inference attack on the release."),
    attack_sentences: int = typer.Option(200, help="Train sentences the attack samples."),
    home: Optional[Path] = HOME_OPTION,
) -> None:
    """Rewrite the train split of DATASET under local DP (the thesis' CusText or SanText) into a new dataset;
    valid and test stay original. Train it like any dataset (noiselessly: the text itself is private) and
    compare it in MLflow with the other mechanisms. Prints the per-token and per-record epsilon."""
    data_home = _prepare_runtime(home)
    from uedp.flows.sanitize import sanitize_flow
    from uedp.tasks.sanitize import SanitizeConfig

    config = SanitizeConfig(
        dataset=dataset, mechanism=mechanism, epsilon=epsilon, k=k, mapping=mapping, metric=metric,  # type: ignore[arg-type]
        strategy=strategy, keep=keep, categories=categories, embeddings=embeddings, vocab_limit=vocab_limit,  # type: ignore[arg-type]
        seed=seed, randomness="seeded" if seeded else "secure", output=output, attack_model=str(attack_model) if attack_model else None,
        attack_sentences=attack_sentences,
    )
    result = sanitize_flow(str(data_home.root), config, progress=sys.stderr.isatty())
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
    if mechanism == "custext":
        typer.echo(f"  vocabulary tokens with no adjacent token (type 1-N, no guarantee): {result.unprotected_share:.1%}")
    for caveat in result.caveats:
        typer.echo(f"  not covered: {caveat}")
    typer.echo(f"  what this means: {PRIVACY_DOC}")
    typer.echo(f"train it: uedp train {result.dataset} --mechanism noiseless")


@app.command()
@user_errors
def entities(
    dataset: str = typer.Argument(..., help="A dataset with an entities table."),
    home: Optional[Path] = HOME_OPTION,
    categories: str = typer.Option("PII", help="Categories, aliases (PER) or composites (PII, PLACE, CONTACT)."),
    coverage: bool = typer.Option(False, help="Precision/recall of each automatic detector against gold tags."),
) -> None:
    """How many entities, sensitive sentences and users each category covers (UeDP paper, Table II).

    Prints counts only, never entity text.
    """
    data_home = _prepare_runtime(home)
    from rich.console import Console
    from rich.table import Table

    from uedp.detection.categories import taxonomy
    from uedp.storage.catalog import Catalog

    chosen = taxonomy().resolve(categories)
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
            cov = Table(title=f"{dataset}: detectors against gold tags (CoNLL classes)")
            for column in ("detector", "class", "gold", "predicted", "exact", "precision", "recall", "overlap recall"):
                cov.add_column(column, justify="left" if column in ("detector", "class") else "right")
            for name in (d for d in detectors if d != "gold"):
                for cls, n_ref, n_pred, tp, precision, recall, overlap in catalog.coverage(name, taxonomy().coarse):
                    cov.add_row(name, cls, str(n_ref), str(n_pred), str(tp), f"{precision:.3f}", f"{recall:.3f}",
                                f"{overlap:.3f}")
            console.print(cov)


@app.command()
@user_errors
def epsilon(
    mechanism: str = typer.Option(..., help="userdp, uedp or uedp-naive."),
    users: int = typer.Option(..., min=1, help="Number of training users (privacy units of userdp)."),
    steps: int = typer.Option(..., min=1, help="Training rounds T."),
    q_user: float = typer.Option(..., help="Sampling probability of a user per round."),
    q_entity: float = typer.Option(0.5, help="uedp: sampling probability of a detected entity."),
    q_extended: float = typer.Option(0.5, help="uedp: sampling probability of a sentence with no entity (as training)."),
    noise_multiplier: Optional[float] = typer.Option(None, help="z: noise std = z * sensitivity."),
    target_epsilon: Optional[float] = typer.Option(None, help="Find the smallest z meeting this epsilon instead."),
    delta: float = typer.Option(1e-5, help="Total delta (uedp charges shares of it to truncating sampled users and "
                                "to the DP bound on the number of users)."),
    accountant: str = typer.Option("pld", help="pld (tightest) or rdp."),
    count_public: bool = typer.Option(False, "--count-public", help="Plan a run that declares the number of users "
                                      "public (--public-count); default: training's DP count, composed in."),
    count_noise: float = typer.Option(10.0, "--count-noise", help="Noise std of that DP count (as training)."),
) -> None:
    """Plan a privacy budget without training: epsilon for a noise multiplier, or z for a target epsilon.

    Example: uedp epsilon --mechanism uedp --users 946 --q-user 0.05 --q-entity 0.05 --steps 500 --noise-multiplier 2
    """
    from uedp.privacy.accounting import (UeDpAccounting, check_delta, epsilon_after, poisson_gaussian_round,
                                    resolve_noise_multiplier)
    from uedp.privacy.population import Population

    if mechanism not in ("userdp", "uedp", "uedp-naive"):
        raise UedpError(f"unknown mechanism {mechanism!r} for planning; valid: userdp, uedp, uedp-naive")
    if accountant not in ("pld", "rdp"):
        raise UedpError(f"unknown accountant {accountant!r}; valid: pld, rdp")
    if (noise_multiplier is None) == (target_epsilon is None):
        raise UedpError("give exactly one of --noise-multiplier and --target-epsilon")
    for name, q in (("q-user", q_user), ("q-entity", q_entity), ("q-extended", q_extended)):
        if not 0 < q <= 1:
            raise UedpError(f"--{name} must be in (0, 1], got {q}")
    try:
        warning = check_delta(delta, users)
        # Training's count of users: declared public, or a DP count (planned at its expected value).
        population = Population.declared(users) if count_public else Population(float(users), "dp-count", count_noise)
        initial = population.event()
        counted = "" if count_public else f" incl. the DP count of users (noise std {count_noise:g})"
        if mechanism == "userdp":
            def event(z: float):  # type: ignore[no-untyped-def]
                return poisson_gaussian_round(q_user, z)

            z = resolve_noise_multiplier(mechanism, noise_multiplier, target_epsilon, event, steps, delta, accountant,  # type: ignore[arg-type]
                                         initial=initial)
            typer.echo(f"userdp: epsilon = {epsilon_after(event(z), steps, delta, accountant, initial=initial):.4g} "  # type: ignore[arg-type]
                       f"at delta = {delta:g} after {steps} rounds{counted}, z = {z:.4g} ({accountant}; unit: one user)")
        else:
            plan = UeDpAccounting.for_population(population, q_user, q_entity, q_extended, steps, delta,
                                                 mechanism == "uedp-naive", kind=accountant)  # type: ignore[arg-type]
            z = noise_multiplier or plan.calibrate(target_epsilon)  # type: ignore[arg-type]
            cases = plan.epsilons(z)
            typer.echo(f"{mechanism}: epsilon = {max(cases.values()):.4g} at delta = {delta:g} after {steps} rounds"
                       f"{counted}, z = {z:.4g} ({accountant}; unit: one user and one sensitive entity)")
            typer.echo("  cases: " + ", ".join(f"{c} {e:.4g}" for c, e in cases.items())
                       + f"; at most M = {plan.max_users} users per round (truncation delta {plan.delta_trunc:.2g}), "
                       f"sensitivity (2M+1) * clip = {plan.sensitivity_factor} * clip")
            same = epsilon_after(poisson_gaussian_round(q_user, z), steps, delta, accountant, initial=initial)  # type: ignore[arg-type]
            typer.echo(f"  for comparison, userdp with the same q_user and z: epsilon = {same:.4g} (protects users only)")
    except ValueError as exc:
        raise UedpError(str(exc)) from None
    if warning:
        typer.echo(f"warning: {warning}", err=True)


MECHANISMS_HELP = "noiseless, deid, dpsgd, selective, userdp, uedp, uedp-naive, custext, santext"
MODEL_HELP = "gpt2 (next-word prediction), lstm (one-layer 200/200 LSTM LM) or bert (sequence classification)."
MODEL_CONFIG_HELP = ("Size preset (gpt2: tiny, small; lstm: tiny, paper; bert: tiny, small) or a pretrained "
                     "checkpoint folder (save_pretrained) / hub name.")


@app.command()
@user_errors
def train(
    dataset: str = typer.Argument(..., help="An ingested (and detected) dataset."),
    mechanism: str = typer.Option(..., help=f"One of {MECHANISMS_HELP}."),
    model: str = typer.Option("gpt2", help=MODEL_HELP),
    model_config: str = typer.Option("tiny", "--model-config", help=MODEL_CONFIG_HELP),
    tokenizer: str = typer.Option("byte", help="'byte' (leak-free byte-level) or a pretrained tokenizer folder."),
    categories: str = typer.Option("PERSON,LOC,ORG,PHONE_NUMBER,EMAIL_ADDRESS", help="Sensitive entity categories."),
    steps: int = typer.Option(300, help="Optimizer steps (noiseless, deid, dpsgd, selective) or rounds (userdp, uedp)."),
    public_steps: int = typer.Option(300, help="selective: noiseless steps on the redacted corpus first."),
    batch_size: int = typer.Option(16, help="Batch size (dpsgd: expected Poisson batch size)."),
    lr: float = typer.Option(1e-3, help="Learning rate of noiseless, deid, dpsgd and selective."),
    max_len: int = typer.Option(96, help="Tokens per sentence at most."),
    q_user: float = typer.Option(0.5, help="userdp/uedp: sampling probability of a user per round."),
    q_entity: float = typer.Option(0.5, help="uedp: sampling probability of a detected entity."),
    q_extended: float = typer.Option(0.5, help="uedp: sampling probability of a sentence with no entity."),
    noise_multiplier: Optional[float] = typer.Option(None, help="Noise multiplier z (default 1.0 without --target-epsilon)."),
    target_epsilon: Optional[float] = typer.Option(None, help="Calibrate z so the run ends at this epsilon."),
    max_epsilon: Optional[float] = typer.Option(None, help="Stop before a round that would exceed this epsilon."),
    clip: float = typer.Option(1.0, help="L2 clipping bound (beta): per example (dpsgd) or per user delta."),
    hidden_clip: float = typer.Option(1.0, help="selective with --model lstm: L2 bound of the state after a private token."),
    local_steps: int = typer.Option(5, help="userdp/uedp: local SGD steps per sampled user."),
    local_lr: float = typer.Option(0.5, help="userdp/uedp: local learning rate."),
    delta: float = typer.Option(1e-5, help="Target delta."),
    accountant: str = typer.Option("pld", help="pld (tightest) or rdp."),
    seed: int = typer.Option(0, help="Seed of the initial weights (and, with --seeded only, of sampling and noise)."),
    seeded: bool = SEEDED_OPTION,
    public_count: Optional[int] = PUBLIC_COUNT_OPTION,
    count_noise: float = COUNT_NOISE_OPTION,
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    checkpoint_every: int = typer.Option(25, help="Save a resumable checkpoint every N rounds (0: never)."),
    log_model: bool = typer.Option(False, help="Store the trained model in the MLflow run."),
    canaries: int = typer.Option(0, help="Plant N made-up secrets in the training text (for `uedp attack`)."),
    canary_repeats: int = typer.Option(1, help="Times each canary is planted."),
    canary_formats: str = typer.Option("digits:6", help="Comma-separated: digits:N, name, phone, email."),
    canary_users: Optional[str] = typer.Option(None, help="Comma-separated users whose text hosts the canaries "
                                               "(default: users drawn at random)."),
    processes: int = typer.Option(1, help=PROCESSES_HELP),
    store: Optional[str] = typer.Option(None, help=STORE_HELP),
    embeddings: Optional[str] = EMBEDDINGS_OPTION,
    k: int = K_OPTION,
    sanitize_strategy: str = SANITIZE_STRATEGY_OPTION,
    keep: str = KEEP_OPTION,
    attack_model: Optional[Path] = ATTACK_MODEL_OPTION,
    home: Optional[Path] = HOME_OPTION,
) -> None:
    """Train one configuration and log it to MLflow; prints the run id.

    Rerunning the same configuration after a crash resumes from its last checkpoint (weights, random
    generators and accountant), continuing the same MLflow run.
    """
    data_home = _prepare_runtime(home)
    from uedp.tasks.config import TrainConfig
    from uedp.tasks.tracking import ui_command
    from uedp.tasks.train import run_training

    if noise_multiplier is not None and target_epsilon is not None:
        raise UedpError("give at most one of --noise-multiplier and --target-epsilon")
    config = TrainConfig(
        dataset=dataset, mechanism=mechanism, model=model, model_size=model_config, tokenizer=tokenizer,  # type: ignore[arg-type]
        categories=categories, steps=steps, public_steps=public_steps, batch_size=batch_size, lr=lr, max_len=max_len,
        q_user=q_user, q_entity=q_entity, q_extended=q_extended,
        noise_multiplier=noise_multiplier if noise_multiplier is not None or target_epsilon else 1.0,
        target_epsilon=target_epsilon, max_epsilon=max_epsilon, clip=clip, hidden_clip=hidden_clip, local_steps=local_steps,
        local_lr=local_lr, delta=delta, accountant=accountant, seed=seed, device=device,  # type: ignore[arg-type]
        randomness="seeded" if seeded else "secure", public_count=public_count, count_noise=count_noise,
        checkpoint_every=checkpoint_every, log_model=log_model, canaries=canaries, canary_repeats=canary_repeats,
        canary_formats=_csv(canary_formats), canary_users=_csv(canary_users), processes=processes,
        local_dp=_local_dp(embeddings, k, sanitize_strategy, keep, attack_model),
    )
    result = run_training(data_home, config, store_url=store)
    if result.resumed_from:
        typer.echo(f"resumed from the checkpoint of round {result.resumed_from}")
    guarantee = (f"epsilon {_fmt(result.epsilon, 4)} at delta {result.delta:g}" if math.isfinite(result.epsilon)
                 else "no privacy guarantee")
    typer.echo(f"{config.run_name()}: {guarantee}; test {result.utility_metric} {result.utility_test:.4g} "
               f"after {result.rounds} rounds")
    if result.notes:
        typer.echo(f"note: {result.notes}")
    _print_guarantee(result)
    typer.echo(f"MLflow run: {result.run_id}   (browse: {ui_command(data_home)})")


@app.command()
@user_errors
def sweep(
    dataset: str = typer.Argument(..., help="An ingested and detected dataset."),
    mechanisms: str = typer.Option("noiseless,userdp,uedp", help=f"Comma-separated: {MECHANISMS_HELP}."),
    categories: list[str] = typer.Option(["PERSON,LOC,ORG"], help="A set of sensitive categories; repeat the "
                                         "option for several sets (e.g. --categories PERSON --categories PII)."),
    epsilons: Optional[str] = typer.Option(None, help="Comma-separated target epsilons for every private mechanism."),
    noise_multiplier: float = typer.Option(1.0, help="Noise multiplier when no --epsilons are given."),
    seeds: str = typer.Option("0", help="Comma-separated seeds (initial weights; sampling and noise too with --seeded)."),
    seeded: bool = SEEDED_OPTION,
    public_count: Optional[int] = PUBLIC_COUNT_OPTION,
    model: str = typer.Option("gpt2", help=MODEL_HELP),
    model_config: str = typer.Option("tiny", "--model-config", help=MODEL_CONFIG_HELP),
    steps: int = typer.Option(300, help="Steps of noiseless, deid, dpsgd and selective."),
    rounds: int = typer.Option(30, help="Rounds of userdp, uedp and uedp-naive."),
    public_steps: int = typer.Option(300, help="selective: noiseless steps on the redacted corpus."),
    q_user: float = typer.Option(0.5, help="Sampling probability of a user per round."),
    q_entity: float = typer.Option(0.5, help="uedp: sampling probability of a detected entity."),
    q_extended: float = typer.Option(0.5, help="uedp: sampling probability of a sentence with no entity."),
    clip: float = typer.Option(1.0, help="L2 clipping bound (beta)."),
    delta: float = typer.Option(1e-5, help="Target delta."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    processes: int = typer.Option(1, help=PROCESSES_HELP),
    store: Optional[str] = typer.Option(None, help=STORE_HELP),
    embeddings: Optional[str] = EMBEDDINGS_OPTION,
    k: int = K_OPTION,
    sanitize_strategy: str = SANITIZE_STRATEGY_OPTION,
    keep: str = KEEP_OPTION,
    attack_model: Optional[Path] = ATTACK_MODEL_OPTION,
    home: Optional[Path] = HOME_OPTION,
) -> None:
    """Train every mechanism x category set x epsilon x seed as a Prefect flow; nested MLflow runs under one
    parent, and a privacy-utility report (PNG plots + Markdown) on the parent run and under the data home."""
    data_home = _prepare_runtime(home)
    from uedp.flows.sweep import SweepConfig, sweep_flow
    from uedp.tasks.tracking import ui_command

    try:
        targets = [float(e) for e in _csv(epsilons)]
        seed_list = [int(s) for s in _csv(seeds)]
    except ValueError as exc:
        raise UedpError(f"--epsilons and --seeds take comma-separated numbers: {exc}") from None
    config = SweepConfig(
        home=str(data_home.root), dataset=dataset, mechanisms=_csv(mechanisms), category_sets=categories,  # type: ignore[arg-type]
        target_epsilons=targets, noise_multiplier=noise_multiplier, seeds=seed_list, model=model,  # type: ignore[arg-type]
        model_size=model_config, steps=steps, rounds=rounds, public_steps=public_steps, q_user=q_user,
        q_entity=q_entity, q_extended=q_extended, clip=clip, delta=delta, device=device, processes=processes,
        store=store, local_dp=_local_dp(embeddings, k, sanitize_strategy, keep, attack_model),
        randomness="seeded" if seeded else "secure", public_count=public_count,
    )
    from uedp.models.device import resolve_device

    resolve_device(device)
    typer.echo(f"uedp sweep: {len(config.train_configs())} configurations on {dataset!r}")
    outcome = sweep_flow(config)
    _print_summary(outcome.runs, title=f"uedp sweep on {dataset}")
    typer.echo(f"\nreport: {outcome.report[0] if outcome.report else '-'}")
    typer.echo(f"MLflow parent run: {outcome.parent_run_id}   (browse: {ui_command(data_home)})")


@app.command()
@user_errors
def attack(
    run_id: str = typer.Argument(..., help="The MLflow run id `uedp train` printed (trained with --log-model or --canaries)."),
    kind: str = typer.Option("all", help="canary, mia, extraction or all (comma-separated for several)."),
    limit: int = typer.Option(500, help="Membership inference: members and non-members sampled per level."),
    top_k: int = typer.Option(5, help="Extraction: beam width; an entity counts when it is among the top k."),
    extraction_limit: int = typer.Option(200, help="Extraction: entity occurrences tried at most."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    seed: int = typer.Option(0, help="Seed of the sampling of candidates."),
    reference_run: Optional[str] = typer.Option(None, help="Membership inference: calibrate against this run's "
                                                "model (one trained without the members, e.g. on public text)."),
    home: Optional[Path] = HOME_OPTION,
) -> None:
    """Attack a trained run and add the scores to that MLflow run: canary exposure, membership inference
    (sentence, user and entity level; ROC AUC, TPR at 1% and 0.1% FPR, balanced accuracy), entity
    extraction, and the empirical lower bound on epsilon they imply, next to the accounted epsilon."""
    data_home = _prepare_runtime(home)
    from uedp.tasks.attack import ATTACKS, attack_run
    from uedp.tasks.tracking import ui_command

    kinds = list(ATTACKS) if kind == "all" else _csv(kind)
    metrics = attack_run(data_home, run_id, kinds, limit=limit, top_k=top_k, extraction_limit=extraction_limit,
                         device_name=device, seed=seed, reference_run=reference_run)
    for name, value in sorted(metrics.items()):
        typer.echo(f"{name:<44} {value:.4g}")
    typer.echo(f"logged to MLflow run {run_id}   (browse: {ui_command(data_home)})")


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
    import threading

    from uedp.stack import LocalStack

    typer.echo(f"starting the uedp stack (logs: {data_home.root / 'stack'}) ...")
    with LocalStack(data_home, prefect_port, mlflow_port) as stack:
        typer.echo(f"Prefect UI  {stack.prefect_ui}   (deployments: uedp-ingest, uedp-detect, uedp-sweep, "
                   "uedp-pipeline, uedp-demo)")
        typer.echo(f"MLflow UI   {stack.mlflow_url}")
        typer.echo(f"CLI against it: export PREFECT_API_URL={stack.prefect_api} MLFLOW_TRACKING_URI={stack.mlflow_url}")
        typer.echo("Ctrl-C stops everything.")
        stopped = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stopped.set())
        try:
            stopped.wait()
        except KeyboardInterrupt:
            pass
    typer.echo("stack stopped")


@app.command()
@user_errors
def datasets(home: Optional[Path] = HOME_OPTION) -> None:
    """List the datasets in the data home with their tables and row counts."""
    data_home = _prepare_runtime(home)
    from uedp.storage.tables import read_manifest

    root = data_home.root / "datasets"
    names = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []
    if not names:
        typer.echo(f"no datasets under {data_home.root}; try `uedp ingest` or `uedp demo`")
        return
    for dataset in names:
        tables = []
        for table in ("sentences", "users", "entities"):
            manifest = read_manifest(data_home.table_dir(dataset, table))
            if manifest:
                tables.append(f"{table}={manifest['rows']}")
        typer.echo(f"{dataset}: {' '.join(tables) or '(no complete tables)'}")


def _check_before_running(config: Any) -> None:
    """Fail on bad settings before any work starts: the device, and the calibration of a target epsilon
    for userdp (uedp's depends on the number of users, known after ingest)."""
    from uedp.models.device import resolve_device
    from uedp.tasks.train import build_mechanism, planned_population

    resolve_device(config.device)
    for train_config in config.train_configs():
        if train_config.mechanism == "userdp" and train_config.target_epsilon is not None:
            build_mechanism(train_config, planned_population(train_config), n_examples=0)


def _print_summary(runs: list[Any], title: str = "uedp demo results") -> None:
    from rich.console import Console
    from rich.table import Table

    metric = runs[0].utility_metric if runs else "perplexity"
    table = Table(title=f"{title} (test {metric}; epsilon for the mechanism's privacy unit)")
    for column in ("mechanism", "categories", "epsilon", "delta", "z", "randomness", "rounds", metric, "MLflow run"):
        table.add_column(column, justify="right" if column in ("epsilon", "delta", "z", "rounds", metric) else "left")
    for r in runs:
        table.add_row(
            r.mechanism, ",".join(r.categories), _fmt(r.epsilon), f"{r.delta:g}" if r.delta else "-",
            f"{r.noise_multiplier:.3g}" if r.noise_multiplier else "-", r.randomness if r.randomness != "none" else "-",
            str(r.rounds), f"{r.utility_test:.4g}", r.run_id,
        )
    Console(width=160).print(table)
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
    for line in result.public:
        typer.echo(f"public: {line}")
    for caveat in result.caveats:
        typer.echo(f"not covered by epsilon: {caveat}")
    typer.echo(f"what this epsilon means: {PRIVACY_DOC}")


def main() -> None:
    """Console-script entry point."""
    sys.exit(app())


if __name__ == "__main__":
    main()
