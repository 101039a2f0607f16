"""Utility metrics. Perplexity is token-weighted over the whole split: exp(total NLL / total tokens),
not a mean of per-batch perplexities (which over-weights short batches)."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from uedp.models.batching import IGNORE, Example, batches, collate, example_length


def next_token_targets(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The tokens a causal LM is scored on: every label but each row's first (nothing predicts it);
    padding is ``IGNORE``."""
    return batch["labels"][:, 1:]


def causal_lm_nll(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Summed next-token negative log-likelihood of a batch, and the number of predicted tokens."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    targets = next_token_targets(batch)
    nll = F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=IGNORE, reduction="sum"
    )
    return nll, int((targets != IGNORE).sum())


def causal_lm_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token loss of a batch (the training objective)."""
    nll, count = causal_lm_nll(model, batch)
    return nll / max(count, 1)


def per_sequence_lm_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean over sequences of each sequence's mean next-token loss.

    DP-SGD clips per-example gradients, so the batch loss must be a mean of per-example losses (a
    token-weighted batch mean would couple the examples). Position ids are passed explicitly, one row
    per example, so per-sample gradients of the position embedding are per example too.
    """
    rows, width = batch["input_ids"].shape
    positions = torch.arange(width, device=batch["input_ids"].device).expand(rows, width)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=positions).logits
    targets = next_token_targets(batch)
    nll = F.cross_entropy(logits[:, :-1].transpose(1, 2).float(), targets, ignore_index=IGNORE, reduction="none").sum(1)
    return (nll / (targets != IGNORE).sum(1).clamp(min=1)).mean()


def _predicted_tokens(examples: Sequence[Example]) -> int:
    """Tokens a causal LM is scored on in these examples: all but each one's first."""
    return sum(max(example_length(e) - 1, 0) for e in examples)


def batch_weight(loss_fn: Callable[..., torch.Tensor]) -> Callable[[Sequence[Example]], int] | None:
    """What ``loss_fn`` averages over in a batch of examples (predicted tokens for the token mean, examples for a
    mean over examples), so that a batch's loss is the weighted mean of its parts' losses; None for a loss
    not listed here (its batch is then read in one pass)."""
    weights: dict[Callable[..., torch.Tensor], Callable[[Sequence[Example]], int]] = {
        causal_lm_loss: _predicted_tokens, per_sequence_lm_loss: len, classification_loss: len}
    return weights.get(loss_fn)


@torch.no_grad()
def perplexity(
    model: torch.nn.Module, sequences: Sequence[torch.Tensor], pad_id: int, device: torch.device, batch_size: int = 32
) -> float:
    """Token-weighted perplexity of ``model`` over ``sequences``, read in batches of like lengths (a sum:
    the order changes nothing but the padding each batch computes)."""
    was_training = model.training
    model.eval()
    total_nll, total_tokens = 0.0, 0
    for batch in batches(sorted(sequences, key=len), batch_size, pad_id):
        batch = {k: v.to(device) for k, v in batch.items()}
        nll, count = causal_lm_nll(model, batch)
        total_nll += float(nll)
        total_tokens += count
    model.train(was_training)
    if total_tokens == 0:
        raise ValueError("perplexity of an empty split")
    mean = total_nll / total_tokens
    return math.exp(mean) if mean < 700 else math.inf  # a destroyed model has an infinite perplexity


