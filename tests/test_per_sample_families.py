"""Per-example clipping is exact on every causal-LM family uedp trains, fully fine-tuned and with LoRA.

For GPT-2, Llama, Qwen2, Mistral and Gemma 1-3 (text; tiny random configurations, float64 so that 1e-5 measures
the method and not rounding), ghost clipping's per-example norms equal the norm of each example's own
gradient (a batch of one, its own backward pass), and its clipped sum equals the sum of the individually
clipped own gradients. These tests are what ``GHOST_VERIFIED`` rests on. They also show the checks can
fail (Gemma's scaled embedding under the plain embedding's rule), that parameters ghost clipping cannot
see are refused, that the exact path and micro-batches give the same sums, and that non-reentrant
activation checkpointing changes nothing."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import peft
import pytest
import torch
import transformers
from torch import nn

from uedp.models.batching import collate, encode
from uedp.models.classifier import build_bert_classifier
from uedp.models.metrics import classification_loss, per_sequence_lm_loss
from uedp.privacy.mechanisms.dpsgd import DpSgd
from uedp.privacy.mechanisms.params import DpSgdParams
from uedp.privacy.per_sample import ghost_verified, layers, per_sample_clipping
from uedp.privacy.per_sample.exact import ExactClipping
from uedp.privacy.per_sample.ghost import GhostClipping
from uedp.privacy.population import Population

from support import TOKENIZER

VOCAB, PAD = 300, 0
COMMON = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=64, pad_token_id=PAD)
LENGTHS = (9, 5, 12, 3)  # different lengths: right padding inside the batch
Loss = Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]


def _config(family: str) -> object:
    if family == "gpt2":
        return transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_inner=64, n_positions=64, vocab_size=VOCAB,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                    "mistral": transformers.MistralConfig, "gemma": transformers.GemmaConfig,
                    "gemma2": transformers.Gemma2Config, "gemma3": transformers.Gemma3TextConfig}[family]
    return config_class(**COMMON, **({"head_dim": 8} if family.startswith("gemma") else {}))


LORA_TARGETS = {"gpt2": ["c_attn"]}


def _model(family: str, lora: bool, seed: int = 0) -> nn.Module:
    """A tiny random model of the family in float64, in training mode (no dropout in these configs); with
    LoRA, lora_B is perturbed away from its zero initialisation so that every adapter gradient is nonzero."""
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(_config(family))
        if lora:
            targets = LORA_TARGETS.get(family, ["q_proj", "v_proj"])
            model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                               target_modules=targets, task_type="CAUSAL_LM"))
    model = model.double().train()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.1)
    return model


def _examples(lengths: tuple[int, ...] = LENGTHS, seed: int = 1) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=generator) for n in lengths]


def _trainable(model: nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def _own_gradients(model: nn.Module, examples: list[torch.Tensor], loss_fn: Loss = per_sequence_lm_loss
                   ) -> list[list[torch.Tensor]]:
    """Each example's gradient from its own forward and backward pass, unpadded: the truth."""
    params = _trainable(model)
    out = []
    for example in examples:
        grads = torch.autograd.grad(loss_fn(model, collate([example], PAD)), params, allow_unused=True)
        out.append([g if g is not None else torch.zeros_like(p) for g, p in zip(grads, params)])
    return out


def _norms(gradients: list[list[torch.Tensor]]) -> torch.Tensor:
    return torch.stack([torch.sqrt(sum((g**2).sum() for g in grads)) for grads in gradients])


def _clipped(gradients: list[list[torch.Tensor]], clip: float) -> list[torch.Tensor]:
    norms = _norms(gradients)
    return [sum(min(1.0, clip / float(n)) * grads[k] for grads, n in zip(gradients, norms))
            for k in range(len(gradients[0]))]


