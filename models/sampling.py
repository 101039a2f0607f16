"""Sampling text from a causal language model: temperature and nucleus (top-p) sampling, one token at a
time, for every model kind uedp trains (GPT-2 and other Hugging Face causal LMs, LoRA adapters, the LSTM).

A Hugging Face model (LoRA-wrapped or not) keeps a key/value cache: the prompt is read once, then each step
reads only the token just drawn, so a text of n tokens costs n forward steps of one token instead of n
forwards of the whole prefix. Prompts of one batch may differ in length: they are padded on the left,
masked out of attention, and each row's positions count its own tokens only, so a prompt continues the
same way alone or beside a longer one. A model without that cache interface (uedp's LSTM) reads the
whole prefix at every step, its prompts grouped by length so that no padding enters a prefix.

Every draw comes from the ``torch.Generator`` passed in, so a seed gives the same texts again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingSettings:
    """How each next token is drawn. ``temperature`` 0 is greedy decoding (the most likely token)."""

    max_new_tokens: int = 48
    temperature: float = 1.0
    top_p: float = 0.95

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def next_tokens(logits: torch.Tensor, settings: SamplingSettings, generator: torch.Generator) -> torch.Tensor:
    """One token per row of ``logits`` (rows x vocabulary): the smallest set of most likely tokens whose
    probability reaches ``top_p`` (always at least the most likely one), renormalised, at ``temperature``."""
    logits = logits.float()
    if settings.temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / settings.temperature, dim=-1)
    if settings.top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the tokens ranked above each one
        sorted_probs = sorted_probs.masked_fill(before >= settings.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    drawn = torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1)
    return drawn.to(logits.device)


def keeps_a_cache(model: torch.nn.Module) -> bool:
    """Whether ``model`` takes ``past_key_values`` and ``position_ids``: a Hugging Face causal LM, bare or
    wrapped by peft (its ``config`` says ``use_cache``); uedp's LSTM does not."""
    config = getattr(model, "config", None)
    return config is not None and hasattr(config, "use_cache") and not getattr(config, "is_encoder_decoder", False)


@torch.no_grad()
def continue_prompts(model: torch.nn.Module, prompts: torch.Tensor | Sequence[Sequence[int]], eos_id: int,
                     settings: SamplingSettings, generator: torch.Generator) -> list[list[int]]:
    """Each prompt (a rows x length tensor, or token lists of any lengths for a model that keeps a cache)
    continued until it draws ``eos_id`` or has ``max_new_tokens`` new tokens; returns the new tokens of
    each row, the EOS left out. Rows draw in order from ``generator``, one token each per step."""
    rows = prompts.tolist() if isinstance(prompts, torch.Tensor) else [list(r) for r in prompts]
    if not rows or any(not r for r in rows):
        raise ValueError("every prompt needs at least one token (an empty text starts after EOS)")
    was_training = model.training
    model.eval()
    try:
        if keeps_a_cache(model):
            new = _continue_cached(model, rows, eos_id, settings, generator)
        else:
            if len({len(r) for r in rows}) > 1:
                raise ValueError("a model without a key/value cache continues prompts of one length per batch")
            new = _continue_whole_prefix(model, rows, eos_id, settings, generator)
    finally:
        model.train(was_training)
    return [row[: row.index(eos_id)] if eos_id in row else row for row in new]


def _continue_cached(model: torch.nn.Module, rows: list[list[int]], eos_id: int, settings: SamplingSettings,
                     generator: torch.Generator) -> list[list[int]]:
    """The prompts left-padded and read once; then one token a step against the key/value cache."""
    device = next(model.parameters()).device
    width = max(len(r) for r in rows)
    ids = torch.tensor([[eos_id] * (width - len(r)) + r for r in rows], dtype=torch.long, device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=device)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    output = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    done = torch.zeros(len(rows), dtype=torch.bool, device=device)
    drawn: list[torch.Tensor] = []
    last = positions[:, -1:]
    for step in range(settings.max_new_tokens):
        token = next_tokens(output.logits[:, -1, :], settings, generator)
        token = torch.where(done, torch.full_like(token, eos_id), token)
        drawn.append(token)
        done |= token == eos_id
        if bool(done.all()) or step + 1 == settings.max_new_tokens:
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        last = last + 1
        output = model(input_ids=token[:, None], attention_mask=mask, position_ids=last,
                       past_key_values=output.past_key_values, use_cache=True)
    return torch.stack(drawn, dim=1).tolist()


def _continue_whole_prefix(model: torch.nn.Module, rows: list[list[int]], eos_id: int, settings: SamplingSettings,
                           generator: torch.Generator) -> list[list[int]]:
    """The model read on the whole prefix at every step (a model without a cache; prompts of one length)."""
    device = next(model.parameters()).device
    ids = torch.tensor(rows, dtype=torch.long, device=device)
    done = torch.zeros(ids.size(0), dtype=torch.bool, device=device)
    for _ in range(settings.max_new_tokens):
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, -1, :]
        token = next_tokens(logits, settings, generator)
        token = torch.where(done, torch.full_like(token, eos_id), token)
        ids = torch.cat([ids, token[:, None]], dim=1)
        done |= token == eos_id
        if bool(done.all()):
            break
    return ids[:, len(rows[0]):].tolist()


def sample_texts(model: torch.nn.Module, tokenizer: object, prompts: Sequence[str], settings: SamplingSettings,
                 generator: torch.Generator, batch_size: int = 32,
                 on_batch: Callable[[int], object] | None = None) -> list[str]:
    """One text per prompt: the prompt followed by the model's continuation. An empty prompt starts after
    the end-of-text token (uedp encodes a text as its tokens and EOS, so EOS is where one text ends and the
    next may begin). ``on_batch`` is called with the number of texts each batch finished."""
    texts = [""] * len(prompts)
    for chunk, finished in sample_batches(model, tokenizer, prompts, settings, generator, batch_size):
        for index, text in zip(chunk, finished):
            texts[index] = text
        if on_batch is not None:
            on_batch(len(chunk))
    return texts


def sample_batches(model: torch.nn.Module, tokenizer: object, prompts: Sequence[str], settings: SamplingSettings,
                   generator: torch.Generator, batch_size: int = 32,
                   skip: int = 0) -> Iterator[tuple[list[int], list[str]]]:
    """The texts of :func:`sample_texts`, a batch at a time: (the prompts' indices, their texts). Batches are
    the prompts in order (grouped by length first for a model without a cache), so they are the same
    whatever ``skip``: the first ``skip`` batches are passed over without drawing, for a caller that kept
    them and restored ``generator`` to its state after them (a generation resumed after a crash)."""
    eos = int(tokenizer.eos_token_id)  # type: ignore[attr-defined]
    encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] if p else [] for p in prompts]  # type: ignore[operator]
    starts = [ids or [eos] for ids in encoded]
    cached = keeps_a_cache(model)
    order = list(range(len(prompts)))
    if not cached:
        order.sort(key=lambda i: len(starts[i]))  # stable: one length per batch below
    chunks: list[list[int]] = []
    for index in order:
        if chunks and len(chunks[-1]) < batch_size and (cached or len(starts[chunks[-1][0]]) == len(starts[index])):
            chunks[-1].append(index)
        else:
            chunks.append([index])
    for chunk in chunks[skip:]:
        new = continue_prompts(model, [starts[i] for i in chunk], eos, settings, generator)
        yield chunk, [tokenizer.decode(encoded[i] + row, skip_special_tokens=True).strip()  # type: ignore[attr-defined]
                      for i, row in zip(chunk, new)]
