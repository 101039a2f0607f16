"""The attribution graph of a corpus and the choice of holder users per entity (``uedp-bounded``).

Multi-attribution DP (Ganesh, McKenna, McMahan, Smith, Wu, ICML 2025, "It's My Data Too") attributes
each sentence to its writer and to each detected entity in it. The graph says *which* sentences share a
user or an entity, never their text, and ``uedp-bounded`` treats it as public. Neighbouring datasets
differ in the contents of every sentence of one user u' and one entity e'.

A model trained as userdp on every sentence would let e' move every user that mentions it. So, from the
graph alone, each entity gets at most ``k`` *holder* users, and a sentence with entities is kept only in
a user that holds all of them. Changing (u', e') then changes u' and at most k holders of e': at most
``1 + k`` users' contributions.

Why the graph alone: the choice is released implicitly (it decides which sentences train), so it may
depend only on what the adjacency keeps fixed. Entities are therefore identified by *where* they occur,
not by their names: an entity's canonical identity is its set of sentence positions (entities that occur
in exactly the same sentences are one for this purpose; a user holds both or neither), and every tie is
broken by positions. Renaming an entity or rewriting any text, with the graph fixed, leaves the choice
unchanged (tests check this).

Strategies, all from the graph only:

* ``ascending-degree``: the baseline, jax_privacy's greedy contribution bounding adapted to holders:
  sentences in ascending order of their number of entities, each kept if its user holds, or can still
  be given, every one of its entities.
* ``top-count``: each entity's k users with the most sentences that mention it.
* ``gain``: a lazy greedy over blocks (one user's sentences with one entity set), best sentences per
  new holder slot first; entities with at most k users are held by all of them at no cost.

Every strategy but the baseline is followed by a local search: for each entity, a holder is swapped
for a non-holder (or a free slot filled) whenever that keeps strictly more sentences, until a pass
changes nothing (at most 20 passes). ``best`` (the default) runs gain and top-count, each improved, and the baseline, and
keeps the choice that keeps the most sentences.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

HolderChoice = Literal["best", "gain", "top-count", "ascending-degree"]
HOLDER_CHOICES: tuple[str, ...] = ("best", "gain", "top-count", "ascending-degree")
IMPROVEMENT_PASSES = 20  # local search passes over the entities, at most (a pass that changes nothing ends it)

Position = tuple[int, int]  # (user index, sentence index within the user)


@dataclass(frozen=True)
class AttributionGraph:
    """Per user (in data order), per sentence, the canonical ids of its entities (empty: no entity)."""

    users: tuple[str, ...]
    sentences: tuple[tuple[tuple[int, ...], ...], ...]
    n_entities: int

    @classmethod
    def from_entity_sets(cls, entities: Mapping[str, Sequence[frozenset[str]]]) -> AttributionGraph:
        """The graph of ``TrainData.entities`` (user -> per sentence the entity keys), keys dropped.

        An entity's canonical id is the rank of its sorted occurrence positions; keys with identical
        occurrences share an id."""
        users = tuple(entities)
        occurrences: dict[str, list[Position]] = defaultdict(list)
        for u, user in enumerate(users):
            for s, keys in enumerate(entities[user]):
                for key in keys:
                    occurrences[key].append((u, s))
        signatures = sorted({tuple(sorted(set(places))) for places in occurrences.values()})
        canonical = {signature: index for index, signature in enumerate(signatures)}
        id_of = {key: canonical[tuple(sorted(set(places)))] for key, places in occurrences.items()}
        sentences = tuple(
            tuple(tuple(sorted({id_of[key] for key in keys})) for keys in entities[user]) for user in users)
        return cls(users, sentences, len(signatures))

    @property
    def n_sentences(self) -> int:
        return sum(len(s) for s in self.sentences)

    @property
    def n_sensitive(self) -> int:
        return sum(1 for user in self.sentences for ids in user if ids)

    @property
    def n_plain(self) -> int:
        """Sentences without an entity (always kept)."""
        return self.n_sentences - self.n_sensitive

    def users_of(self) -> list[set[int]]:
        """Per entity id, the users with at least one sentence that holds it."""
        out: list[set[int]] = [set() for _ in range(self.n_entities)]
        for u, user in enumerate(self.sentences):
            for ids in user:
                for e in ids:
                    out[e].add(u)
        return out


@dataclass(frozen=True)
class HolderChoiceResult:
    """Which users hold which entity, and which sentences that keeps (a mask per user, per sentence)."""

    holders: tuple[frozenset[int], ...]  # per entity id
    kept: tuple[tuple[bool, ...], ...]
    strategy: str
    k: int
    sensitive_kept: int  # sentences with an entity that are kept

    @property
    def max_holders(self) -> int:
        return max((len(h) for h in self.holders), default=0)


def _kept_count(graph: AttributionGraph, holders: Sequence[frozenset[int] | set[int]]) -> int:
    """Sentences with an entity that ``holders`` keep."""
    return sum(1 for u, user in enumerate(graph.sentences) for ids in user
               if ids and all(u in holders[e] for e in ids))


def kept_mask(graph: AttributionGraph, holders: Sequence[frozenset[int] | set[int]]) -> tuple[tuple[bool, ...], ...]:
    """A sentence is kept when it has no entity or its user holds every one of its entities."""
    return tuple(tuple(all(u in holders[e] for e in ids) for ids in user) for u, user in enumerate(graph.sentences))


def choose_holders(graph: AttributionGraph, k: int, strategy: HolderChoice = "best") -> HolderChoiceResult:
    """At most ``k`` holder users per entity, chosen from the graph alone to keep many sentences."""
    if k < 0:
        raise ValueError(f"holders per entity must be >= 0, got {k}")
    if strategy == "best":
        results = [choose_holders(graph, k, s) for s in ("gain", "top-count", "ascending-degree")]
        return max(results, key=lambda r: r.sensitive_kept)  # ties: the first
    if strategy == "gain":
        holders = _improve(graph, _gain_greedy(graph, k), k)
    elif strategy == "top-count":
        holders = _improve(graph, _top_count(graph, k), k)
    elif strategy == "ascending-degree":
        holders = _ascending_degree(graph, k)
    else:
        raise ValueError(f"unknown holder choice {strategy!r}; valid: {', '.join(HOLDER_CHOICES)}")
    frozen = tuple(frozenset(h) for h in holders)
    return HolderChoiceResult(frozen, kept_mask(graph, frozen), strategy, k, _kept_count(graph, frozen))


def _ascending_degree(graph: AttributionGraph, k: int) -> list[set[int]]:
    holders: list[set[int]] = [set() for _ in range(graph.n_entities)]
    order = sorted(((len(ids), u, s) for u, user in enumerate(graph.sentences) for s, ids in enumerate(user) if ids))
    for _, u, s in order:
        ids = graph.sentences[u][s]
        if all(u in holders[e] or len(holders[e]) < k for e in ids):
            for e in ids:
                holders[e].add(u)
    return holders


def _gain_greedy(graph: AttributionGraph, k: int) -> list[set[int]]:
    """Lazy greedy over blocks (user, entity set) by sentences kept per new holder slot.

    An entity with at most k users is held by all of them (no choice to make). For the others, a block
    needs a slot in each entity its user does not hold yet; the block with the most sentences per slot
    is taken first (ties: fewer slots, then positions). Taking a block can make the same user's other
    blocks cheaper, so they are queued again with their new score; stale queue entries are skipped."""
    users_of = graph.users_of()
    holders: list[set[int]] = [set(us) if len(us) <= k else set() for us in users_of]
    contested = [len(us) > k for us in users_of]
    blocks: dict[tuple[int, tuple[int, ...]], int] = defaultdict(int)
    for u, user in enumerate(graph.sentences):
        for ids in user:
            if any(contested[e] for e in ids):
                blocks[(u, ids)] += 1
    by_user_entity: dict[tuple[int, int], list[tuple[int, tuple[int, ...]]]] = defaultdict(list)
    for (u, ids) in blocks:
        for e in ids:
            by_user_entity[(u, e)].append((u, ids))

    def needed(block: tuple[int, tuple[int, ...]]) -> list[int] | None:
        u, ids = block
        missing = [e for e in ids if u not in holders[e]]
        return None if any(len(holders[e]) >= k for e in missing) else missing

    def push(block: tuple[int, tuple[int, ...]]) -> None:
        missing = needed(block)
        if missing is not None:
            heapq.heappush(queue, (-blocks[block] / max(len(missing), 1e-9), len(missing), block))

    queue: list[tuple[float, int, tuple[int, tuple[int, ...]]]] = []
    done: set[tuple[int, tuple[int, ...]]] = set()
    for block in sorted(blocks):
        push(block)
    while queue:
        _, slots, block = heapq.heappop(queue)
        if block in done:
            continue
        missing = needed(block)
        if missing is None:
            continue  # some entity's holders filled up meanwhile
        if len(missing) != slots:
            push(block)  # cheaper now than when queued: requeue at its current score
            continue
        done.add(block)
        u = block[0]
        for e in missing:
            holders[e].add(u)
            for other in by_user_entity[(u, e)]:
                if other not in done:
                    push(other)
    return holders


def _mentions(graph: AttributionGraph) -> dict[tuple[int, int], list[tuple[int, ...]]]:
    """(user, entity) -> the entity sets of that user's sentences that mention the entity."""
    out: dict[tuple[int, int], list[tuple[int, ...]]] = defaultdict(list)
    for u, user in enumerate(graph.sentences):
        for ids in user:
            for e in ids:
                out[(u, e)].append(ids)
    return out