def predicted_bytes(tokenizer: Any, sequences: Sequence[torch.Tensor]) -> int | None:
    """The UTF-8 bytes of the text a causal LM predicts in ``sequences``: each one's tokens after its first, as
    :func:`perplexity` scores them, with a text's end (its EOS) counted as one byte as :func:`text_scores`
    counts it. For a byte-level tokenizer only (GPT-2's scheme, SmolLM2's, uedp's byte tokenizer: every token
    spells bytes); None for any other (a word vocabulary with ``<unk>``), where a per-byte figure would count
    made-up text."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or type(backend.decoder).__name__ != "ByteLevel":
        return None
    # A byte-level vocabulary writes each byte as one character (GPT-2's byte-to-unicode table), so a token's
    # string is as long as the bytes it spells, a character split across tokens included.
    special, eos = set(tokenizer.all_special_ids), tokenizer.eos_token_id
    spelt = functools.lru_cache(maxsize=None)(
        lambda token: (1 if token == eos else 0) if token in special else len(tokenizer.convert_ids_to_tokens(token)))
    return sum(spelt(token) for sequence in sequences for token in sequence[1:].tolist())


def bits_per_byte(perplexity_value: float, tokens: int, n_bytes: int | None) -> float | None:
    """A perplexity over ``tokens`` predicted tokens as bits per UTF-8 byte of the text they spell, a unit that
    does not depend on the tokenizer, so models of different vocabularies compare (a perplexity per token does
    not: a byte model predicts five tokens where a BPE model predicts one). None without bytes.

    The text is what the run scored, which is not quite the same text across tokenizers: each text's first
    token is context, never scored (a byte for a byte model, a word-piece for BPE), and a text past the
    run's ``max_len`` tokens is cut (96 tokens are 96 bytes for a byte model). ``uedp evaluate``'s figure
    (:func:`text_scores`) scores the first token too, after an EOS, so the two differ slightly."""
    if not n_bytes or not math.isfinite(perplexity_value):
        return None
    return math.log2(perplexity_value) * tokens / n_bytes


def predicted_tokens(sequences: Sequence[torch.Tensor]) -> int:
    """The tokens :func:`perplexity` scores in ``sequences``: all but each one's first."""
    return sum(max(len(sequence) - 1, 0) for sequence in sequences)


def _classifier_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    # Explicit per-row position and token-type ids where the encoder takes them: Opacus needs every
    # embedding input to carry the batch dimension to compute per-example gradients (the models' own
    # defaults are broadcast buffers).
    ids = batch["input_ids"]
    inputs = {"input_ids": ids, "attention_mask": batch["attention_mask"]}
    module: torch.nn.Module = getattr(model, "_module", model)  # Opacus' GradSampleModule wraps it
    # A class is hashable; mypy misses that for a type[X] value (python/mypy#11470, #20409).
    accepted = _forward_arguments(type(module))  # type: ignore[arg-type]
    if "position_ids" in accepted:
        inputs["position_ids"] = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    if "token_type_ids" in accepted:
        inputs["token_type_ids"] = torch.zeros_like(ids)
    logits: torch.Tensor = model(**inputs).logits
    return logits


@functools.lru_cache(maxsize=32)
def _forward_arguments(model_class: type[torch.nn.Module]) -> frozenset[str]:
    """The keyword arguments a model class's ``forward`` takes (inspected once per class, not per batch)."""
    return frozenset(inspect.signature(model_class.forward).parameters)


