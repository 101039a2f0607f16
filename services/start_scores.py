"""A pretrained start's held-out figures, scored once and remembered in the data home.

Every run from a saved model (SmolLM2, a checkpoint folder, a finished run's model) scores that model on
the valid split (its learning curve's step 0) and the test split (what fine-tuning is measured against)
before its first step. At 135M parameters on a CPU that is tens of minutes a run, paid again by every run
of a page that starts from the same model and by every resume of an interrupted one, for the same figure.

A figure is remembered under the content key of everything it is a function of: the start's weights (the
content hash the statement already names), how the run adapts them before training (LoRA's rank, scale
and target layers: its update starts at zero, so the start scores as itself, but the key does not rely on
it), the split's token ids, the padding id, and the source of the functions that score (``SCORING``). A changed
dataset, start or scoring code is scored afresh. Only language models are remembered: a classifier from
a language-model start gets a freshly drawn head, so its first figure is a function of the run's seed.

Privacy: the figures are on held-out text, outside every epsilon like every test figure, and each is
already an MLflow metric of the runs that scored it; the folder sits in the data home with the data.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from uedp.models import batching, metrics
from uedp.models.batching import Example
from uedp.services.config import TrainConfig
from uedp.services.initial_model import Start

SCORES_VERSION = 1


# What computes a figure: a language model's token-weighted perplexity over padded batches. Their source is
# hashed into every key, so a change to how a split is scored scores afresh while an edit elsewhere in the
# same modules (another metric, another attack) keeps what was remembered.
SCORING = (metrics.perplexity, metrics.causal_lm_nll, metrics.next_token_targets, batching.batches,
           batching.collate, batching.IGNORE)


def _code_identity() -> str:
    digest = hashlib.sha256()
    for part in SCORING:
        digest.update(inspect.getsource(part).encode() if callable(part) else repr(part).encode())
    return digest.hexdigest()


def examples_digest(examples: Sequence[Example]) -> str:
    """The content key of a split's examples: their token ids, in order, with their lengths."""
    digest = hashlib.sha256()
    for example in examples:
        if not isinstance(example, torch.Tensor):
            raise TypeError("only a language model's token-id examples have a remembered start figure")
        ids = example.detach().to("cpu", torch.int64).contiguous()
        digest.update(len(ids).to_bytes(8, "little"))
        digest.update(ids.numpy().tobytes())
    return digest.hexdigest()


def score_key(start: Start, config: TrainConfig, split: str, examples: Sequence[Example], pad_id: int) -> str:
    """The content key of ``start``'s figure on ``examples`` as ``config`` adapts it before training."""
    identity = {"version": SCORES_VERSION, "start": start.content_hash, "kind": start.kind, "split": split,
                "metric": config.utility_metric, "lora": [config.lora_rank, config.lora_scale if config.lora_rank else 0,
                                                         sorted(config.lora_targets)],
                "pad": pad_id, "examples": examples_digest(examples), "code": _code_identity()}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def remembers(start: Start | None, config: TrainConfig) -> bool:
    """Whether this run's start figures are remembered: a language model from saved, content-hashed weights."""
    return start is not None and bool(start.content_hash) and config.task != "classification"


def start_score(folder: Path | None, start: Start | None, config: TrainConfig, split: str,
                examples: Sequence[Example], pad_id: int, score: Callable[[], float]) -> float:
    """``score()``, the start's figure on ``examples``, remembered in ``folder`` (the data home's cache) where
    :func:`remembers` allows; a remembered figure is the one the same code computed for the same inputs."""
    if folder is None or start is None or not remembers(start, config):
        return score()
    target = folder / f"{score_key(start, config, split, examples, pad_id)}.json"
    if target.is_file():
        try:
            return float(json.loads(target.read_text(encoding="utf-8"))["value"])
        except (ValueError, KeyError, TypeError):
            pass  # a damaged entry: scored again, and rewritten whole below
    value = score()
    folder.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    partial.write_text(json.dumps({"value": value, "split": split, "start": start.content_hash}), encoding="utf-8")
    os.replace(partial, target)  # never half a figure
    return value
