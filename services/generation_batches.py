"""A synthetic corpus sampled in whole batches that survive a crash: each batch's texts are kept, with the
sampling generator's state after it, in the data home until the corpus is written; the same command
again restores the generator and samples only the batches that are missing.

The texts come out the same as an uninterrupted run's (the batches and the order of draws are fixed by the
prompts, the settings and the seed), so the corpus, its content key and its guarantee are the same: a
kept batch is part of the release the corpus is, sampled from the run's released model and stored where
the corpus will be.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from uedp.models.sampling import SamplingSettings, sample_batches

BATCH_FILE = "batch-{:06d}.json"


def sample_resumably(folder: Path, model: Any, tokenizer: Any, prompts: Sequence[str], settings: SamplingSettings,
                     seed: int, batch_size: int, on_batch: Callable[[int], object] | None = None) -> list[str]:
    """The texts of :func:`models.sampling.sample_texts` with ``torch.Generator().manual_seed(seed)``, each
    batch kept in ``folder`` as it finishes; batches kept there by an interrupted call are read back, not
    sampled again. The caller removes ``folder`` once the corpus is written (:func:`forget`)."""
    import torch

    texts = [""] * len(prompts)
    generator = torch.Generator().manual_seed(seed)
    kept = 0
    while (path := folder / BATCH_FILE.format(kept)).is_file():
        batch = json.loads(path.read_text(encoding="utf-8"))
        for index, text in zip(batch["indices"], batch["texts"]):
            texts[index] = text
        generator.set_state(torch.tensor(batch["generator"], dtype=torch.uint8))
        kept += 1
        if on_batch is not None:
            on_batch(len(batch["indices"]))
    folder.mkdir(parents=True, exist_ok=True)
    for number, (chunk, finished) in enumerate(sample_batches(model, tokenizer, prompts, settings, generator,
                                                              batch_size, skip=kept), start=kept):
        for index, text in zip(chunk, finished):
            texts[index] = text
        _write_whole(folder / BATCH_FILE.format(number), {
            "indices": chunk, "texts": finished, "generator": generator.get_state().tolist()})
        if on_batch is not None:
            on_batch(len(chunk))
    return texts


def _write_whole(path: Path, data: dict[str, Any]) -> None:
    """``path`` written at once (a temporary file renamed over it): a crash mid-write leaves no half batch."""
    handle, temporary = tempfile.mkstemp(prefix=path.name, dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(data, out)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def forget(folder: Path) -> None:
    """The kept batches, once the corpus they make is written."""
    shutil.rmtree(folder, ignore_errors=True)
