"""Attack task: load a logged run's model and configuration from MLflow, run the chosen attacks, and
add their scores (and the one-run audit's lower bound on epsilon) to that same run.

Membership inference takes members from the run's training split and non-members from its test split,
at three levels: sentences, users (all of a user's sentences), entities of the run's categories (was
this entity's text in training?). Those are attack scores, never a bound on epsilon: which candidates
are members is decided by the corpus' files, not by a secret coin (:mod:`privacy.attacks.membership`).
Only the one-run audit, whose canaries each have a secret coin, bounds epsilon.

Each level attacks a fixed, configured number of members and of non-members (``--members``; users:
``--member-users``), so the counts shown and logged beside the AUC and its 95% interval are public
settings, never the exact number of training users, sentences or entities. A level with fewer
candidates than that is not attacked, said on the terminal only (docs/PRIVACY.md).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from uedp.errors import UedpError
from uedp.models.batching import encode
from uedp.models.device import resolve_device
from uedp.models.metrics import sequence_nll
from uedp.privacy.attacks.audit_canaries import audit_scores
from uedp.privacy.attacks.canaries import chance_exposure, exposure, model_log_perplexity
from uedp.privacy.attacks.extraction import Occurrence, extraction_rates
from uedp.privacy.attacks.membership import (
    MembershipResult,
    TooFewCandidates,
    grouped_scores,
    membership_attack,
    sentence_scores,
)
from uedp.privacy.attacks.one_run import audit_best
from uedp.services.audit_draw import load_for_run
from uedp.services.config import TrainConfig
from uedp.services.logged_run import load_logged_run
from uedp.services.tracking import RunTracker
from uedp.storage.catalog import Catalog
from uedp.storage.home import DataHome

AttackKind = Literal["audit", "canary", "mia", "extraction"]
ATTACKS: tuple[str, ...] = ("audit", "canary", "mia", "extraction")

@dataclass(frozen=True)
class AttackOutcome:
    """What ``uedp attack`` found: every figure it computed (all logged to the run, also when another
    attack failed), the attacks that failed or were skipped and why, and the run's accounted epsilon."""

    metrics: dict[str, float]
    failed: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    accounted_epsilon: float | None = None  # the run's final epsilon (None: not a private run)
    delta: float = 0.0
    notes: tuple[str, ...] = ()  # for the auditor's eyes (e.g. how often planted canaries' hosts were sampled)


