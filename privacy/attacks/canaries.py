"""Canaries (Carlini et al. 2019; the Selective-DP paper's "My ID is 341752"): made-up secrets planted
in chosen users' training text, and their exposure after training.

Exposure of a canary with secret ``s`` drawn from a space ``R`` of candidates is
``log2 |R| - log2 rank(s)``, where the rank orders all candidates by the model's log-perplexity of the
whole canary sentence (rank 1 = the model's favourite). Small spaces are enumerated exactly; for large
ones the log-perplexities of random candidates are fitted with a skew-normal distribution and the
exposure is ``-log2 CDF(log-perplexity of the canary)`` (Carlini et al., section 4.3).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # a configuration checks its canary formats without torch; scoring imports what it needs
    import torch

FIRST_NAMES = ("Amara", "Bruno", "Chiara", "Dmitri", "Elif", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Kaveh",
               "Lena", "Mateo", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Soren", "Tamar", "Ugo", "Vera",
               "Wiktor", "Ximena", "Yusuf", "Zofia", "Aurel", "Beatriz", "Cyril", "Dagny")
LAST_NAMES = ("Abara", "Brandt", "Castell", "Dufort", "Eklund", "Ferrante", "Gallo", "Haddad", "Ivers", "Janssen",
              "Kowal", "Lindqvist", "Moreau", "Novak", "Okonkwo", "Petrov", "Quist", "Rahimi", "Szabo", "Tanaka",
              "Ueda", "Varga", "Weiss", "Xu", "Yilmaz", "Zeller", "Arce", "Bianchi", "Celik", "Dahl")


@dataclass(frozen=True)
class CanaryFormat:
    """A sentence template with one ``{secret}`` slot and the space the secret is drawn from."""

    name: str
    template: str
    size: int
    secret_at: Callable[[int], str]  # index in [0, size) -> secret


def _digits(length: int) -> CanaryFormat:
    return CanaryFormat(f"digits:{length}", "My ID is {secret} .", 10 ** length, lambda i: f"{i:0{length}d}")


def _names() -> CanaryFormat:
    n = len(LAST_NAMES)
    return CanaryFormat("name", "My name is {secret} .", len(FIRST_NAMES) * n,
                        lambda i: f"{FIRST_NAMES[i // n]} {LAST_NAMES[i % n]}")


def _phone() -> CanaryFormat:
    return CanaryFormat("phone", "Call me on 555-{secret} .", 10 ** 4, lambda i: f"{i:04d}")


def _email() -> CanaryFormat:
    n = len(LAST_NAMES)
    return CanaryFormat("email", "Write to {secret}@mailbox.example .", len(FIRST_NAMES) * n,
                        lambda i: f"{FIRST_NAMES[i // n].lower()}.{LAST_NAMES[i % n].lower()}")


def canary_format(name: str) -> CanaryFormat:
    """``digits:N`` (default 6), ``name``, ``phone`` or ``email``."""
    if name == "digits" or name.startswith("digits:"):
        length = int(name.split(":", 1)[1]) if ":" in name else 6
        if not 1 <= length <= 12:
            raise ValueError("digit canaries have 1 to 12 digits")
        return _digits(length)
    formats = {"name": _names, "phone": _phone, "email": _email}
    if name not in formats:
        raise ValueError(f"unknown canary format {name!r}; valid: digits:N, name, phone, email")
    return formats[name]()


@dataclass(frozen=True)
class Canary:
    format: str
    secret_index: int
    secret: str
    text: str
    user: str
    repeats: int

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def with_host(self, pseudonym: str) -> Canary:
        """The canary with its host user replaced (for the released copy: a raw user id is private data)."""
        return replace(self, user=pseudonym)


def plant_canaries(texts_by_user: dict[str, list[str]], count: int, repeats: int, formats: Sequence[str],
                   seed: int, users: Sequence[str] = ()) -> tuple[dict[str, list[str]], list[Canary]]:
    """Add ``count`` canaries, each ``repeats`` times, to the end of randomly chosen users' texts (seeded;
    training shuffles, so the position does not matter, and appending keeps callers' parallel lists aligned).

    ``users`` restricts the hosts to those users (all training users when empty). Returns new per-user
    lists (the input is not modified) and the canaries. Formats cycle.
    """
    if count < 0 or repeats < 1:
        raise ValueError("canaries: count >= 0 and repeats >= 1")
    unknown = sorted(set(users) - set(texts_by_user))
    if unknown:
        raise ValueError(f"canary users not among the training users: {', '.join(unknown[:5])}")
    rng = random.Random(seed)
    users = sorted(users) if users else sorted(texts_by_user)
    planted = {u: list(t) for u, t in texts_by_user.items()}
    canaries = []
    for i in range(count):
        fmt = canary_format(formats[i % len(formats)])
        index = rng.randrange(fmt.size)
        secret = fmt.secret_at(index)
        user = rng.choice(users)
        text = fmt.template.format(secret=secret)
        canaries.append(Canary(fmt.name, index, secret, text, user, repeats))
        planted[user].extend([text] * repeats)
    return planted, canaries


@dataclass(frozen=True)
class Exposure:
    exposure: float
    method: str  # "exact" or "skew-normal"
    rank: float  # exact rank, or the extrapolated one
    space: int


LogPerplexity = Callable[[list[str]], np.ndarray]  # texts -> summed NLL of each


def chance_exposure(canaries: int) -> dict[str, float]:
    """What a model that learnt nothing about its canaries scores, per summary figure, for ``canaries`` of
    them: each canary's rank is then uniform among its candidates, so its exposure ``-log2(rank / size)`` is
    an exponential variable of mean ``1 / ln 2`` (about 1.44), for a large space. The largest of ``n`` such
    exposures has mean ``H_n / ln 2`` (the harmonic number: about 3.9 for 8 canaries), the smallest
    ``1 / (n ln 2)``. Each figure is read against its own baseline: a maximum of 3.9 is no leak."""
    n = max(int(canaries), 1)
    harmonic = sum(1 / i for i in range(1, n + 1))
    return {"canary_exposure_mean": 1 / math.log(2), "canary_exposure_max": harmonic / math.log(2),
            "canary_exposure_min": 1 / (n * math.log(2))}


def exposure(canary: Canary, log_perplexity: LogPerplexity, exact_limit: int = 20_000, samples: int = 4_000,
             seed: int = 0, batch: int = 2_048) -> Exposure:
    """Exposure of one canary, exactly when its space has at most ``exact_limit`` candidates."""
    fmt = canary_format(canary.format)
    template = fmt.template
    own = float(log_perplexity([canary.text])[0])
    if fmt.size <= exact_limit:
        lower = 0
        for start in range(0, fmt.size, batch):
            texts = [template.format(secret=fmt.secret_at(i)) for i in range(start, min(start + batch, fmt.size))
                     if i != canary.secret_index]
            lower += int(np.sum(log_perplexity(texts) < own))
        rank = lower + 1
        return Exposure(math.log2(fmt.size) - math.log2(rank), "exact", rank, fmt.size)
    rng = np.random.default_rng(seed)
    indices = rng.choice(fmt.size, size=min(samples, fmt.size), replace=False)
    values = np.concatenate([log_perplexity([template.format(secret=fmt.secret_at(int(i))) for i in chunk])
                             for chunk in np.array_split(indices, max(1, len(indices) // batch))])
    from scipy.stats import skewnorm

    shape, loc, scale = skewnorm.fit(values)
    cdf = float(skewnorm.cdf(own, shape, loc, scale))
    exposure_value = -math.log2(max(cdf, 1e-300))
    return Exposure(min(exposure_value, math.log2(fmt.size)), "skew-normal", max(cdf * fmt.size, 1.0), fmt.size)


def model_log_perplexity(model: torch.nn.Module, tokenizer, device: torch.device, max_len: int = 96) -> LogPerplexity:  # type: ignore[no-untyped-def]
    """Summed next-token NLL of each text under a causal LM, encoded as in training. A canary's candidates share
    their template's opening tokens: those are read once per batch of candidates (a model's key/value cache),
    which gives the same figures for a fraction of the compute at 135M parameters."""
    from uedp.models import metrics
    from uedp.models.batching import encode

    def score(texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros(0)
        sequences = encode(tokenizer, texts, max_len)
        return metrics.sequence_nll_shared_prefix(model, sequences, tokenizer.pad_token_id, device)[:, 0].numpy()

    return score