def _top_count(graph: AttributionGraph, k: int) -> list[set[int]]:
    mentions = _mentions(graph)
    candidates: list[list[tuple[int, int]]] = [[] for _ in range(graph.n_entities)]
    for (u, e), sets in mentions.items():
        candidates[e].append((-len(sets), u))
    return [{u for _, u in sorted(c)[:k]} for c in candidates]


def _improve(graph: AttributionGraph, holders: list[set[int]], k: int) -> list[set[int]]:
    """Local search: per entity, fill a free slot or swap a holder for a non-holder while that keeps
    strictly more sentences (so it ends). Only sentences that mention the entity can change."""
    mentions = _mentions(graph)
    users_of = graph.users_of()

    def kept_with(u: int, e: int, holding: bool) -> int:
        """Sentences of u mentioning e that are kept if u holds e (``holding``) or not."""
        if not holding:
            return 0
        return sum(1 for ids in mentions[(u, e)] if all(x == e or u in holders[x] for x in ids))

    for _ in range(IMPROVEMENT_PASSES):
        changed = False
        for e in range(graph.n_entities):
            if len(users_of[e]) <= len(holders[e]):
                continue  # every user of e holds it
            outside = sorted((-kept_with(v, e, True), v) for v in users_of[e] - holders[e])
            if not outside or outside[0][0] == 0:
                continue
            gain, v = -outside[0][0], outside[0][1]
            if len(holders[e]) < k:
                holders[e].add(v)
                changed = True
                continue
            inside = sorted((kept_with(u, e, True), u) for u in holders[e])
            if inside and inside[0][0] < gain:
                holders[e].discard(inside[0][1])
                holders[e].add(v)
                changed = True
        if not changed:
            break
    return holders