def attack_run(home: DataHome, run_id: str, kinds: list[str], members: int = 500, top_k: int = 5,
               extraction_limit: int = 200, device_name: str = "auto", seed: int = 0,
               reference_run: str | None = None, everything: bool = False,
               member_users: int = 50) -> AttackOutcome:
    """Run ``kinds`` against the run's model; log and return the figures.

    Each attack runs on its own: one that fails is reported with its error, and what the others
    computed is logged anyway. With ``everything`` (``--kind all``) an attack the run cannot support
    (canaries in a run that planted none) is skipped and said so, instead of failing.

    ``reference_run``: another run's model (trained without these members, e.g. on public text) to
    calibrate membership scores against, besides the uncalibrated and zlib-calibrated scores.

    ``members``: membership inference samples exactly this many members and non-members at the sentence
    and entity levels (``member_users`` at the user level); a level with fewer is not attacked (a note
    says so), and when none can be, the attack fails (``everything``: is skipped) naming the sizes only.
    """
    unknown = sorted(set(kinds) - set(ATTACKS))
    if unknown:
        raise UedpError(f"unknown attack {', '.join(unknown)}; valid: {', '.join(ATTACKS)}, all")
    tracker = RunTracker.attach(home, run_id)
    device = resolve_device(device_name)
    loaded = load_logged_run(tracker, device, "the attacks")
    config, model, tokenizer, canaries = loaded.config, loaded.model, loaded.tokenizer, loaded.canaries
    metrics: dict[str, float] = {}
    failed: dict[str, str] = {}
    skipped: dict[str, str] = {}
    notes: list[str] = []
    if "canary" in kinds and not canaries:
        if not everything:
            raise UedpError(f"run {run_id} planted no canaries; train with --canaries N")
        skipped["canary"] = "the run planted no canaries (train with --canaries N)"
    audit_draw = load_for_run(home, run_id) if "audit" in kinds else None
    if "audit" in kinds and audit_draw is None:
        why = (f"run {run_id} has no audit canaries in data home {home.root} (train with --audit-canaries M; the "
               "secret coins stay in the data home that trained the run)")
        if not everything:
            raise UedpError(why)
        skipped["audit"] = why
    nll = _scorer(model, tokenizer, device, config.max_len)
    reference = None
    if reference_run and "mia" in kinds:
        ref = load_logged_run(RunTracker.attach(home, reference_run), device, "a reference model")
        reference = _scorer(ref.model, ref.tokenizer, device, config.max_len)

    def audit() -> dict[str, float]:
        assert audit_draw is not None
        plan, record = audit_draw
        scores = audit_scores(plan, model_log_perplexity(model, tokenizer, device, config.max_len))
        result = audit_best(scores, np.asarray(plan.included), config.delta)
        notes.append(f"one-run audit: {result.correct} of {result.guesses} guesses right on {result.canaries} "
                     f"{plan.unit} canaries ({plan.adjacency.replace('_', '/')}), {sum(plan.included)} planted; "
                     f"epsilon >= {result.epsilon_lower_bound:.3g} at {result.confidence:.0%} confidence")
        out = {"audit_one_run_epsilon_lower_bound": result.epsilon_lower_bound,
               "audit_one_run_clopper_pearson": result.clopper_pearson_bound,
               "audit_one_run_canaries": float(result.canaries), "audit_one_run_guesses": float(result.guesses),
               "audit_one_run_correct": float(result.correct)}
        if record is not None:
            planted = record.figures(plan.included)
            if planted:
                notes.append(f"planted canaries' hosts took part in {planted['audit_host_rounds_mean']:.3g} of "
                             f"{record.rounds} rounds on average; {planted['audit_host_never_sampled']:.0%} never")
        return out

    def canary() -> dict[str, float]:
        score = model_log_perplexity(model, tokenizer, device, config.max_len)
        values = [exposure(c, score, seed=seed).exposure for c in canaries]
        return {"canary_exposure_mean": float(np.mean(values)), "canary_exposure_max": float(np.max(values)),
                "canary_exposure_min": float(np.min(values)), "canary_count": float(len(values))}

    def extraction() -> dict[str, float]:
        with Catalog(home, config.dataset) as catalog:
            occurrences = _occurrences(catalog, config, extraction_limit, seed)
        out = {}
        for category, (hits, total) in sorted(extraction_rates(model, tokenizer, occurrences, top_k, device).items()):
            out[f"extraction_top{top_k}_{category}"] = hits / total
            out[f"extraction_tried_{category}"] = float(total)
        return out

    def mia() -> dict[str, float]:
        sizes = {"sentence": members, "user": member_users, "entity": members}
        with Catalog(home, config.dataset) as catalog:
            results, refused = _membership(catalog, config, nll, sizes, seed, reference)
        if not results:
            raise TooFewCandidates(
                f"no level has enough candidates for a sample of {members} members and {members} non-members "
                f"(sentences, entities) or {member_users} (users); pass a smaller --members or --member-users "
                f"(`uedp sql {config.dataset} \"SELECT split, count(*) FROM sentences GROUP BY split\"` counts them)")
        notes.append(MEMBERSHIP_NOTE)
        metrics_here = membership_metrics(results)
        notes.extend(below_chance(metrics_here))
        notes.extend(result.line() for result in results if result.calibration == "none")
        notes.extend(f"{level} membership: not attacked, {why}" for level, why in refused.items())
        return metrics_here

    for kind, run in (("audit", audit), ("canary", canary), ("mia", mia), ("extraction", extraction)):
        if kind not in kinds or kind in skipped:
            continue
        try:
            metrics |= run()
        except TooFewCandidates as exc:  # the run's data is too small for the sample sizes asked for
            (skipped if everything else failed)[kind] = str(exc)
        except Exception as exc:  # one attack's failure must not discard the others' figures
            failed[kind] = str(exc) if isinstance(exc, UedpError) else f"{type(exc).__name__}: {exc}"
    if metrics:
        tracker.log_metrics(metrics)
    # Tags, not params: a run may be attacked again with other settings (params cannot change).
    tracker.set_tags({"uedp.attack.kinds": ",".join(k for k in kinds if k not in failed and k not in skipped),
                      "uedp.attack.members": str(members), "uedp.attack.member_users": str(member_users),
                      "uedp.attack.top_k": str(top_k), "uedp.attack.seed": str(seed)})
    logged = tracker.client.get_run(run_id).data.metrics.get("final_epsilon")
    accounted = logged if config.is_private and logged is not None else None
    return AttackOutcome(metrics, failed, skipped, accounted, config.delta, tuple(notes))


# Figures the summary shows, with the value a model that learned nothing about its members would get.
# Only the one-run audit's rows are lower bounds on epsilon; membership inference compares the train file
# with the test file, so a shift between the files alone moves its AUC (it is an attack score).
MEMBERSHIP = "membership score"
MEMBERSHIP_NOTE = ("membership inference compares the train split with the test split, not candidates assigned by a "
                   "secret coin: its figures are attack scores (a shift between the files raises them too), not bounds "
                   "on epsilon; only the one-run audit (--audit-canaries) bounds epsilon")
