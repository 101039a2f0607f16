"""``selective`` as the registry lists it: one sensitive token's value the unit; the two-phase form for
transformers (:mod:`uedp.privacy.mechanisms.selective`), Selective-DPSGD with noised states for the LSTM
(:mod:`uedp.privacy.mechanisms.selective_recurrent`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from uedp.privacy.mechanisms.params import SelectiveParams
from uedp.privacy.mechanisms.registry import AuditDesign, BuildContext, MechanismSpec, RunShape, register
from uedp.privacy.statement import PrivacyUnit

if TYPE_CHECKING:
    from uedp.privacy.mechanisms.base import Mechanism


def recurrent(shape: RunShape) -> bool:
    """Whether the run trains the recurrent form (an LSTM)."""
    return shape.model == "lstm"


def _build(params: SelectiveParams, context: BuildContext) -> Mechanism:
    if recurrent(context.shape):  # the LSTM form: Selective-DPSGD with noised states
        from uedp.privacy.mechanisms.selective_recurrent import SelectiveRecurrent

        return SelectiveRecurrent(params, context.n_examples, context.randomness, context.shape.byte_tokens)
    from uedp.models.metrics import causal_lm_loss
    from uedp.privacy.mechanisms.selective import SelectiveTwoPhase

    return SelectiveTwoPhase(params, context.n_examples, context.public_loss or causal_lm_loss, context.randomness,
                             context.shape.seed)


def _schedule(params: SelectiveParams, shape: RunShape) -> tuple[tuple[str, int], ...]:
    if recurrent(shape):
        return (("private", params.steps),)
    return (("public", params.public_steps), ("private", params.steps))


def _check(params: SelectiveParams, shape: RunShape) -> None:
    if shape.processes > 1 and recurrent(shape):
        raise ValueError("recurrent selective (lstm) runs in one process: its per-token state noise is drawn inside "
                         "the forward pass, which ranks cannot share")
    if shape.audit_canaries and recurrent(shape):
        raise ValueError("audit canaries: recurrent selective (lstm) accounts one private token's value, and a "
                         "canary's secret spans several tokens (use the two-phase GPT-2 form, whose phase 2 accounts "
                         "a whole sequence)")


# Both forms and every tokenizer: the two-phase form's unit (a token's value; phase 2 is replace-one DP-SGD) and
# the recurrent one's (a byte's value with the byte tokenizer, a token's with another) each bound a change to
# one byte of a detected span, so their releases compose into one total (PrivacyUnit).
SENSITIVE_VALUE = PrivacyUnit("replace-one", "sensitive-token-value",
                              "one value inside a detected sensitive span: a byte, or the token that holds it "
                              "(Selective DP, replace-one; spans the detector missed are not covered)")


register(MechanismSpec(
    name="selective", rank=20, summary="Selective DP: noiseless on redacted text then DP-SGD (transformers), or "
                              "Selective-DPSGD with noised states (LSTM); one sensitive token's value is the unit",
    params=SelectiveParams, unit=SelectiveParams.unit_words, guarantee="central", build=_build, privacy_unit=SENSITIVE_VALUE,
    needs=lambda shape: frozenset({"private_masks"} if recurrent(shape) else {"redacted"}),
    per_example_loss=True, schedule=_schedule, check=_check, missed_entities="",
    audit=AuditDesign("secret", "replace"),
))
