"""The mask-token inference attack on sanitized text (the thesis' Table 3.7): the adversary sees a
privatized sentence, masks one position at a time and asks a masked language model what was there; a
position counts as inferred when the model's top prediction is the original token. A lower rate is
better protection; on unsanitized text the rate is the model's plain fill-in-the-blank accuracy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