SUMMARY: tuple[tuple[str, str, str], ...] = (
    ("one-run audit: epsilon lower bound", "audit_one_run_epsilon_lower_bound", "0"),
    ("one-run audit: epsilon lower bound", "audit_one_run_clopper_pearson", "0"),
    ("canary", "canary_exposure_mean", "{mean} (random ranks)"),
    ("canary", "canary_exposure_max", "{max} (the best of {n} random ranks)"),
    (f"{MEMBERSHIP}, sentences", "mia_sentence_auc", "0.5"),
    (f"{MEMBERSHIP}, sentences", "mia_sentence_tpr_at_1pct_fpr", "0.01"),
    (f"{MEMBERSHIP}, users", "mia_user_auc", "0.5"),
    (f"{MEMBERSHIP}, entities", "mia_entity_auc", "0.5"),
)
CHANCE_AUC = 0.5


def summary_rows(outcome: AttackOutcome) -> list[tuple[str, str, str, str]]:
    """(attack, figure, value, random baseline) for the figures people read first; extraction per category
    (its baseline: an entity guessed by chance among the top-k is close to 0)."""
    # The accounted epsilon first: the one-run audit's bound is read against it (above it, at 95%: the
    # accounting or the mechanism is wrong); the other figures are attack scores.
    accounted = ("inf (no guarantee)" if outcome.accounted_epsilon is None
                 else f"{outcome.accounted_epsilon:.4g} at delta {outcome.delta:g}")
    rows = [("accounted (dp_accounting)", "epsilon", accounted, "-")]
    rows += [(attack, key, _with_interval(outcome.metrics, key), _baseline(baseline, outcome.metrics))
             for attack, key, baseline in SUMMARY if key in outcome.metrics]
    rows += [("extraction", key, f"{value:.1%}", "~0") for key, value in sorted(outcome.metrics.items())
             if key.startswith("extraction_top")]
    return rows


def _baseline(template: str, metrics: dict[str, float]) -> str:
    """A figure's own chance level: the canary figures' depend on how many canaries were scored."""
    if "{" not in template:
        return template
    n = int(metrics.get("canary_count", 1))
    chance = chance_exposure(n)
    return template.format(mean=f"~{chance['canary_exposure_mean']:.2f}", max=f"~{chance['canary_exposure_max']:.2f}",
                           n=n)


def below_chance(metrics: dict[str, float]) -> list[str]:
    """The AUCs whose whole 95% interval is below 0.5, each with what that means. An attack cannot be worse
    than chance by design (flipping its score would make it better than chance): an interval below chance
    says the member and non-member samples differ (the train and test files, or the sampling), which is an
    artefact of the comparison, not protection."""
    lines = []
    for key in sorted(metrics):
        if key.endswith("_auc") and metrics.get(f"{key}_high", 1.0) < CHANCE_AUC:
            lines.append(f"{key} {metrics[key]:.2f} (95% CI {metrics[f'{key}_low']:.2f}-{metrics[f'{key}_high']:.2f}) is "
                         "below chance (0.5) with its whole interval: the attack tells members from non-members the "
                         "wrong way round, so the train and test samples differ by more than membership (a shift "
                         "between the files, or a small sample); it is no evidence of protection, nor of a leak")
    return lines


def _with_interval(metrics: dict[str, float], key: str) -> str:
    """A figure as the summary shows it: an AUC with its 95% interval and the (configured) sample sizes."""
    value = f"{metrics[key]:.4g}"
    if key.endswith("_auc") and f"{key}_low" in metrics:
        level = key.removeprefix("mia_").split("_")[0]
        value += f" (95% CI {metrics[f'{key}_low']:.2f}-{metrics[f'{key}_high']:.2f}"
        if f"mia_{level}_members" in metrics:
            value += f"; {metrics[f'mia_{level}_members']:.0f}+{metrics[f'mia_{level}_non_members']:.0f}"
        value += ")"
        if metrics[f"{key}_high"] < CHANCE_AUC:
            value += " below chance: see the note"
    return value


def _scorer(model: torch.nn.Module, tokenizer, device: torch.device, max_len: int):  # type: ignore[no-untyped-def]
    def nll(texts: list[str]) -> np.ndarray:
        return sequence_nll(model, encode(tokenizer, texts, max_len), tokenizer.pad_token_id, device).numpy()
    return nll


