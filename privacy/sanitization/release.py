"""What a local-DP release means: the per-mechanism sampler, the statement (unit, headline epsilon, what
is kept), the caveats, and the release's figures (per-record and per-user composition). The sanitize
task writes tables; the privacy meaning lives here, once."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from uedp.privacy.sanitization.choices import LOCAL_DP_FACTS, LocalDpFacts
from uedp.privacy.sanitization.embeddings import Embeddings
from uedp.privacy.sanitization.mapping import MappingMode, Metric, build_mapping
from uedp.privacy.sanitization.mechanisms import KEEP, UNKNOWN, CusText, Sampler, SanText, releases_per_record
from uedp.privacy.statement import PrivacyStatement

KEPT = {"none": "", "stopwords": "; stopwords released unchanged",
        "non-entities": "; tokens outside detected entities released unchanged (entity positions are visible)"}
EVALUATION_CAVEAT = ("the kept-token share and the mask-inference attack's success compare the release with the raw "
                     "text: evaluation figures outside the guarantee")
SEEDED_CAVEAT = ("seeded randomness: the release can be recomputed by anyone who knows the seed, so the guarantee "
                 "does not hold against them")


@dataclass(frozen=True)
class LocalDpKind:
    """One local-DP sanitizer: how its sampler is built and what its epsilon protects."""

    name: str
    build: Callable[[Embeddings, float, int, MappingMode, Metric, Path], tuple[Sampler, float]]
    caveats: tuple[str, ...] = ()

    @property
    def facts(self) -> LocalDpFacts:
        return LOCAL_DP_FACTS[self.name]

    @property
    def unit(self) -> str:
        return self.facts.unit

    @property
    def has_output_sets(self) -> bool:
        return self.facts.has_output_sets

    @property
    def metric_dp(self) -> bool:
        return self.facts.metric_dp

    def headline(self, epsilon: float, per_token_epsilon: float) -> str:
        if self.metric_dp:
            return (f"you asked for epsilon {epsilon:g}, which SanText guarantees as metric DP (epsilon {epsilon:g} per "
                    f"unit of Euclidean distance between the two tokens); as local DP over the whole vocabulary that is "
                    f"epsilon x diameter = {epsilon:g} x {per_token_epsilon / epsilon:.4g} = {per_token_epsilon:.4g} "
                    "per token")
        return f"per token epsilon {per_token_epsilon:.4g}"

    def statement(self, epsilon: float, per_token_epsilon: float, keep: str) -> str:
        return (f"{self.name} local DP: {self.headline(epsilon, per_token_epsilon)}, unit = {self.unit}; one independent "
                f"draw per token; a record composes over its sanitized tokens (basic composition){KEPT[keep]} "
                "(docs/PRIVACY.md)")

    def all_caveats(self, seeded: bool) -> tuple[str, ...]:
        return (*self.caveats, EVALUATION_CAVEAT, *((SEEDED_CAVEAT,) if seeded else ()))


def _custext(embeddings: Embeddings, epsilon: float, k: int, mapping: MappingMode, metric: Metric,
             cache: Path) -> tuple[Sampler, float]:
    built = build_mapping(embeddings, k, mapping, metric, cache_dir=cache)
    return CusText(embeddings, built, epsilon, metric), built.unprotected_share


def _santext(embeddings: Embeddings, epsilon: float, k: int, mapping: MappingMode, metric: Metric,
             cache: Path) -> tuple[Sampler, float]:
    return SanText(embeddings, epsilon), 0.0


LOCAL_DP: dict[str, LocalDpKind] = {
    "custext": LocalDpKind(
        "custext", _custext, ("tokens whose input set has no other member (type 1-N) have no guarantee",)),
    "santext": LocalDpKind("santext", _santext),
}


def local_dp_kind(name: str) -> LocalDpKind:
    if name not in LOCAL_DP:
        raise ValueError(f"unknown local-DP mechanism {name!r}; valid: {', '.join(LOCAL_DP)}")
    return LOCAL_DP[name]


@dataclass(frozen=True)
class ReleaseFigures:
    """A release's privacy and utility figures (no text)."""

    per_token_epsilon: float
    record_epsilon_max: float
    record_epsilon_median: float
    user_epsilon_max: float
    tokens: int
    sanitized_share: float  # of train tokens, how many went through the mechanism
    # of train tokens, how many are the original token after sanitizing (Table 3.6): kept tokens and
    # sanitized ones that came out as themselves; a token without an embedding, released as <unk>, is not
    unchanged_share: float
    sanitized_unchanged_share: float  # of sanitized tokens, how many came out as themselves
    unknown_share: float  # of sanitized tokens, how many had no embedding


def release_figures(sampler: Sampler, users_of_records: list[str], records: list[np.ndarray],
                    released: list[np.ndarray]) -> ReleaseFigures:
    """Per-record epsilon composes over a record's sanitized positions; per-user over the user's records."""
    flat_in = np.concatenate(records) if records else np.empty(0, dtype=np.int64)
    flat_out = np.concatenate(released) if released else np.empty(0, dtype=np.int64)
    sanitized = flat_in != KEEP
    known = flat_in >= 0
    per_record = releases_per_record(records) * sampler.per_token_epsilon
    per_user: dict[str, float] = {}
    for user, eps in zip(users_of_records, per_record):
        per_user[user] = per_user.get(user, 0.0) + float(eps)
    n = max(len(flat_in), 1)
    n_sanitized = max(int(sanitized.sum()), 1)
    return ReleaseFigures(
        per_token_epsilon=sampler.per_token_epsilon,
        record_epsilon_max=float(per_record.max()) if len(per_record) else 0.0,
        record_epsilon_median=float(np.median(per_record)) if len(per_record) else 0.0,
        user_epsilon_max=max(per_user.values(), default=0.0), tokens=int(len(flat_in)),
        sanitized_share=float(sanitized.sum() / n), unchanged_share=float((((flat_in == flat_out) & known) | ~sanitized).sum() / n),
        sanitized_unchanged_share=float((flat_in[known] == flat_out[known]).sum() / n_sanitized),
        unknown_share=float((flat_in == UNKNOWN).sum() / n_sanitized),
    )


def trained_on_release(statement: PrivacyStatement, mechanism: str, release_statement: str, figures: ReleaseFigures,
                       unprotected_share: float, randomness: str, caveats: tuple[str, ...],
                       attack: Mapping[str, float | None]) -> PrivacyStatement:
    """Noiseless training on a local-DP release: the guarantee is the release's (post-processing).

    ``attack``: the mask-token inference attack's figures by name (None where it did not run); like the
    kept-token share they are computed against the raw text, outside the guarantee (docs/PRIVACY.md)."""
    return PrivacyStatement(
        mechanism=mechanism, unit=release_statement, epsilon=figures.per_token_epsilon, delta=0.0,
        accountant="local DP, basic composition", rounds=statement.rounds, notes=statement.notes,
        randomness=randomness, caveats=caveats,
        extra={"epsilon_record_median": figures.record_epsilon_median, "epsilon_record_max": figures.record_epsilon_max,
               "epsilon_user_max": figures.user_epsilon_max, "sanitized_share": figures.sanitized_share,
               "kept_token_share": figures.unchanged_share, "unprotected_share": unprotected_share,
               **{name: value for name, value in attack.items() if value is not None}})
