"""A canary's candidates share a long prefix ("Call me on 555-" then four digits); scoring them with the prefix
read once into the key/value cache (models.metrics.sequence_nll_shared_prefix) must give each candidate the
summed NLL (up to float rounding) and the token count that reading it whole gives, for every model kind the
attacks score, and so the same exposure."""

from __future__ import annotations

import pytest
import torch

from uedp.models.batching import encode
from uedp.models.metrics import common_prefix_length, sequence_nll, sequence_nll_shared_prefix
from uedp.privacy.attacks.canaries import Canary, canary_format, exposure, model_log_perplexity

from support import TOKENIZER, tiny_causal_models

PHONE = canary_format("phone")


MODELS = tiny_causal_models()


def _candidates(count: int) -> list[torch.Tensor]:
    texts = [PHONE.template.format(secret=PHONE.secret_at(i)) for i in range(0, 10_000, 10_000 // count)]
    return encode(TOKENIZER, texts, 96)


def test_the_common_prefix_leaves_each_sequence_a_token_of_its_own() -> None:
    assert common_prefix_length([torch.tensor([1, 2, 3, 4]), torch.tensor([1, 2, 5])]) == 2
    assert common_prefix_length([torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3])]) == 2  # the last one is its own
    assert common_prefix_length([torch.tensor([1, 2, 3, 4])]) == 3
    assert common_prefix_length([torch.tensor([7, 2]), torch.tensor([1, 2])]) == 0
    assert common_prefix_length(_candidates(50)) == len("Call me on 555-")  # byte tokens


@pytest.mark.parametrize("kind", list(MODELS))
def test_shared_prefix_scores_equal_whole_reads(kind: str) -> None:
    model = MODELS[kind]
    mode = model.training
    sequences = _candidates(40) + [encode(TOKENIZER, ["Call me on 555-12 ."], 96)[0]]  # one of another length
    whole = sequence_nll(model, sequences, TOKENIZER.pad_token_id, torch.device("cpu"), batch_size=7)
    shared = sequence_nll_shared_prefix(model, sequences, TOKENIZER.pad_token_id, torch.device("cpu"), batch_size=7)
    assert shared.shape == whole.shape and torch.equal(shared[:, 1], whole[:, 1])  # the same tokens predicted
    assert torch.allclose(shared[:, 0], whole[:, 0], rtol=1e-5, atol=1e-4)
    assert len(set(whole[:, 0].tolist())) > 1  # the candidates score differently: the comparison is not empty
    assert model.training == mode  # left as it was found


def test_sequences_without_a_shared_prefix_are_read_whole() -> None:
    model = MODELS["llama"]
    sequences = encode(TOKENIZER, ["Peter Okafor of Leeds .", "A bank said .", "Call me ."], 96)
    assert common_prefix_length(sequences) == 0
    whole = sequence_nll(model, sequences, TOKENIZER.pad_token_id, torch.device("cpu"))
    assert torch.equal(sequence_nll_shared_prefix(model, sequences, TOKENIZER.pad_token_id, torch.device("cpu")), whole)


def test_an_exact_exposure_is_the_same_with_the_prefix_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    """The canary attack's exact rank over all 10^4 phone candidates, as `uedp attack` computes it (prefix shared),
    equals the rank from whole reads."""
    from uedp.models import metrics

    model = MODELS["llama+lora"]  # a real checkpoint's kind, adapted as the pages' SmolLM2 rows are
    canary = Canary("phone", "4821", 4821, PHONE.template.format(secret="4821"), "", 1)
    score = model_log_perplexity(model, TOKENIZER, torch.device("cpu"), 96)
    shared = exposure(canary, score)
    monkeypatch.setattr(metrics, "sequence_nll_shared_prefix", lambda m, s, p, d, batch_size=256:
                        metrics.sequence_nll(m, s, p, d, batch_size))
    whole = exposure(canary, model_log_perplexity(model, TOKENIZER, torch.device("cpu"), 96))
    assert (shared.method, shared.space) == (whole.method, whole.space) == ("exact", 10_000)
    # Up to float rounding, as scores from batches of other sizes are: a candidate whose score is within rounding
    # of the canary's (an untrained model scores many digit strings alike) may count on either side of it.
    assert abs(shared.rank - whole.rank) <= 10 and shared.exposure == pytest.approx(whole.exposure, abs=2e-3)
