"""``--holders-per-entity auto``: uedp-bounded's k chosen for the user, from the attribution graph (the data
each k keeps) and the planner (the noise each k needs at the target epsilon).

A larger k keeps more sentences with an entity, and needs more noise: a change of (user, entity) moves
1 + k users' contributions. The choice is the largest candidate k whose noise-to-signal
(:mod:`privacy.signal`) stays at or below the threshold past which this project's measured runs stopped
learning; k stops growing once it keeps every sentence with an entity. When even the smallest k is past
the threshold, the k with the least noise is taken and the run's warning says so.

Privacy: the choice depends on the graph (public under uedp-bounded's substitution adjacency), the
number of training users (public under it too) and the configuration only, so it is part of what the
adversary may know, like a k given by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from uedp.privacy.attribution import AttributionGraph, HolderChoice, HolderChoiceResult, choose_holders
from uedp.privacy.signal import NoiseToSignal

CANDIDATES = (0, 1, 2, 4, 8, 16)
FIXED_NOISE_K = 4  # with a fixed z the noise does not depend on k: auto then keeps the former default


@dataclass(frozen=True)
class Candidate:
    k: int
    signal: NoiseToSignal
    kept: int | None  # sentences with an entity the holder choice keeps (None: no graph, the planner)
    choice: HolderChoiceResult | None = None  # the holder choice itself, reused by training for the chosen k


@dataclass(frozen=True)
class AutoHolders:
    """The chosen k and why, in words for the statement."""

    k: int
    reason: str
    candidates: tuple[Candidate, ...] = ()
    graph: AttributionGraph | None = None  # the graph the candidates' choices were made on

    def choice_on(self, graph: AttributionGraph) -> HolderChoiceResult | None:
        """The chosen k's holder choice, when it was made on ``graph`` (training then does not make it again)."""
        if self.graph is None or self.graph != graph:
            return None
        return next((c.choice for c in self.candidates if c.k == self.k), None)


def choose_k(graph: AttributionGraph | None, signal_for: Callable[[int], NoiseToSignal],
             strategy: HolderChoice = "best") -> AutoHolders:
    """The largest k of :data:`CANDIDATES` whose noise-to-signal is within the measured threshold
    (``signal_for(k)``: the planner's figure for k at the run's target epsilon; a ``ValueError`` from it,
    e.g. adaptive clipping left no room at that k's z, ends the search like a k past the threshold).
    Without the ``graph`` (the planner, before the data is read) the data kept is unknown."""
    seen: list[Candidate] = []
    refused = ""
    for k in CANDIDATES:
        try:
            signal = signal_for(k)
        except ValueError as exc:
            refused = f"k = {k}: {exc}"
            break
        choice = None if graph is None else choose_holders(graph, k, strategy)
        kept = None if choice is None else choice.sensitive_kept
        seen.append(Candidate(k, signal, kept, choice))
        if signal.past_limit or (graph is not None and kept is not None and kept >= graph.n_sensitive):
            break  # a larger k would only add noise (past the threshold) or keep nothing more
    if not seen:
        raise ValueError(f"holders_per_entity auto: no k is possible ({refused})")
    learning = [c for c in seen if not c.signal.past_limit]
    chosen = learning[-1] if learning else min(seen, key=lambda c: c.signal.ratio)
    return AutoHolders(chosen.k, _reason(chosen, seen, graph, bool(learning), refused), tuple(seen), graph)


def _reason(chosen: Candidate, seen: list[Candidate], graph: AttributionGraph | None, learning: bool,
            refused: str) -> str:
    def kept(c: Candidate, verb: str = "keeps") -> str:
        return "" if graph is None or c.kept is None else f"{verb} {c.kept / max(graph.n_sensitive, 1):.0%} "

    said = f"k = {chosen.k} chosen by auto: {kept(chosen)}at noise-to-signal {chosen.signal.ratio:.3g}"
    if graph is not None:
        said = said.replace("keeps", f"keeps, of the {graph.n_sensitive} sentences with an entity,", 1)
    after = next((c for c in seen if c.k > chosen.k), None)
    if not learning:
        said += f"; every k tried is past {chosen.signal.limit:g}, so the least noise was taken"
        if chosen.k == 0:
            lower = (chosen.signal.warning() or "").partition("Lower it with: ")[2]
            said += (". At k = 0 no sentence that names an entity trains: the entities are protected by learning "
                     f"none of their text. What would let a larger k learn: {lower}; LoRA adapters (--lora-rank: "
                     "fewer trained weights under the same noise). Or choose k yourself with --holders-per-entity K "
                     "(`uedp epsilon --mechanism uedp-bounded --holders-per-entity K ...` shows each k's "
                     "noise-to-signal)")
    elif after is not None:
        said += (f"; k = {after.k} would {kept(after, 'keep') or 'be '}at {after.signal.ratio:.3g}, past "
                 f"{after.signal.limit:g} where measured runs stopped learning")
    elif graph is not None and chosen.kept is not None and chosen.kept >= graph.n_sensitive:
        said += " (a larger k keeps nothing more)"
    if refused:
        said += f"; the next k was refused ({refused})"
    return said


def fixed_noise_choice() -> AutoHolders:
    """Auto without a target epsilon: every k would get the same noise (z is given), so nothing trades
    data against noise; k is the former default, and the statement says how to let auto choose."""
    return AutoHolders(FIXED_NOISE_K, f"k = {FIXED_NOISE_K} (auto chooses k only for a target epsilon: with a fixed "
                                      "noise multiplier every k gets the same noise)")
