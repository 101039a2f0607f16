"""What a synthetic dataset is: text sampled from a logged model (``uedp generate``), whose privacy is that
run's, read back from the dataset's manifest wherever the dataset turns up (``uedp datasets``, ``uedp
budget``, training on it, lineage).

Sampling from a released model is post-processing: a corpus generated from a run trained at
``(epsilon, delta)`` for a unit is ``(epsilon, delta)``-DP for that unit of the run's dataset, whatever is
generated, and so is anything trained on the corpus. Nothing here adds to or takes from that figure: a
synthetic dataset states its run's statement word for word, and a run without a guarantee (noiseless,
deid, or seeded) gives a corpus without one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from uedp.privacy.statement import PrivacyStatement
from uedp.storage.home import DataHome
from uedp.storage.manifests import sentences_manifest

NO_UNIT = "none"


@dataclass(frozen=True)
class SyntheticSource:
    """The run a synthetic dataset was sampled from, as its manifest records it."""

    run_id: str
    dataset: str  # the run's dataset: whose people the guarantee protects
    mechanism: str  # as reports show it (uedp-bounded-k4)
    statement: PrivacyStatement
    lineage: tuple[str, ...] = ()  # keyed ids of the texts the run trained on, which it protects (services.lineage)
    start_lineage: tuple[str, ...] = ()  # and of those its start had seen, which it treated as public
    prompts: str = ""  # the public dataset prompts were drawn from, if any

    @property
    def has_guarantee(self) -> bool:
        """False for a run without a guarantee (noiseless, deid) or a seeded one (its noise can be recomputed
        by anyone who knows the seed, logged with the run)."""
        s = self.statement
        return s.unit != NO_UNIT and math.isfinite(s.epsilon) and s.randomness != "seeded"

    def guarantee_words(self) -> str:
        """The guarantee in one line, as every place that shows the dataset says it."""
        s = self.statement
        if s.unit == NO_UNIT or not math.isfinite(s.epsilon):
            return (f"no guarantee: generated from run {self.run_id} ({self.mechanism} on {self.dataset!r}), which "
                    "has none; its text may repeat the training text")
        said = (f"epsilon {s.epsilon:.4g} at delta {s.delta:.3g} for {s.unit} of {self.dataset!r}, the guarantee of "
                f"run {self.run_id} ({self.mechanism}; generation is post-processing)")
        if s.randomness == "seeded":
            said = "no guarantee against anyone who knows the seed (a seeded run): " + said
        return said

    def as_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "dataset": self.dataset, "mechanism": self.mechanism,
                "statement": {**asdict(self.statement), "epsilon": _number(self.statement.epsilon)},
                "lineage": list(self.lineage), "start_lineage": list(self.start_lineage), "prompts": self.prompts}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SyntheticSource:
        stated = dict(data.get("statement") or {})
        known = {k: v for k, v in stated.items() if k in PrivacyStatement.__dataclass_fields__}
        statement = PrivacyStatement(**{**known, "epsilon": float(known.get("epsilon", "inf")),
                                        "public": tuple(known.get("public") or ()),
                                        "caveats": tuple(known.get("caveats") or ())})
        return cls(str(data.get("run_id", "")), str(data.get("dataset", "")), str(data.get("mechanism", "")),
                   statement, tuple(str(i) for i in data.get("lineage", ()) if i),
                   tuple(str(i) for i in data.get("start_lineage", ()) if i), str(data.get("prompts") or ""))


def synthetic_source(home: DataHome, dataset: str) -> SyntheticSource | None:
    """The run ``dataset`` was generated from, or None when it is not a synthetic dataset."""
    manifest = sentences_manifest(home, dataset)
    found = manifest.generated_from if manifest is not None else None
    return SyntheticSource.from_json(dict(found)) if found is not None else None


def trained_on_synthetic(statement: PrivacyStatement, source: SyntheticSource) -> PrivacyStatement:
    """A training on a synthetic dataset states the generating run's guarantee (post-processing of its model):
    the unit, epsilon and delta for the people of the run's dataset, not the synthetic pseudo-writers."""
    s = source.statement
    caveat = (f"the made-up writers of the synthetic text this run trained on: its guarantee is run {source.run_id}'s, "
              f"for the people of dataset {source.dataset!r} (this run is post-processing of that run's model)")
    return replace(s, mechanism=statement.mechanism, rounds=statement.rounds, notes=statement.notes,
                   accountant=f"post-processing of run {source.run_id} ({s.accountant})",
                   noise_multiplier=s.noise_multiplier, caveats=(caveat, *s.caveats), extra={})


def _number(value: float) -> float | str:
    return "inf" if math.isinf(value) else value
