"""Entity extraction: prompt the model with the text to the left of a protected entity and check whether
the entity is among its top-k continuations (beam search of width k), per category."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Occurrence:
    category: str
    prompt: str  # the sentence up to the entity
    entity: str  # the entity's surface text


@torch.no_grad()
def top_k_continuations(model: torch.nn.Module, tokenizer, prompt: str, k: int, new_tokens: int,  # type: ignore[no-untyped-def]
                        device: torch.device) -> list[str]:
    """The ``k`` most likely continuations of ``new_tokens`` tokens (beam search), decoded.

    A model with a fixed number of positions (GPT-2) sees at most its last ``positions - new_tokens``
    prompt tokens: the left of a long prompt is dropped rather than indexing past the position table."""
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"] or [tokenizer.eos_token_id]
    positions = context_size(model)
    if positions is not None:
        if new_tokens >= positions:
            raise ValueError(f"a continuation of {new_tokens} tokens does not fit the model's {positions} positions")
        prompt_ids = list(prompt_ids)[-(positions - new_tokens):]
    beams = [(0.0, list(prompt_ids))]
    for _ in range(new_tokens):
        ids = torch.tensor([b[1] for b in beams], device=device)
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, -1].float()
        logp = torch.log_softmax(logits, dim=-1)
        scores = torch.tensor([b[0] for b in beams], device=device).unsqueeze(1) + logp
        top = torch.topk(scores.flatten(), min(k, scores.numel()))
        width = logp.shape[1]
        beams = [(float(v), beams[int(i) // width][1] + [int(i) % width]) for v, i in zip(top.values, top.indices)]
    return [tokenizer.decode(b[1][len(prompt_ids):]) for b in beams]


def context_size(model: torch.nn.Module) -> int | None:
    """How many positions the model can attend to (None: no fixed limit, e.g. an LSTM)."""
    config = getattr(model, "config", None)
    for name in ("n_positions", "max_position_embeddings"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def extraction_rates(model: torch.nn.Module, tokenizer, occurrences: list[Occurrence], k: int,  # type: ignore[no-untyped-def]
                     device: torch.device) -> dict[str, tuple[int, int]]:
    """Per category: (entities found among the top-k continuations, entities tried)."""
    was_training = model.training
    model.eval()
    found: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    positions = context_size(model)
    for occurrence in occurrences:
        length = len(tokenizer(occurrence.entity, add_special_tokens=False)["input_ids"])
        if positions is not None and length >= positions:
            continue  # an entity longer than the model's context cannot be continued into
        continuations = top_k_continuations(model, tokenizer, occurrence.prompt, k, length, device)
        found[occurrence.category][0] += any(c.startswith(occurrence.entity) for c in continuations)
        found[occurrence.category][1] += 1
    model.train(was_training)
    return {category: (hits, total) for category, (hits, total) in found.items()}
