"""``uedp reproduce selective-customersim`` at its ``ci`` scale, on small generated dialogs in SimDial's own
layout (``train/``, ``valid/``, ``test/`` folders of ``dial-N.txt``, turns ``SYS: ...`` / ``USR: ...``, and
a Selective-DP ``canary-0.txt`` that must be left out), through the real flows (ingest with the ``simdial``
format, Presidio detection with the CustomerSim policy over a blank spaCy pipeline, sweeps, MLflow, the
canary attack): every ci claim must hold and the page must be whole. Also the parts that need no
training: the format reader (a bad line names its file and line), the policy on made-up dialogs, its
independent recall check, and the dialog files a scale reads.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import spacy

from uedp.errors import UedpError
from uedp.experiments.claims import judge
from uedp.experiments.common import Context, Results
from uedp.experiments.reproduce import reproduce, rerender
from uedp.experiments.selective_customersim import (
    POLICY,
    POLICY_ENTITIES,
    SCALES,
    claims,
    dialog_files,
    policy_recall,
    private_token_share,
)
from uedp.storage.formats import FormatError
from uedp.storage.formats.simdial import simdial_records
from uedp.storage.ingest import IngestOptions, ingest
from uedp.storage.tables import read_table

FIRST = ["Mary", "James", "Betty", "Weldon", "Catherine", "Myron", "Agnes", "Roosevelt", "Jessica", "Kenneth",
         "Ava", "Floyd", "Linda", "Thomas", "Dorothy", "Andrew", "Candy", "Juana"]
LAST = ["Rowan", "Salim", "Sims", "Gilliss", "Pena", "Ramos", "Hinkle", "Stroud", "Roop", "Gentry", "Hill",
        "Henderson", "Wilson", "Love", "Warr", "Shoe", "Langhans", "Eiben", "McDonald", "O'Neil"]
STREETS = ["Khan", "Fitzgerald", "Hughes", "Lisa", "Johnson", "Cantu", "Gross", "Emma", "Harrison"]
SUFFIXES = ["Mews", "Viaduct", "Points", "Crest", "Parkway", "Wall", "Ramp", "Loop", "Groves"]
CITIES = ["Allisonville", "Brownview", "North Garystad", "Port Teresa", "Jennifershire", "Lake Kendra"]
STATES = ["ME", "OK", "DC", "AZ", "HI", "NH", "KS", "WI"]
ASK = {"name": ["May I have your full name?", "Please provide your full name.", "Could you verify your full name?"],
       "phone": ["Verify your phone number please.", "Ok, may I have your phone number?"],
       "order": ["Could you please also provide your order number?", "Can you provide the order number?"],
       "address": ["We will need the shipping address as well.", "Could you please confirm your shipping address?"]}
TEMPLATE_TURNS = ["SYS: Hello, I am the customer support bot. What can I do for you?",
                  "USR: Hi. I ordered a mobile phone several days ago but I can't track it.",
                  "USR: Hello robot. Could you please help me track my package?", "USR: What's up? Where is my package?",
                  "USR: All good. See you.", "USR: That's it. Thanks! Thank you.", "USR: No more questions.",
                  "USR: I have all I need. That's all.", "SYS: Have a nice day! Bye.", "SYS: Goodbye.",
                  *(f"SYS: {question}" for questions in ASK.values() for question in questions)]


def _values(rng: random.Random, index: int) -> dict[str, str]:
    """One customer's made-up slot values (in the shapes SimDial's generator and Faker give)."""
    digits = f"{rng.randint(100, 999)}{rng.randint(1, 888):03d}{rng.randint(1, 9998):04d}"
    separator = rng.choice(["", "-", "."])
    address = (f"PSC {rng.randint(1000, 9999)}, Box {rng.randint(1000, 9999)} APO {rng.choice(['AE', 'AP'])} "
               f"{rng.randint(10000, 99999)}" if rng.random() < 0.15 else
               f"{rng.randint(100, 99999)} {rng.choice(STREETS)} {rng.choice(SUFFIXES)}"
               + (f" Suite {rng.randint(100, 999)}" if rng.random() < 0.3 else "")
               + f" {rng.choice(CITIES)}, {rng.choice(STATES)} {rng.randint(10000, 99999)}")
    return {"name": f"{FIRST[index % len(FIRST)]} {LAST[(index * 7) % len(LAST)]}",
            "phone": separator.join([digits[:3], digits[3:6], digits[6:]]) if separator else digits,
            "order": f"{rng.randint(100, 999)}-{rng.randint(10000, 99999)}-{rng.randint(1, 9998):04d}",
            "address": address,
            "tracking": "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(9)) + str(index % 10)}


def _answer(slot: str, value: str, rng: random.Random) -> str:
    shapes = {"name": ["{v}", "{v}.", "Sure, {v}.", "I am {v}.", "Yep - I'm {v}.", "My name's {v}."],
              "phone": ["{v} is my number.", "Phone number is {v}", "You can reach me at {v}.", "my number is {v}."],
              "order": ["My order number is {v}.", "Yes, {v}.", "Sure, it is {v}", "It's {v}.", "{v}"],
              "address": ["Ok, it is {v}.", "Shipping address is {v}.", "My address is {v}.", "Yea sure, {v}."]}
    return "USR: " + rng.choice(shapes[slot]).format(v=value)


def simdial_dialog(index: int, seed: int) -> str:
    """A CustomerSim-like dialog: greeting, the name and one or two other slots, the tracking number, bye."""
    rng = random.Random(seed * 100_003 + index)
    values = _values(rng, index)
    turns = [TEMPLATE_TURNS[0], rng.choice(TEMPLATE_TURNS[1:4])]
    for slot in ["name", *rng.sample(["phone", "order", "address"], rng.randint(1, 2))]:
        turns += [f"SYS: {rng.choice(ASK[slot])}", _answer(slot, values[slot], rng)]
    turns.append(rng.choice([f"SYS: The tracking number is {values['tracking']}. Anything else?",
                             f"SYS: Track your order using your tracking number, {values['tracking']}. What else can I do?",
                             f"SYS: You can track your package with your tracking number, which is {values['tracking']}. "
                             "Are you happy about my answer?"]))
    turns += [rng.choice(TEMPLATE_TURNS[4:8]), rng.choice(TEMPLATE_TURNS[8:10])]
    return "\n".join(turns) + "\n"


def write_simdial(folder: Path, counts: dict[str, int]) -> Path:
    for seed, (split, count) in enumerate(counts.items()):
        (folder / split).mkdir(parents=True, exist_ok=True)
        for index in range(count):
            (folder / split / f"dial-{index}.txt").write_text(simdial_dialog(index, seed), encoding="utf-8")
    (folder / "train" / "canary-0.txt").write_text("My ID is 341752.", encoding="utf-8")
    return folder


@pytest.fixture
def simdial_dir(tmp_path: Path) -> Path:
    return write_simdial(tmp_path / "simdial", {"train": 44, "valid": 8, "test": 8})


# --- the ci scale, end to end -----------------------------------------------------------------------------


@pytest.mark.slow
def test_ci_scale_runs_the_experiment_and_its_claims_hold(home, simdial_dir: Path, prefect_server,
                                                          tmp_path: Path) -> None:
    out = tmp_path / "page"
    lines: list[str] = []
    page = reproduce("selective-customersim", "ci", home, simdial_dir, out, say=lines.append)
    assert page.verdicts, "a page without claims checks nothing"
    failed = [f"{v.statement}: {v.ours}" for v in page.verdicts if not v.holds]
    assert not failed, f"selective-customersim at the ci scale: claims that do not hold: {failed}"
    assert len(page.verdicts) == sum("ci" in c.scales for c in claims(SCALES["ci"])) == 2
    files = {p.name for p in out.iterdir()}
    assert {"README.md", "results.json", "selective.png"} <= files
    assert (out / "selective.png").stat().st_size > 10_000
    text = (out / "README.md").read_text(encoding="utf-8")
    assert "uedp reproduce selective-customersim" in text and "ci scale" in text and "--simdial-dir" in text
    for needed in ("## The seeds' claims, checked", "## The policy, checked", "Cannot be checked here", "3.06",
                   "11.82", "10.42", "18.3%", "BPE", "one turn", "canary-*.txt"):
        assert needed in text, needed
    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    runs = data["runs"]
    assert sorted((r["family"], r["label"]) for r in runs) == [
        ("gpt2 tiny", "deid"), ("gpt2 tiny", "dpsgd"), ("gpt2 tiny", "noiseless"), ("gpt2 tiny", "selective"),
        ("lstm tiny", "dpsgd"), ("lstm tiny", "noiseless"), ("lstm tiny", "selective")]
    assert all(math.isfinite(r["perplexity"]) and "canary_exposure_mean" in r["extra"] for r in runs)
    private = [r for r in runs if r["label"] in ("dpsgd", "selective")]
    assert all(0 < r["epsilon"] < math.inf for r in private)
    assert all(r["epsilon"] == math.inf for r in runs if r["label"] in ("noiseless", "deid"))
    share = data["figures"]["private_token_share"]
    assert 0.05 < share["bytes"] < 0.4 and 0 < share["words"] < share["bytes"] + 0.1
    assert set(share["by_category"]) == {"PERSON", "LOC", "PHONE_NUMBER", "ID"}
    assert data["figures"]["dialogs"] == {"train": 30, "valid": 4, "test": 6}  # the first of 44, 8, 8; no canary
    sentences = read_table(home.table_dir(data["figures"]["dataset"], "sentences")).to_pylist()
    assert not any("341752" in s["text"] for s in sentences)
    assert {s["user_id"] for s in sentences if s["split"] == "test"} == {f"test/dial-{i}" for i in range(6)}
    # --page-only rebuilds the same page from results.json, without training
    again = rerender("selective-customersim", home, out)
    assert [(v.statement, v.holds) for v in again.verdicts] == [(v.statement, v.holds) for v in page.verdicts]
    # recall on the test split (6 dialogs, one tracking number each): not the training dialogs the policy was checked on
    assert "| tracking number | 6 | 6 | 100.00% |" in (out / "README.md").read_text(encoding="utf-8")


# --- the format reader -------------------------------------------------------------------------------------


def test_reader_makes_each_turn_a_sentence_of_its_dialog_with_the_split_of_its_folder(tmp_path: Path) -> None:
    path = tmp_path / "train" / "dial-7.txt"
    path.parent.mkdir()
    path.write_text("SYS: May I have your full name?\n\nUSR: Sure, Mary Rowan.\r\nSYS: Bye.", encoding="utf-8")
    records = list(simdial_records(path))
    assert [(r.text, r.line) for r in records] == [("SYS: May I have your full name?", 1),
                                                   ("USR: Sure, Mary Rowan.", 3), ("SYS: Bye.", 4)]
    assert {(r.user, r.doc_id, r.split) for r in records} == {("train/dial-7", "train/dial-7", "train")}
    flat = tmp_path / "dialogs" / "dial-1.txt"
    flat.parent.mkdir()
    flat.write_text("USR: Hi.\n", encoding="utf-8")
    assert [(r.user, r.split) for r in simdial_records(flat)] == [("dialogs/dial-1", None)]
    canary = tmp_path / "train" / "canary-3.txt"
    canary.write_text("My ID is 341752.", encoding="utf-8")
    assert [(r.text, r.user) for r in simdial_records(canary)] == [("My ID is 341752.", "train/canary-3")]


def test_a_line_that_is_not_a_turn_names_its_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "valid" / "dial-2.txt"
    path.parent.mkdir()
    path.write_text("SYS: Hello.\nUSR: Hi.\nAGENT: who speaks here?\n", encoding="utf-8")
    with pytest.raises(FormatError, match=r"valid/dial-2\.txt:3: expected a turn 'SYS: \.\.\.' or 'USR: \.\.\.', "
                       r"got 'AGENT: who speaks here\?'") as caught:
        list(simdial_records(path))
    assert caught.value.line == 3 and caught.value.path == path
    empty = tmp_path / "valid" / "dial-3.txt"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(FormatError, match=r"dial-3\.txt: no turns found"):
        list(simdial_records(empty))
    bad_bytes = tmp_path / "valid" / "dial-4.txt"
    bad_bytes.write_bytes(b"SYS: Hello.\nUSR: caf\xe9\n")
    with pytest.raises(FormatError, match=r"dial-4\.txt:2: invalid UTF-8"):
        list(simdial_records(bad_bytes))


def test_ingest_makes_one_user_per_dialog_and_keeps_same_named_dialogs_of_other_splits_apart(
        home, tmp_path: Path) -> None:
    folder = write_simdial(tmp_path / "simdial", {"train": 3, "test": 2})
    files = sorted(folder.glob("*/dial-*.txt"))
    result = ingest(home, "sim", files, IngestOptions(format="simdial"))
    assert result.users == 5 and result.per_split == {"train": sum(
        len((folder / "train" / f"dial-{i}.txt").read_text().splitlines()) for i in range(3)),
        "valid": 0, "test": result.sentences - result.per_split["train"]}
    rows = read_table(home.table_dir("sim", "sentences")).to_pylist()
    assert {(r["user_id"], r["split"]) for r in rows} == {
        ("train/dial-0", "train"), ("train/dial-1", "train"), ("train/dial-2", "train"), ("test/dial-0", "test"),
        ("test/dial-1", "test")}
    assert all(r["text"].startswith(("SYS: ", "USR: ")) for r in rows)
    with pytest.raises(UedpError, match=r"format simdial has fixed users \(dialog\); drop --users"):
        IngestOptions(format="simdial", users="chunk:10")


# --- the policy ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def policy():
    from uedp.detection.presidio_engine import build_analyzer

    nlp = spacy.blank("en")
    analyzer, engine = build_analyzer(nlp, str(POLICY), defaults=False)

    def found(text: str) -> set[tuple[str, str]]:
        results = analyzer.analyze(text, "en", entities=POLICY_ENTITIES, nlp_artifacts=engine.artifacts(nlp(text)),
                                   score_threshold=0.4)
        return {(text[r.start:r.end], r.entity_type) for r in results}

    return found


@pytest.mark.parametrize(("turn", "value", "entity"), [
    ("USR: Weldon Gilliss", "Weldon Gilliss", "PERSON"),
    ("USR: Sure, Mary Rowan.", "Mary Rowan", "PERSON"),
    ("USR: Yep - I'm Thomas Love.", "Thomas Love", "PERSON"),
    ("USR: My name's Ava O'Neil.", "Ava O'Neil", "PERSON"),
    ("USR: I am Catherine McDonald.", "Catherine McDonald", "PERSON"),
    ("USR: 587.090.4260 is my number. Sure, Agnes Hinkle.", "Agnes Hinkle", "PERSON"),
    ("USR: Kimberly Seith 237-235-8636 is my number.", "Kimberly Seith", "PERSON"),
    ("USR: Ok, it is 322 Khan Mews Allisonville, ME 20072.", "322 Khan Mews Allisonville, ME 20072", "LOCATION"),
    ("USR: My address is 99999 Hughes Points Suite 999 North Garystad, DC 99999.",
     "99999 Hughes Points Suite 999 North Garystad, DC 99999", "LOCATION"),
    ("USR: Yea sure, 9999 Mark Wall Apt. 999 Bellchester, KS 12345.", "9999 Mark Wall Apt. 999 Bellchester, KS 12345",
     "LOCATION"),
    ("USR: PSC 4115, Box 7815 APO AE 41031.", "PSC 4115, Box 7815 APO AE 41031", "LOCATION"),
    ("USR: Shipping address is USNV Adams FPO AA 12345.", "USNV Adams FPO AA 12345", "LOCATION"),
    ("USR: 980.322.8737 is my number.", "980.322.8737", "PHONE_NUMBER"),
    ("USR: You can reach me at 547-302-3744.", "547-302-3744", "PHONE_NUMBER"),
    ("USR: Phone number is 1535449750", "1535449750", "PHONE_NUMBER"),
    ("USR: It's 170-69903-9354.", "170-69903-9354", "ID"),
    ("SYS: Track your order using your tracking number, 0UOKFRS1GA. Anything else?", "0UOKFRS1GA", "ID"),
    ("SYS: The tracking number is ABCDEFGHIJ. Anything else?", "ABCDEFGHIJ", "ID"),  # letters only: by its context
])
def test_the_policy_marks_each_slot_value(policy, turn: str, value: str, entity: str) -> None:
    assert (value, entity) in policy(turn)


@pytest.mark.parametrize("turn", TEMPLATE_TURNS + ["USR: Hi. Where is my package?", "USR: Shipping address is",
                                                   "SYS: Hello, I am the customer support bot. How can I help?"])
def test_the_policy_marks_nothing_in_template_turns(policy, turn: str) -> None:
    assert policy(turn) == set()


def test_the_policy_marks_only_the_name_not_the_words_around_it(policy) -> None:
    assert policy("USR: Jessica Roop Yes, 366-68323-3594.") == {("Jessica Roop", "PERSON"), ("366-68323-3594", "ID")}
    assert policy("USR: I am Dorothy Warr. Yea sure, 1581 Lee Ramp East Robert, NC 08362.") == {
        ("Dorothy Warr", "PERSON"), ("1581 Lee Ramp East Robert, NC 08362", "LOCATION")}


def test_the_independent_check_counts_a_missed_value_and_attributes_it_to_the_slot_asked() -> None:
    dialogs = {f"d{i}": [("SYS: Hello, how can I help?", []), ("USR: Where is my package?", []),
                         ("SYS: Could you verify your full name?", []), (f"USR: Sure, Zed{i} Quux{i}.", [(11, 22)]),
                         ("SYS: Can you provide the order number?", []), (f"USR: It's 123-4567{i}-0000.", [])]
               for i in range(5)}
    dialogs["d0"][3] = ("USR: Sure, Zed0 Quux0.", [(11, 15)])  # the last name missed
    recall = policy_recall(dialogs)
    assert recall["name"] == [10, 9] and recall["order number"] == [15, 0]  # three digit groups each
    assert "other" not in recall  # greetings are template words (in every dialog), not values
    share = private_token_share({"d": [("USR: Sure, Zed Quux.", [(11, 19)])]})
    assert share == {"bytes": 8 / 20, "words": 2 / 4, "sentences": 1.0}


def test_the_policy_claim_fails_when_a_slot_is_missed_or_absent() -> None:
    claim = next(c for c in claims(SCALES["cpu"]) if "regex policy" in c.statement)
    whole = {"name": [100, 100], "address": [50, 50], "phone": [30, 30], "order number": [30, 30],
             "tracking number": [60, 60]}
    assert judge([claim], Results(figures={"policy_recall": whole}), "cpu")[0].holds
    missed = {**whole, "address": [50, 40]}
    verdict = judge([claim], Results(figures={"policy_recall": missed}), "cpu")[0]
    assert not verdict.holds and "address 80.0%" in verdict.ours
    absent = {k: v for k, v in whole.items() if k != "phone"}
    assert "no phone in the data" in judge([claim], Results(figures={"policy_recall": absent}), "cpu")[0].ours


# --- the corpus folder ----------------------------------------------------------------------------------------


def test_a_scale_reads_the_lowest_numbered_dialogs_and_never_the_canary_files(home, tmp_path: Path) -> None:
    folder = write_simdial(tmp_path / "simdial", {"train": 12, "valid": 3, "test": 3})
    files, dataset = dialog_files(Context("selective-customersim", "ci", home, folder),
                                  {"train": 10, "valid": 2, "test": 2})
    assert dataset == "customersim-first-10-2-2"
    assert [f"{p.parent.name}/{p.name}" for p in files] == (
        [f"train/dial-{i}.txt" for i in range(10)] + ["valid/dial-0.txt", "valid/dial-1.txt", "test/dial-0.txt",
                                                      "test/dial-1.txt"])
    everything, name = dialog_files(Context("selective-customersim", "cpu", home, folder), None)
    assert name == "customersim" and len(everything) == 18 and not any("canary" in p.name for p in everything)
    (folder / "test" / "dial-0.txt").rename(folder / "test" / "notes.txt")
    (folder / "test" / "dial-1.txt").unlink()
    (folder / "test" / "dial-2.txt").unlink()
    with pytest.raises(UedpError, match=r"test: no dialog files \(dial-N\.txt\); give --simdial-dir"):
        dialog_files(Context("selective-customersim", "ci", home, folder), None)
    with pytest.raises(UedpError, match=r"no train, valid, test; give --simdial-dir .* never downloads it"):
        dialog_files(Context("selective-customersim", "ci", home, tmp_path / "simdial" / "train"), None)
