"""BERT-style sequence classifiers (the UeDP paper's AG News task): any encoder checkpoint through
``AutoModelForSequenceClassification.from_pretrained`` (local path or hub name), or a BERT built from
a size preset for small runs and tests."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification, PreTrainedModel

from uedp.errors import UedpError
from uedp.models.gpt2 import refuse_missing_weights
from uedp.models.presets import BERT_PRESETS

# Names of the classification heads transformers adds on top of an encoder (BERT, RoBERTa, DistilBERT,
# decoder models): what a checkpoint of the encoder alone may lack.
CLASSIFICATION_HEADS = ("classifier.", "pre_classifier.", "score.")


def build_bert_classifier(preset: str, vocab_size: int, num_labels: int, pad_token_id: int) -> BertForSequenceClassification:
    """A freshly initialised BERT classifier of a preset size; dropout off so seeded runs replay exactly."""
    if preset not in BERT_PRESETS:
        raise UedpError(f"unknown BERT preset {preset!r}; valid: {', '.join(BERT_PRESETS)} or a checkpoint path")
    # num_labels reaches PreTrainedConfig through **kwargs, which transformers' dataclass __init__ does not declare
    config = BertConfig(vocab_size=vocab_size, num_labels=num_labels,  # type: ignore[call-arg]
                        pad_token_id=pad_token_id, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        **BERT_PRESETS[preset])
    return BertForSequenceClassification(config)


def load_classifier(name_or_path: str | Path, num_labels: int) -> PreTrainedModel:
    """An encoder checkpoint with a fresh classification head of ``num_labels`` classes; any other weight
    missing from the checkpoint is refused (it would start from random values)."""
    try:
        model: PreTrainedModel
        model, info = AutoModelForSequenceClassification.from_pretrained(
            str(name_or_path), num_labels=num_labels, dtype=torch.float32, output_loading_info=True
        )
    except (OSError, ValueError) as exc:
        raise UedpError(
            f"cannot load an encoder from {name_or_path!r}: {str(exc).splitlines()[0]} "
            "(download one once, e.g. `huggingface-cli download bert-base-uncased --local-dir <dir>`, and pass that dir)"
        ) from None
    refuse_missing_weights(name_or_path, info["missing_keys"], fresh=CLASSIFICATION_HEADS)
    return model


def load_trained_classifier(path: str | Path) -> PreTrainedModel:
    """A classifier uedp trained and saved (head included): every weight must be in the folder."""
    model: PreTrainedModel
    model, info = AutoModelForSequenceClassification.from_pretrained(str(path), dtype=torch.float32,
                                                                     output_loading_info=True)
    refuse_missing_weights(path, info["missing_keys"])
    return model
