"""A model scored on a dataset's held-out split without training it (``uedp evaluate``): what a start, a
run's model or any checkpoint folder scores on your own test text, the figure a run's ``perplexity_test``
is (the same encoding and average), with bits per byte beside it, which compares across tokenizers.

Nothing is released from the train split: only ``valid`` and ``test`` are scored. Like every test figure,
the score is computed without noise on held-out writers' text, outside every epsilon, and charged to no
budget (docs/PRIVACY.md, "What no epsilon covers").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uedp.errors import UedpError
from uedp.services.run_ids import is_run_id
from uedp.storage.catalog import Catalog, require_ingested
from uedp.storage.home import DataHome

HELD_OUT = ("valid", "test")
HELD_OUT_NOTE = ("held-out text: computed without noise on the split's writers, outside every epsilon and charged to "
                 "no budget, like every test figure")


@dataclass(frozen=True)
class Evaluation:
    model: str  # what was scored, in words
    dataset: str
    split: str
    texts: int
    perplexity: float  # per token, as runs score their test split (comparable with a run's perplexity_test)
    bits_per_byte: float  # every token's NLL in bits over the UTF-8 bytes scored: across tokenizers

    def line(self) -> str:
        return (f"{self.model} on {self.dataset!r} {self.split} ({self.texts:,} texts): perplexity "
                f"{self.perplexity:.4g} per token, {self.bits_per_byte:.3f} bits per byte")


def resolve_model(home: DataHome, reference: str, device: Any) -> tuple[Any, Any, str]:
    """The model, its tokenizer and its name in words: an MLflow run's logged model (its 32-hex id), a packaged
    base this home installed (``uedp base NAME``), or a checkpoint folder."""
    from uedp.models.checkpoints import checkpoint_kind
    from uedp.models.saving import load_saved
    from uedp.models.tokenization import load_tokenizer
    from uedp.services.packaged_bases import PACKAGED_BASES, base_folder

    if is_run_id(reference):
        from uedp.services.logged_run import load_logged_run
        from uedp.services.tracking import RunTracker

        run = load_logged_run(RunTracker.attach(home, reference), device, "uedp evaluate")
        return run.model, run.tokenizer, f"run {reference[:8]} ({run.config.label})"
    if reference in PACKAGED_BASES:
        folder = base_folder(home, reference)
        if not folder.is_dir():
            raise UedpError(f"{reference}: not installed in {home.root}; run `uedp base {reference}` first")
        name = f"{PACKAGED_BASES[reference].model} (uedp base {reference})"
    else:
        folder = Path(reference).expanduser()
        if not folder.is_dir():
            raise UedpError(f"{reference}: neither a run id, a packaged base ({', '.join(PACKAGED_BASES)}) nor a "
                            "checkpoint folder")
        name = f"folder {folder}"
    kind = checkpoint_kind(folder)
    if kind != "causal-lm":
        raise UedpError(f"{folder}: a {kind}; uedp evaluate scores language models (perplexity)")
    return load_saved(folder, kind).to(device), load_tokenizer(folder), name


def evaluate(home: DataHome, reference: str, dataset: str, split: str = "test", max_len: int = 96,
             limit: int | None = None, device_name: str = "auto") -> Evaluation:
    """Score ``reference`` (:func:`resolve_model`) on ``dataset``'s held-out ``split`` (its first ``limit``
    texts when given)."""
    from uedp.models.batching import encode
    from uedp.models.device import resolve_device
    from uedp.models.metrics import perplexity, text_scores

    if split not in HELD_OUT:
        raise UedpError(f"--split {split}: only held-out text is scored ({' or '.join(HELD_OUT)}); the train split is "
                        "what private runs protect, and a figure on it is a release no epsilon covers")
    require_ingested(home, dataset)
    with Catalog(home, dataset) as catalog:
        texts = [text for _, _, text in catalog.sentences(split)]
    texts = texts[:limit] if limit else texts
    if not texts:
        raise UedpError(f"dataset {dataset!r} has no {split} sentences to score")
    device = resolve_device(device_name)
    model, tokenizer, name = resolve_model(home, reference, device)
    model.eval()
    per_token = perplexity(model, encode(tokenizer, texts, max_len), tokenizer.pad_token_id, device)
    bits = text_scores(model, tokenizer, texts, max_len, device)["bits_per_byte"]
    return Evaluation(name, dataset, split, len(texts), float(per_token), float(bits))
