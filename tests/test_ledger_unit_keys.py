"""Ledger totals keyed by the unit, not by its wording (issue 62, item 4).

Selective on GPT-2 states "one sensitive token's value", selective on an LSTM with the byte tokenizer "one
byte's value inside a detected sensitive span": one unit (a change to a byte of a detected span is bounded
by both), so one total, and a budget of 3 refuses the LSTM run at epsilon 2 after the GPT-2 run at 1.99
(before the fix: two totals of about 2, and the same byte exposed at about 4). Genuinely different units
(dpsgd's sequence, userdp's user) stay apart. Real training of tiny models on the bundled demo corpus, a real
MLflow store and the real CLI; old ledger entries (no key) are read and grouped by their mechanism.
"""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from uedp.commands import app
from uedp.detection.pipeline import DetectorConfig
from uedp.errors import UedpError
from uedp.flows.demo import DEMO_CORPUS
from uedp.privacy.accounting.composition import compose_guarantees
from uedp.privacy.mechanisms.selective import SelectiveTwoPhase
from uedp.privacy.mechanisms.selective_recurrent import BYTE_UNIT, TOKEN_UNIT
from uedp.privacy.mechanisms.userdp import UserDp
from uedp.services import privacy_budget
from uedp.services.detect import detect_entities
from uedp.storage.ingest import IngestOptions, ingest
from uedp.storage.privacy_ledger import LedgerEntry, PrivacyLedger

runner = CliRunner()
SELECTIVE_KEY = "replace-one:sensitive-token-value"
COMMON = ["--threads", "1", "--checkpoint-every", "0"]
# What the separate-units test checks is the ledger's keys and totals, whichever accountant gave each run's epsilon;
# calibrating PLD to a target at two steps of a small batch takes seconds of CPU each (RDP: a fraction of one).
# Selective is accounted under replace-one adjacency, which only PLD supports.
RDP = ["--accountant", "rdp"]
SELECTIVE_GPT2 = ["--mechanism", "selective", "--steps", "2", "--public-steps", "1", "--batch-size", "8",
                  "--categories", "PER", *COMMON]
SELECTIVE_LSTM = ["--mechanism", "selective", "--model", "lstm", "--steps", "2", "--batch-size", "8",
                  "--categories", "PER", *COMMON]


@pytest.fixture
def demo(home) -> str:  # type: ignore[no-untyped-def]
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    return "demo"


def _entries(home) -> tuple[LedgerEntry, ...]:  # type: ignore[no-untyped-def]
    return privacy_budget.ledger_of(home, "demo").read().entries


def _runs(home) -> int:  # type: ignore[no-untyped-def]
    client = MlflowClient(tracking_uri=home.mlflow_tracking_uri)
    experiment = client.get_experiment_by_name("demo")
    return 0 if experiment is None else len(client.search_runs([experiment.experiment_id]))


def _cli(home, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, [*args[:2], "--home", str(home.root), *args[2:]])


def test_selective_on_gpt2_and_on_an_lstm_are_one_unit_and_one_budgeted_total(home, demo: str) -> None:  # type: ignore[no-untyped-def]
    assert _cli(home, "budget", demo, "--limit", "3").exit_code == 0
    gpt2 = _cli(home, "train", demo, *SELECTIVE_GPT2, "--target-epsilon", "1.99")
    assert gpt2.exit_code == 0, gpt2.output
    [first] = _entries(home)
    assert first.unit == SelectiveTwoPhase.unit and 1.9 < first.epsilon <= 1.99

    runs = _runs(home)
    lstm = _cli(home, "train", demo, *SELECTIVE_LSTM, "--target-epsilon", "2")
    assert lstm.exit_code == 2, lstm.output  # composed with the GPT-2 run: about 4, past 3
    assert "past its budget 3" in lstm.stderr and "one value inside a detected sensitive span" in lstm.stderr
    assert _runs(home) == runs and _entries(home) == (first,)  # refused before anything opened or was filed
    assert first.unit_key == SELECTIVE_KEY

    small = _cli(home, "train", demo, *SELECTIVE_LSTM, "--target-epsilon", "0.5")  # within what is left
    assert small.exit_code == 0, small.output
    assert "has already spent epsilon" in small.stderr  # said before it trains: the same unit
    _, second = _entries(home)
    assert second.unit == BYTE_UNIT != first.unit and second.unit_key == SELECTIVE_KEY  # other words, one key
    [total] = privacy_budget.unit_totals(_entries(home))
    assert total.key == SELECTIVE_KEY and total.releases == 2 and total.wordings == (first.unit, second.unit)
    assert total.epsilon == pytest.approx(compose_guarantees([(first.epsilon, first.delta),
                                                              (second.epsilon, second.delta)])[0])
    stored = json.loads(PrivacyLedger(home.dataset_dir(demo)).path.read_text())
    assert [e["unit_key"] for e in stored["entries"]] == [SELECTIVE_KEY, SELECTIVE_KEY]

    shown = _cli(home, "budget", demo)
    assert shown.exit_code == 0, shown.output
    text = shown.stdout.replace("\n", " ")
    assert "one value inside a detected sensitive span: a byte, or the token that holds it" in text
    assert f"epsilon {total.epsilon:.4g} at delta {total.delta:.3g} over 2 release(s)" in text
    assert f"one unit ({SELECTIVE_KEY}) that its releases' statements word 2 ways" in text
    assert "each total holds for its own unit" not in text  # one total, not two