def classification_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy over examples: already a mean of per-example losses, as DP-SGD needs."""
    return F.cross_entropy(_classifier_logits(model, batch).float(), batch["labels"])


@torch.no_grad()
def classification_error(model: torch.nn.Module, examples: Sequence[Example], pad_id: int, device: torch.device,
                         batch_size: int = 64) -> float:
    """Share of examples whose most likely class is not their label (the UeDP paper's test error)."""
    if not examples:
        raise ValueError("classification error of an empty split")
    was_training = model.training
    model.eval()
    wrong = 0
    for batch in batches(examples, batch_size, pad_id):
        batch = {k: v.to(device) for k, v in batch.items()}
        wrong += int((_classifier_logits(model, batch).argmax(-1) != batch["labels"]).sum())
    model.train(was_training)
    return wrong / len(examples)


@torch.no_grad()
def sequence_nll(model: torch.nn.Module, sequences: Sequence[torch.Tensor], pad_id: int, device: torch.device,
                 batch_size: int = 256) -> torch.Tensor:
    """Summed next-token NLL of each sequence (its log-perplexity times its length), in input order;
    and with it each sequence's number of predicted tokens, as a (n, 2) tensor of float64. Read in batches
    of like lengths, put back in input order."""
    was_training = model.training
    model.eval()
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    out = []
    for batch in batches([sequences[i] for i in order], batch_size, pad_id):
        batch = {k: v.to(device) for k, v in batch.items()}
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        targets = next_token_targets(batch)
        nll = F.cross_entropy(logits[:, :-1].transpose(1, 2).float(), targets, ignore_index=IGNORE, reduction="none")
        out.append(torch.stack([nll.sum(1).double(), (targets != IGNORE).sum(1).double()], dim=1).cpu())
    model.train(was_training)
    if not out:
        return torch.zeros((0, 2), dtype=torch.float64)
    in_input_order = torch.empty((len(order), 2), dtype=torch.float64)
    in_input_order[torch.tensor(order)] = torch.cat(out)
    return in_input_order


def common_prefix_length(sequences: Sequence[torch.Tensor]) -> int:
    """How many leading tokens every sequence shares, leaving each at least one token of its own."""
    first = sequences[0]
    length = min(len(s) for s in sequences) - 1
    for s in sequences[1:]:
        differs = (s[:length] != first[:length]).nonzero()
        length = int(differs[0]) if len(differs) else length
    return max(length, 0)


@torch.no_grad()
def sequence_nll_shared_prefix(model: torch.nn.Module, sequences: Sequence[torch.Tensor], pad_id: int,
                               device: torch.device, batch_size: int = 256) -> torch.Tensor:
    """:func:`sequence_nll` for sequences that share a long token prefix (the candidates of a canary: "Call me
    on 555-" then four digits), the prefix read once and kept in the model's key/value cache. Each sequence's
    summed NLL is the prefix's (the same for all) plus its own tokens' given the prefix: the same figure up to
    float rounding, for a fraction of the compute (the candidates' own tokens only). A model without a cache
    (the LSTM), or sequences with less than two shared tokens, are scored whole by :func:`sequence_nll`."""
    import copy

    from uedp.models.sampling import keeps_a_cache

    shared = common_prefix_length(sequences) if sequences else 0
    if shared < 2 or not keeps_a_cache(model):
        return sequence_nll(model, sequences, pad_id, device, batch_size)
    was_training = model.training
    model.eval()
    try:
        prefix = sequences[0][:shared].to(device)[None]
        read = model(input_ids=prefix, attention_mask=torch.ones_like(prefix), use_cache=True)
        prefix_nll = F.cross_entropy(read.logits[0, :-1].float(), prefix[0, 1:], reduction="sum").double()
        last = read.logits[:, -1:].float()  # what predicts each sequence's first own token
        out = []
        for start in range(0, len(sequences), batch_size):
            batch = collate([s[shared:] for s in sequences[start:start + batch_size]], pad_id)
            ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
            rows = ids.size(0)
            cache = copy.deepcopy(read.past_key_values)
            cache.batch_repeat_interleave(rows)
            positions = torch.arange(shared, shared + ids.size(1), device=device).expand(rows, -1)
            logits = model(input_ids=ids, attention_mask=torch.cat([torch.ones(rows, shared, dtype=mask.dtype,
                                                                              device=device), mask], dim=1),
                           position_ids=positions, past_key_values=cache, use_cache=True).logits.float()
            predicting = torch.cat([last.expand(rows, -1, -1), logits[:, :-1]], dim=1)
            targets = batch["labels"].to(device)
            nll = F.cross_entropy(predicting.transpose(1, 2), targets, ignore_index=IGNORE, reduction="none")
            out.append(torch.stack([nll.sum(1).double() + prefix_nll,
                                    (targets != IGNORE).sum(1).double() + (shared - 1)], dim=1).cpu())
        return torch.cat(out)
    finally:
        model.train(was_training)


def baseline_errors(labels: Sequence[int], n_classes: int) -> dict[str, float]:
    """The error rates a classifier must beat to have learnt anything, on the split whose labels these are:
    ``majority`` always answers that split's most frequent class (the best constant answer), ``uniform``
    guesses uniformly among the ``n_classes`` classes (in expectation)."""
    if not labels or n_classes < 1:
        raise ValueError("baseline errors need labels and at least one class")
    counts = torch.bincount(torch.as_tensor(list(labels)), minlength=n_classes)
    return {"majority": 1.0 - float(counts.max()) / len(labels), "uniform": 1.0 - 1.0 / n_classes}


def output_vocabulary_size(model: torch.nn.Module) -> int:
    """How many tokens ``model`` predicts among: its output layer's width (a Hugging Face model's or a LoRA
    wrapper's output embeddings), else its configuration's ``vocab_size`` (the LSTM). The model's, not the
    tokenizer's: a checkpoint may predict over more ids than its tokenizer makes, and its perplexity is
    spread over all of them."""
    get_output = getattr(model, "get_output_embeddings", None)
    size = getattr(get_output() if callable(get_output) else None, "out_features", None)
    if isinstance(size, int):
        return size
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    if not isinstance(size, int):
        raise ValueError(f"{type(model).__name__} names no output vocabulary size")
    return size


def uniform_perplexity(vocab_size: int) -> float:
    """The perplexity of guessing every next token uniformly over the vocabulary: exactly its size, on any
    split. A language model at or above it has learnt nothing; it depends on no data at all."""
    if vocab_size < 1:
        raise ValueError("a vocabulary has at least one token")
    return float(vocab_size)


def unigram_perplexity(fit_sequences: Sequence[torch.Tensor], eval_sequences: Sequence[torch.Tensor],
                       vocab_size: int, pad_id: int) -> float:
    """The token-weighted perplexity on ``eval_sequences`` of a unigram model (each token's frequency in
    ``fit_sequences``, context ignored) with add-one smoothing over the ``vocab_size`` tokens.

    A model above it has not even learnt which tokens are common. Both splits count the targets that
    :func:`perplexity` scores (every token but each sequence's first; padding never), so the figures are
    comparable. Smoothing gives an unseen token a finite cost, and float64 log-probabilities keep the sum
    over a large split exact enough to compare with the model's."""
    counts = torch.bincount(_targets_of(fit_sequences, pad_id), minlength=vocab_size).double()
    targets = _targets_of(eval_sequences, pad_id)
    if targets.numel() == 0:
        raise ValueError("perplexity of an empty split")
    if len(counts) > vocab_size or int(targets.max()) >= vocab_size:
        raise ValueError(f"a token id is outside the vocabulary of {vocab_size}")
    log_probabilities = torch.log1p(counts) - math.log(float(counts.sum()) + vocab_size)
    return math.exp(-float(log_probabilities[targets].sum()) / targets.numel())


def _targets_of(sequences: Sequence[torch.Tensor], pad_id: int) -> torch.Tensor:
    """Every scored target of ``sequences``, flat, from the padded batches :func:`perplexity` scores."""
    flat = []
    for batch in batches(sequences, 256, pad_id):
        targets = next_token_targets(batch)
        flat.append(targets[targets != IGNORE])
    return torch.cat(flat) if flat else torch.zeros(0, dtype=torch.long)


def text_scores(model: torch.nn.Module, tokenizer: Any, texts: Sequence[str], max_len: int, device: torch.device,
                batch_size: int = 16) -> dict[str, float]:
    """A causal LM's ``perplexity`` per token and ``bits_per_byte`` on ``texts``.

    Each text is encoded as runs encode a split (its tokens and EOS, cut at ``max_len`` tokens: a cut text
    has no EOS) and preceded by EOS as context. ``perplexity`` scores the tokens runs score (all but each
    text's first, which is context there; here the leading EOS is context too, which runs do not give).
    ``bits_per_byte`` compares across tokenizers: every token is scored, the first included, and the summed
    NLL in bits is divided by the UTF-8 bytes of the text those tokens cover (the characters up to the last
    kept token's end, by the tokenizer's offsets), plus one byte for each text's end where its EOS is kept."""
    eos = tokenizer.eos_token_id
    encoded = tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True)
    sequences, scored_bytes = [], 0
    for text, row, offsets in zip(texts, encoded["input_ids"], encoded["offset_mapping"]):
        body = (row + [eos])[: max_len - 1]  # as batching.encode, one place left for the leading EOS
        kept = len(body) - (1 if len(body) == len(row) + 1 else 0)  # the text's own tokens kept
        ends = len(body) > kept
        covered = text[: offsets[kept - 1][1]] if kept else ""
        sequences.append(torch.tensor([eos, *body], dtype=torch.long))
        scored_bytes += len(covered.encode("utf-8")) + (1 if ends else 0)
    was_training = model.training
    model.eval()
    all_nll, run_nll, run_tokens = 0.0, 0.0, 0
    with torch.no_grad():
        for batch in batches(sequences, batch_size, eos):
            batch = {k: v.to(device) for k, v in batch.items()}
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            targets = next_token_targets(batch)
            nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(), targets.reshape(-1),
                                  ignore_index=IGNORE, reduction="none").view_as(targets)
            all_nll += float(nll.sum())
            later = targets.clone()  # as runs score a text: its first token is context
            later[:, 0] = IGNORE
            run_nll += float(nll[later != IGNORE].sum())
            run_tokens += int((later != IGNORE).sum())
    model.train(was_training)
    if run_tokens == 0 or scored_bytes == 0:
        raise ValueError("no tokens to score")
    mean = run_nll / run_tokens
    return {"perplexity": math.exp(mean) if mean < 700 else math.inf,
            "bits_per_byte": all_nll / math.log(2) / scored_bytes, "records": float(len(sequences)),
            "tokens": float(run_tokens), "bytes": float(scored_bytes)}
