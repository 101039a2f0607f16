"""The mask-token inference attack on sanitized text (the thesis' Table 3.7): the adversary sees a
privatized sentence, masks one position at a time and asks a masked language model what was there; a
position counts as inferred when the model's top prediction is the original token. A lower rate is
better protection; on unsanitized text the rate is the model's plain fill-in-the-blank accuracy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

# (sentences as word lists, the position to mask in each) -> the predicted word for each
Predictor = Callable[[list[list[str]], list[int]], list[str]]


def inference_success(original: Sequence[Sequence[str]], sanitized: Sequence[Sequence[str]], predict: Predictor,
                      only: Sequence[Sequence[bool]] | None = None, batch_size: int = 64) -> float:
    """Share of the attacked positions whose original word the predictor recovers from the sanitized
    context (case-insensitive). ``only`` restricts the attack to some positions (e.g. sanitized ones)."""
    jobs = [(i, j) for i, words in enumerate(sanitized) for j in range(len(words))
            if only is None or only[i][j]]
    if not jobs:
        return float("nan")
    hits = 0
    for start in range(0, len(jobs), batch_size):
        chunk = jobs[start:start + batch_size]
        guesses = predict([list(sanitized[i]) for i, _ in chunk], [j for _, j in chunk])
        hits += sum(guess.strip().lower() == original[i][j].lower() for (i, j), guess in zip(chunk, guesses))
    return hits / len(jobs)


def load_predictor(folder: Path, device: torch.device) -> Predictor:
    """The attacker saved in ``folder``: a :class:`~uedp.privacy.attacks.cloze.BigramCloze` (built offline
    from public text), or any Hugging Face masked LM saved with ``save_pretrained`` (e.g. bert-base)."""
    from uedp.privacy.attacks.cloze import BigramCloze

    if BigramCloze.is_saved_in(folder):
        return BigramCloze.load(folder).predict
    if not (folder / "config.json").is_file():
        raise ValueError(f"attack model {folder} holds neither a bigram cloze model nor a masked language model "
                         "saved with save_pretrained (config.json)")
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    return masked_lm_predictor(AutoModelForMaskedLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder), device)


def masked_lm_predictor(model: torch.nn.Module, tokenizer: object, device: torch.device) -> Predictor:
    """A Hugging Face masked LM (``AutoModelForMaskedLM``) as the attack's predictor: the masked word
    becomes one mask token; the guess is the top token at that position."""
    mask = tokenizer.mask_token  # type: ignore[attr-defined]
    if mask is None:
        raise ValueError("the attack model's tokenizer has no mask token: use a masked language model (BERT-like)")
    model.eval().to(device)

    @torch.no_grad()
    def predict(sentences: list[list[str]], positions: list[int]) -> list[str]:
        texts = [" ".join(mask if k == j else w for k, w in enumerate(words)) for words, j in zip(sentences, positions)]
        batch = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=256)  # type: ignore[operator]
        batch = {k: v.to(device) for k, v in batch.items()}
        logits = model(**batch).logits
        where = batch["input_ids"] == tokenizer.mask_token_id  # type: ignore[attr-defined]
        guesses = []
        for row in range(len(texts)):
            found = where[row].nonzero()
            if len(found) == 0:  # the mask was truncated away
                guesses.append("")
                continue
            best = int(logits[row, int(found[0])].argmax())
            guesses.append(tokenizer.convert_tokens_to_string(tokenizer.convert_ids_to_tokens([best])))  # type: ignore[attr-defined]
        return guesses

    return predict


def train_masked_lm(texts: Sequence[str], folder: Path, steps: int = 250, seed: int = 0, hidden: int = 64,
                    layers: int = 2, batch_size: int = 32, mask_share: float = 0.2) -> Path:
    """A small BERT masked LM with a word-level (lower-case) vocabulary of ``texts``, trained on them and
    saved with ``save_pretrained`` into ``folder``: the Hugging Face path of the attack, built offline.

    In real use the attacker takes a pretrained BERT. Trained here on a few thousand sentences it learns
    little more than word frequency (see :mod:`uedp.privacy.attacks.cloze`, the stronger attacker at that
    size); on a small, repetitive corpus it learns the text well enough to test the attack's path.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast

    from uedp.privacy.sanitization.embeddings import words_of

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    spaced = [" ".join(words_of(t)) for t in texts]
    vocabulary = sorted({w.lower() for t in spaced for w in t.split()})
    vocab = {w: i for i, w in enumerate(specials + vocabulary)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.normalizer = normalizers.Lowercase()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                        sep_token="[SEP]", mask_token="[MASK]")  # type: ignore[no-untyped-call]
    torch.manual_seed(seed)
    model = BertForMaskedLM(BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers,
                                       num_attention_heads=2, intermediate_size=2 * hidden, max_position_embeddings=128))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        batch = tokenizer([spaced[i] for i in torch.randint(len(spaced), (batch_size,), generator=generator)],
                          return_tensors="pt", padding=True, truncation=True, max_length=64)
        labels = batch["input_ids"].clone()
        chosen = (torch.rand(labels.shape, generator=generator) < mask_share) & (batch["attention_mask"] == 1)
        labels[~chosen] = -100
        batch["input_ids"] = batch["input_ids"].masked_fill(chosen, tokenizer.mask_token_id)
        loss = model(**batch, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