def test_different_units_stay_separate_totals(home, demo: str) -> None:  # type: ignore[no-untyped-def]
    """A sequence (dpsgd) and a user (userdp) are different adjacencies: each total is kept within the budget
    alone, and each still refuses what would take it past."""
    assert _cli(home, "budget", demo, "--limit", "3").exit_code == 0
    dpsgd = ["--mechanism", "dpsgd", "--steps", "2", "--batch-size", "8", "--target-epsilon", "2", *COMMON, *RDP]
    assert (sequence := _cli(home, "train", demo, *dpsgd)).exit_code == 0, sequence.output
    user = _cli(home, "train", demo, "--mechanism", "userdp", "--rounds", "2", "--q-user", "0.5", "--local-steps", "1",
                "--target-epsilon", "2", *COMMON, *RDP)
    assert user.exit_code == 0 and "already spent" not in user.stderr, user.output
    totals = privacy_budget.unit_totals(_entries(home))
    assert [(t.key, t.releases) for t in totals] == [("add/remove:sequence", 1), ("add/remove:user", 1)]
    assert totals[1].unit == UserDp.unit
    refused = _cli(home, "train", demo, *dpsgd)  # a second sequence-level run: 4 > 3 on the sequence total
    assert refused.exit_code == 2 and "past its budget 3" in refused.stderr, refused.output
    shown = _cli(home, "budget", demo).stdout.replace("\n", " ")
    assert "each total holds for its own unit" in shown and "word 2 ways" not in shown


def test_entries_an_older_uedp_wrote_without_a_key_are_grouped_by_their_mechanisms_unit(home) -> None:  # type: ignore[no-untyped-def]
    """A version-3 ledger (no unit_key): the key is derived from the entry's mechanism (a label built on a
    registered name included), or, for a mechanism no longer registered, from a registered unit worded the
    same; a wording nobody registered keeps its own total. The budget then refuses across the wordings."""
    def old(key: str, mechanism: str, unit: str, epsilon: float) -> dict[str, object]:
        return {"key": key, "mechanism": mechanism, "unit": unit, "epsilon": epsilon, "delta": 1e-5,
                "status": "finished", "name": key, "randomness": "secure", "scope": "", "fingerprint": "", "text": "",
                "categories": [], "covered_by": "", "when": "2025-01-01 00:00 UTC"}

    ledger = PrivacyLedger(home.dataset_dir("demo"))
    ledger.path.parent.mkdir(parents=True)
    ledger.path.write_text(json.dumps({"version": 3, "limit": 3.0, "entries": [
        old("run:a", "selective", SelectiveTwoPhase.unit, 1.0),
        old("run:b", "selective-lr0.1", BYTE_UNIT, 1.0),  # a sweep's variant label
        old("run:c", "selective", TOKEN_UNIT, 0.5),
        old("run:d", "userdp-retired-plugin", UserDp.unit, 1.0),  # unknown mechanism: matched by wording
        old("run:e", "userdp", UserDp.unit, 1.0),
        old("run:f", "gone", "one paragraph", 1.0),  # nothing registered says so: its own total
    ]}))
    entries = ledger.read().entries
    assert all(e.unit_key == "" for e in entries)
    totals = privacy_budget.unit_totals(entries)
    assert [(t.key, t.releases) for t in totals] == [(SELECTIVE_KEY, 3), ("add/remove:user", 2),
                                                     ("as worded:one paragraph", 1)]
    assert totals[0].wordings == (SelectiveTwoPhase.unit, BYTE_UNIT, TOKEN_UNIT) and totals[2].unit == "one paragraph"

    lstm = privacy_budget.Charge("run:g", "selective", BYTE_UNIT, 0.6, 1e-5, "g", "secure")
    assert privacy_budget.unit_key(lstm) == SELECTIVE_KEY
    with pytest.raises(UedpError, match="past its budget 3"):  # 1 + 1 + 0.5 + 0.6 > 3, across three wordings
        privacy_budget.file(home, "demo", lstm)
    fits = privacy_budget.Charge("run:h", "selective", TOKEN_UNIT, 0.4, 1e-5, "h", "secure")
    assert privacy_budget.file(home, "demo", fits)[0].startswith("warning: 'demo' has already spent epsilon 2.5")
    stored = json.loads(ledger.path.read_text())
    assert stored["version"] == 4 and stored["entries"][-1]["unit_key"] == SELECTIVE_KEY
    assert [e.get("unit_key") for e in stored["entries"][:-1]] == [""] * 6  # old entries are left as they were


def test_a_variant_whose_label_extends_another_mechanisms_name_keeps_its_own_unit(home) -> None:  # type: ignore[no-untyped-def]
    """Review: `--mechanism uedp --variant bounded-x` is labelled `uedp-bounded-x`, which a prefix match on the
    label would file under uedp-bounded's substitution unit; the key comes from the mechanism itself."""
    from uedp.flows.demo import DEMO_CORPUS
    from uedp.privacy.mechanisms import registry
    from uedp.services.config import TrainConfig
    from uedp.services.training import reservation
    from uedp.services.training_plan import PublicFacts, plan_training
    from uedp.storage.ingest import IngestOptions, ingest

    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    config = TrainConfig(dataset="demo", mechanism="uedp", variant="bounded-x", noise_multiplier=1.0, rounds=2)
    assert config.label.startswith("uedp-bounded")
    from uedp.privacy.population import Population

    facts = PublicFacts(Population.declared(20), n_examples=100, train_users=20)
    release = reservation(home, plan_training(config, facts))
    assert release is not None and release.unit_key == registry.get("uedp").privacy_unit.key  # type: ignore[union-attr]
    assert release.unit_key != registry.get("uedp-bounded").privacy_unit.key  # type: ignore[union-attr]