def _membership(catalog: Catalog, config: TrainConfig, nll, sizes: dict[str, int],  # type: ignore[no-untyped-def]
                seed: int, reference=None) -> tuple[list[MembershipResult], dict[str, str]]:
    """Each level's attack on a fixed sample (``sizes[level]`` members and as many non-members), for each
    calibration; and the levels not attacked, with why (never how many candidates there were)."""
    train, test = catalog.sentences("train"), catalog.sentences("test")
    if not train or not test:
        raise UedpError(f"dataset {config.dataset!r} needs train and test sentences for membership inference")
    texts = {"train": [t for _, _, t in train], "test": [t for _, _, t in test]}
    nll, reference = _once(nll), _once(reference) if reference is not None else None  # each split scored once
    user_groups = {"train": _user_groups(train), "test": _user_groups(test)}
    member_entities = _entity_groups(catalog, config, "train", train)
    unseen = {k: v for k, v in _entity_groups(catalog, config, "test", test).items() if k not in member_entities}
    results: list[MembershipResult] = []
    refused: dict[str, str] = {}
    option = {"sentence": "--members", "user": "--member-users", "entity": "--members"}
    where = {"sentence": "sentences in the train split or in the test split",
             "user": "users in the train split or in the test split",
             "entity": "entities in the train split, or in the test split but not the train split,"}
    for calibration in ("none", "zlib") + (("reference",) if reference is not None else ()):
        member, outside = (sentence_scores(texts[split], nll, calibration, reference)
                           for split in ("train", "test"))
        levels = {"sentence": (member, outside),
                  "user": (grouped_scores(member, user_groups["train"]), grouped_scores(outside, user_groups["test"]))}
        if member_entities and unseen:
            levels["entity"] = (grouped_scores(member, list(member_entities.values())),
                                grouped_scores(outside, list(unseen.values())))
        else:
            refused["entity"] = ("no entities of the run's categories in the train split, or none in the test "
                                 "split that the train split lacks")
        for level, (members, non_members) in levels.items():
            size = sizes[level]
            if len(members) < size or len(non_members) < size:
                refused[level] = (f"fewer than {size} {where[level]} to sample {size} of each from (a smaller "
                                  f"{option[level]} attacks it; the counts stay private)")
                continue
            results.append(membership_attack(level, calibration, members, non_members, size, seed))
    return results, refused


def membership_metrics(results: list[MembershipResult]) -> dict[str, float]:
    """Each result's figures (``mia_<level>[_<calibration>]_auc``, ``..._auc_low``, ``..._auc_high``, ...)
    and each level's sample sizes (``mia_<level>_members``, ``mia_<level>_non_members``): configured
    numbers, public, unlike the count of training units they are drawn from."""
    metrics: dict[str, float] = {}
    for result in results:
        suffix = "" if result.calibration == "none" else f"_{result.calibration}"
        metrics |= result.figures.as_metrics(f"mia_{result.level}{suffix}")
        metrics |= {f"mia_{result.level}_members": float(result.figures.members),
                    f"mia_{result.level}_non_members": float(result.figures.non_members)}
    return metrics


def _once(score: Callable[[list[str]], np.ndarray]) -> Callable[[list[str]], np.ndarray]:
    """``score`` memoised on the texts: the calibrations reuse one model pass per split."""
    seen: dict[tuple[str, ...], np.ndarray] = {}

    def cached(texts: list[str]) -> np.ndarray:
        key = tuple(texts)
        if key not in seen:
            seen[key] = score(texts)
        return seen[key]
    return cached


def _user_groups(rows: list[tuple[int, str, str]]) -> list[list[int]]:
    groups: dict[str, list[int]] = {}
    for index, (_, user, _) in enumerate(rows):
        groups.setdefault(user, []).append(index)
    return list(groups.values())


def _entity_groups(catalog: Catalog, config: TrainConfig, split: str, rows: list[tuple[int, str, str]]) -> dict[str, list[int]]:
    spans = catalog.entity_spans(config.categories, split)
    position = {sentence_id: index for index, (sentence_id, _, _) in enumerate(rows)}
    groups: dict[str, list[int]] = {}
    for sentence_id, found in spans.items():
        for key in {key for _, _, _, key in found}:  # one sentence once per entity, however many detections
            groups.setdefault(key, []).append(position[sentence_id])
    return groups


def _occurrences(catalog: Catalog, config: TrainConfig, limit: int, seed: int) -> list[Occurrence]:
    texts = {sentence_id: text for sentence_id, _, text in catalog.sentences("train")}
    found = [Occurrence(category, texts[sid][:start], texts[sid][start:end])
             for sid, spans in catalog.entity_spans(config.categories, "train").items()
             for start, end, category, _ in spans if start > 0]
    random.Random(seed).shuffle(found)
    return found[:limit]