def _assert_close(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    """Entry by entry to 1e-5, or to 1e-6 of the parameter's largest entry: the RMS norms compute in float32
    even in a float64 model, so the truth's norm weight gradients carry float32 rounding (1e-7 relative)."""
    for k, (mine, truth) in enumerate(zip(got, want)):
        assert torch.allclose(mine, truth, rtol=1e-5, atol=1e-6 * float(truth.abs().max())), f"parameter {k}"


FAMILIES = ("gpt2", "llama", "qwen2", "mistral", "gemma", "gemma2", "gemma3")


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("family", FAMILIES)
def test_ghost_clipping_equals_each_examples_own_backward_pass(family: str, lora: bool) -> None:
    model = _model(family, lora)
    assert ghost_verified(model)  # GHOST_VERIFIED holds exactly the families verified here
    owners = [m for m in model.modules() if layers.own_parameters(m)]
    assert owners and {layers.rule_name(m) for m in owners} == {"ghost"}  # factored rules, no fallback
    examples = _examples()
    own = _own_gradients(model, examples)
    norms = _norms(own)
    clip = float(norms.median())  # some examples clipped, some not
    assert float(norms.min()) < clip < float(norms.max())
    batch = collate(examples, PAD)
    engine = GhostClipping(model, "mean")
    try:
        assert torch.allclose(engine.per_example_norms(per_sequence_lm_loss, batch, len(examples)), norms,
                              rtol=1e-5, atol=0)
        _assert_close(engine.clipped_sum(per_sequence_lm_loss, batch, len(examples), clip), _clipped(own, clip))
    finally:
        engine.close()
    assert all(p.grad is None for p in model.parameters())


def test_a_lora_bert_classifier_with_its_trainable_head_copy() -> None:
    """peft's sequence classification trains a copy of the head (``modules_to_save``) beside the adapters."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = peft.get_peft_model(build_bert_classifier("tiny", len(TOKENIZER), 3, TOKENIZER.pad_token_id),
                                    peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="SEQ_CLS"))
    model = model.double().train()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.1)
    assert any("modules_to_save" in name for name, p in model.named_parameters() if p.requires_grad)
    assert ghost_verified(model)
    texts = ["hello world", "Anna Berg lives in Leeds", "x", "call +44 7700 900123 today please"]
    examples = list(zip(encode(TOKENIZER, texts, 32), [0, 1, 2, 1]))
    pad = TOKENIZER.pad_token_id
    params = _trainable(model)
    own = [list(torch.autograd.grad(classification_loss(model, collate([e], pad)), params)) for e in examples]
    clip = float(_norms(own).median())
    engine = GhostClipping(model, "mean")
    try:
        batch = collate(examples, pad)
        assert torch.allclose(engine.per_example_norms(classification_loss, batch, 4), _norms(own), rtol=1e-5, atol=0)
        _assert_close(engine.clipped_sum(classification_loss, batch, 4, clip), _clipped(own, clip))
    finally:
        engine.close()


GEMMA_EMBEDDING = "transformers.models.gemma.modeling_gemma.GemmaTextScaledWordEmbedding"


def test_the_check_fails_when_gemmas_scaled_embedding_takes_the_plain_embeddings_rule(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The bug ``rule_for`` no longer makes: the lookup's rule ignores ``embed_scale`` (sqrt(32) here), so the
    embedding's part of each norm is off by that factor, and the comparison above catches it."""
    model = _model("gemma", lora=False)
    examples = _examples()
    norms = _norms(_own_gradients(model, examples))
    monkeypatch.setitem(layers._RULES, GEMMA_EMBEDDING, layers.embedding)
    engine = GhostClipping(model, "mean")
    wrong = engine.per_example_norms(per_sequence_lm_loss, collate(examples, PAD), len(examples))
    engine.close()
    assert not torch.allclose(wrong, norms, rtol=1e-2)


def test_a_subclass_that_overrides_forward_does_not_inherit_its_base_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    class SameForward(nn.Embedding):
        pass

    class Doubled(nn.Embedding):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return super().forward(ids) * 2

    assert layers.rule_for(SameForward(5, 3)) is layers.embedding
    assert layers.rule_for(Doubled(5, 3)) is layers.per_sample_by_functorch
    # Without its own rule, Gemma's scaled embedding takes the exact torch.func path: still exact.
    monkeypatch.delitem(layers._RULES, GEMMA_EMBEDDING)
    model = _model("gemma", lora=False)
    assert layers.rule_for(model.model.embed_tokens) is layers.per_sample_by_functorch
    examples = _examples()
    engine = GhostClipping(model, "mean")
    got = engine.per_example_norms(per_sequence_lm_loss, collate(examples, PAD), len(examples))
    engine.close()
    assert torch.allclose(got, _norms(_own_gradients(model, examples)), rtol=1e-5, atol=0)


def _layer_cases() -> list[tuple[type[nn.Module], Callable[[], nn.Module], bool]]:
    """Every class a transformers model rule is registered for, built alone: (class, build, takes token ids)."""
    from transformers.models.gemma import modeling_gemma
    from transformers.models.gemma2 import modeling_gemma2
    from transformers.models.gemma3 import modeling_gemma3
    from transformers.models.llama import modeling_llama
    from transformers.models.mistral import modeling_mistral
    from transformers.models.qwen2 import modeling_qwen2

    cases: list[tuple[type[nn.Module], Callable[[], nn.Module], bool]] = [
        (cls, lambda cls=cls: cls(40, 6, PAD, embed_scale=6**0.5), True)
        for cls in (modeling_gemma.GemmaTextScaledWordEmbedding, modeling_gemma2.Gemma2TextScaledWordEmbedding,
                    modeling_gemma3.Gemma3TextScaledWordEmbedding)]
    cases += [(cls, lambda cls=cls: cls(6, eps=1e-6), False)
              for cls in (modeling_llama.LlamaRMSNorm, modeling_qwen2.Qwen2RMSNorm, modeling_mistral.MistralRMSNorm,
                          modeling_gemma.GemmaRMSNorm, modeling_gemma2.Gemma2RMSNorm, modeling_gemma3.Gemma3RMSNorm)]
    return cases


def test_every_transformers_model_rule_has_a_layer_case() -> None:
    registered = {name for name in layers._RULES if name.startswith("transformers.models.")}
    assert registered == {f"{cls.__module__}.{cls.__qualname__}" for cls, _, _ in _layer_cases()}


@pytest.mark.parametrize("cls,build,takes_ids", _layer_cases(), ids=[c[0].__name__ for c in _layer_cases()])
def test_each_transformers_layer_rule_equals_torch_func(cls: type[nn.Module], build: Callable[[], nn.Module],
                                                         takes_ids: bool) -> None:
    """Layer by layer, against the exact torch.func path, for every class given a rule here."""
    torch.manual_seed(0)
    layer = build().double()
    with torch.no_grad():
        for param in layer.parameters():
            param.normal_()
    assert type(layer) is cls and layers.rule_name(layer) == "ghost"
    x = torch.randint(0, 40, (3, 7)) if takes_ids else torch.randn(3, 7, 6, dtype=torch.float64)
    grad = torch.randn(3, 7, 6, dtype=torch.float64)
    (weight,) = layer.parameters()
    by_rule = layers.rule_for(layer)(layer, (x,), {}, grad)[weight].materialise()
    by_torch_func = layers.per_sample_by_functorch(layer, (x,), {}, grad)[weight].materialise()
    # The RMS norms normalise in float32, as their rule does; Gemma's multiplies by the gradient in float32 too.
    assert torch.allclose(by_rule, by_torch_func, rtol=1e-10 if takes_ids else 1e-6, atol=1e-12)


def test_lora_on_an_embedding_is_refused_by_ghost_and_exact_on_the_exact_path() -> None:
    """peft's LoRA embedding reads its ParameterDicts directly, never calling a module that holds them:
    ghost clipping names them rather than leave their gradient zero, and the model is not verified."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = peft.get_peft_model(
            transformers.AutoModelForCausalLM.from_config(_config("llama")),
            peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "embed_tokens"],
                            task_type="CAUSAL_LM"))
    model = model.double().train()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name or "lora_embedding_B" in name:
                param.normal_(0.0, 0.1)
    examples = _examples()
    batch = collate(examples, PAD)
    engine = GhostClipping(model, "mean")
    with pytest.raises(ValueError, match="lora_embedding_A"):
        engine.clipped_sum(per_sequence_lm_loss, batch, len(examples), 1.0)
    engine.close()
    assert not ghost_verified(model)
    with pytest.warns(UserWarning, match="not verified for PeftModelForCausalLM around LlamaForCausalLM"):
        clipping = per_sample_clipping(model)
    assert isinstance(clipping, ExactClipping)
    own = _own_gradients(model, examples)
    clip = float(_norms(own).median())
    _assert_close(clipping.clipped_sum(per_sequence_lm_loss, batch, len(examples), clip), _clipped(own, clip))


def test_the_exact_path_equals_each_examples_own_backward_pass_and_skips_non_finite() -> None:
    model = _model("llama", lora=False)
    examples = _examples()
    own = _own_gradients(model, examples)
    clipping = ExactClipping(model)
    batch = collate(examples, PAD)
    assert torch.allclose(clipping.per_example_norms(per_sequence_lm_loss, batch, len(examples)), _norms(own),
                          rtol=1e-5, atol=0)
    clip = float(_norms(own).median())
    _assert_close(clipping.clipped_sum(per_sequence_lm_loss, batch, len(examples), clip), _clipped(own, clip))

    def poisoned(m: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:  # example 1 (5 tokens): inf
        infinite = int(inputs["attention_mask"].sum()) == LENGTHS[1]
        return per_sequence_lm_loss(m, inputs) * (float("inf") if infinite else 1.0)

    kept = [own[0], own[2], own[3]]
    _assert_close(clipping.clipped_sum(poisoned, batch, len(examples), clip), _clipped(kept, clip))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_micro_batches_give_the_one_batch_clipped_sum(family: str) -> None:
    """DP-SGD sums a batch in groups of like lengths (at most ``max_physical_batch`` each where set): the sum
    is each example's own clipped gradient, added, and the one-pass sum over the whole padded batch."""
    model = _model(family, lora=False)
    examples = _examples((9, 5, 12, 3, 7, 4, 10, 2, 11))
    params = _trainable(model)
    own = _own_gradients(model, examples)
    clip = float(_norms(own).median())
    one_pass = GhostClipping(model, "mean")
    try:
        whole = one_pass.clipped_sum(per_sequence_lm_loss, collate(examples, PAD), len(examples), clip)
    finally:
        one_pass.close()

    def summed(max_physical_batch: int | None, engine: str) -> list[torch.Tensor]:
        mechanism = DpSgd(DpSgdParams(clip=clip, max_physical_batch=max_physical_batch), Population.declared(100))
        clipping = per_sample_clipping(model, engine)  # type: ignore[arg-type]
        try:
            return mechanism.clipped_gradient_sum(clipping, params, examples, per_sequence_lm_loss,
                                                  torch.device("cpu"), PAD)
        finally:
            clipping.close()

    for engine in ("ghost", "exact"):
        for grouped in (summed(3, engine), summed(None, engine)):
            _assert_close(grouped, _clipped(own, clip))
            for mine, truth in zip(grouped, whole):
                assert torch.allclose(mine, truth, rtol=1e-6, atol=1e-12), engine


def test_non_reentrant_activation_checkpointing_gives_the_same_clipped_sum_and_reentrant_is_refused() -> None:
    """Checkpointed layers run again in the backward pass; ghost clipping's hooks on the first forward pass's
    outputs still fire (non-reentrant checkpointing keeps that graph), and the recomputation records nothing.
    Reentrant checkpointing runs the layers without autograd, which ghost clipping refuses to guess about."""
    model = _model("llama", lora=False)
    examples = _examples()
    batch = collate(examples, PAD)

    def clipped() -> list[torch.Tensor]:
        engine = GhostClipping(model, "mean")
        try:
            return engine.clipped_sum(per_sequence_lm_loss, batch, len(examples), 0.1)
        finally:
            engine.close()

    plain = clipped()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.activation_checkpointing_enable()  # use_reentrant=False, transformers' default
        assert model.is_activation_checkpointing
        _assert_close(clipped(), plain)
        model.activation_checkpointing_disable()
        model.activation_checkpointing_enable({"use_reentrant": True})
        with pytest.raises(ValueError, match="without autograd"):
            clipped()


def test_the_exact_path_gives_each_example_the_gradient_it_has_alone_whatever_the_others_lengths() -> None:
    """A model that is not invariant to right padding (its loss averages over every column): example 0's
    clipped contribution must not change when a longer example joins the batch."""
    from uedp.privacy.per_sample.exact import ExactClipping

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(20, 4), nn.Linear(4, 1))

    def loss(m: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return m(inputs["input_ids"]).mean()  # padding columns count: width-dependent

    def batch(*lengths: int) -> dict[str, torch.Tensor]:
        width = max(lengths)
        ids = torch.zeros(len(lengths), width, dtype=torch.long)
        mask = torch.zeros(len(lengths), width, dtype=torch.long)
        for row, length in enumerate(lengths):
            ids[row, :length] = torch.arange(1, length + 1)
            mask[row, :length] = 1
        return {"input_ids": ids, "attention_mask": mask}

    clipping = ExactClipping(model)
    alone = clipping.clipped_sum(loss, batch(3), 1, clip=1e6)
    with_longer = clipping.clipped_sum(loss, batch(3, 9), 2, clip=1e6)
    longer = clipping.clipped_sum(loss, batch(9), 1, clip=1e6)
    for a, both, b in zip(alone, with_longer, longer):
        torch.testing.assert_close(both, a + b)
