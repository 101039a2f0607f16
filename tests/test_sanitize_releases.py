"""One local-DP release per name, drawn once: what a reuse reports and what it refuses.

A release is never drawn twice (two draws of the same text side by side compose), so everything about
it that can change after the draw (a figure's definition, the attacker, the machine) must be measured
again from what it drew, looked up, or refused, and never reported stale. Real Parquet tables, real
sanitization of the demo corpus, a real table store on the local file system.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from uedp.detection.pipeline import DetectorConfig
from uedp.errors import UedpError
from uedp.flows.demo import DEMO_CORPUS
from uedp.privacy.attacks.cloze import BigramCloze
from uedp.privacy.sanitization.draws import Draws
from uedp.services.detect import detect_entities
from uedp.services.sanitize import SanitizeConfig, sanitize_dataset
from uedp.storage.ingest import IngestOptions, ingest
from uedp.storage.tables import read_table

from support import write


@pytest.fixture
def vectors(tmp_path: Path) -> Path:
    words = sorted({w for w in re.findall(r"\w+(?:['’-]\w+)*|[^\w\s]", DEMO_CORPUS.read_text()) if w.strip()})
    words = [w for w in words if "DOCSTART" not in w][::2]  # half the words: the others have no vector (<unk>)
    rng = np.random.default_rng(0)
    return write(tmp_path / "vectors.txt", "".join(f"{w} " + " ".join(f"{x:.4f}" for x in rng.normal(size=8)) + "\n"
                                                   for w in words))


@pytest.fixture
def demo(home) -> str:
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    return "demo"


def _train_text(home, dataset: str) -> list[str]:
    return [r["text"] for r in read_table(home.table_dir(dataset, "sentences")).to_pylist() if r["split"] == "train"]


def _attacker(texts: list[str], folder: Path) -> str:
    return str(BigramCloze.fit(texts).save(folder))


def _manifest(home, dataset: str) -> tuple[Path, dict]:
    path = home.table_dir(dataset, "sentences") / "manifest.json"
    return path, json.loads(path.read_text(encoding="utf-8"))


def test_a_reuse_recomputes_the_figures_from_the_draws_not_the_manifest(home, demo: str, vectors: Path) -> None:
    config = SanitizeConfig(dataset=demo, epsilon=1.0, k=5, embeddings=str(vectors))
    first = sanitize_dataset(home, config)
    assert first.unknown_share > 0.2  # half the words have no vector: <unk> matters here
    path, manifest = _manifest(home, first.dataset)
    manifest["sanitization"]["unchanged_share"] = 0.99  # a stale stored figure
    path.write_text(json.dumps(manifest), encoding="utf-8")
    again = sanitize_dataset(home, config)
    assert again.reused and again.unchanged_share == pytest.approx(first.unchanged_share)


def test_the_attack_is_measured_once_per_attacker_then_looked_up(home, demo: str, vectors: Path,
                                                                  tmp_path: Path) -> None:
    train = _train_text(home, demo)
    weak = _attacker(["an unrelated sentence about the weather ."] * 3, tmp_path / "weak")
    strong = _attacker(train, tmp_path / "strong")  # knows the private text: the strongest attacker
    config = SanitizeConfig(dataset=demo, epsilon=1.0, k=5, embeddings=str(vectors), attack_sentences=60)
    first = sanitize_dataset(home, config.model_copy(update={"attack_model": weak}))
    drawn = _train_text(home, first.dataset)
    again = sanitize_dataset(home, config.model_copy(update={"attack_model": strong}))
    assert again.reused and _train_text(home, first.dataset) == drawn  # the same release, not a new draw
    assert again.mask_inference_success_original > first.mask_inference_success_original + 0.2  # the new attacker's
    plain = sanitize_dataset(home, config)
    assert plain.reused and plain.mask_inference_success is None and plain.unchanged_share == first.unchanged_share

    (home.table_dir(first.dataset, "sentences") / "draws.npz").unlink()  # nothing left to measure on
    assert sanitize_dataset(home, config.model_copy(update={"attack_model": weak})).mask_inference_success == \
        first.mask_inference_success  # stored with the release, under the weak attacker's identity
    assert sanitize_dataset(home, config.model_copy(update={"attack_model": strong})).mask_inference_success == \
        again.mask_inference_success  # cached when it was measured
    BigramCloze.fit(train[:3]).save(Path(strong))  # the same folder, another attacker: not the cached figures
    with pytest.raises(UedpError, match="draws are not in this data home"):
        sanitize_dataset(home, config.model_copy(update={"attack_model": strong}))


def test_an_older_release_without_draws_has_its_kept_share_migrated_and_is_never_redrawn(
        home, demo: str, vectors: Path) -> None:
    config = SanitizeConfig(dataset=demo, epsilon=1.0, k=5, embeddings=str(vectors))
    first = sanitize_dataset(home, config)
    drawn = _train_text(home, first.dataset)
    (home.table_dir(first.dataset, "sentences") / "draws.npz").unlink()
    path, manifest = _manifest(home, first.dataset)
    stored = manifest["sanitization"]
    stored["unchanged_share"] += stored["unknown_share"] * stored["sanitized_share"]  # how uedp counted <unk> before
    del manifest["figures_version"]
    path.write_text(json.dumps(manifest), encoding="utf-8")
    old = sanitize_dataset(home, config)
    assert old.reused and old.unchanged_share == pytest.approx(first.unchanged_share)
    assert _train_text(home, first.dataset) == drawn


def test_another_release_under_a_name_that_holds_one_is_refused_naming_what_differs(home, demo: str,
                                                                                     vectors: Path) -> None:
    mine = SanitizeConfig(dataset=demo, epsilon=1.0, k=5, embeddings=str(vectors), output="mine")
    sanitize_dataset(home, mine)
    drawn = _train_text(home, "mine")
    with pytest.raises(UedpError, match=r"'mine' already holds another release: k \(5, now 6\).*remove .*mine.*--output"):
        sanitize_dataset(home, mine.model_copy(update={"k": 6}))
    assert _train_text(home, "mine") == drawn


def test_a_secure_draw_is_one_release_whatever_the_seed_and_seeded_draws_are_one_per_seed(home, demo: str,
                                                                                          vectors: Path) -> None:
    secure = SanitizeConfig(dataset=demo, epsilon=1.0, k=5, embeddings=str(vectors))
    first = sanitize_dataset(home, secure)
    other_seed = sanitize_dataset(home, secure.model_copy(update={"seed": 1}))  # a sweep's second seed
    assert other_seed.reused and other_seed.dataset == first.dataset
    seeded = [SanitizeConfig(dataset=demo, epsilon=1.0, k=5, embeddings=str(vectors), randomness="seeded", seed=seed)
              for seed in (0, 1)]
    assert len({c.output_name for c in seeded} | {secure.output_name}) == 3
    assert not any(sanitize_dataset(home, c).reused for c in seeded)


def test_entity_releases_of_other_categories_have_other_names() -> None:
    def name(categories: list[str], dataset: str = "demo") -> str:
        return SanitizeConfig(dataset=dataset, epsilon=1.0, embeddings="v.txt", keep="non-entities",
                              categories=categories).output_name

    assert name(["PERSON"]) == "demo-custext-e1-k50-token-entities-PERSON"
    assert name(["LOC", "PERSON"]) == name(["PERSON", "LOC"]) != name(["PERSON"])
    long = name(["PERSON", "LOC", "ORG", "MISC"], dataset="conll2003-first-60-40-8")
    assert len(long) <= 64 and long != name(["PERSON", "LOC", "ORG"], dataset="conll2003-first-60-40-8")


def test_draws_round_trip_with_empty_sentences_and_no_sentences(tmp_path: Path) -> None:
    spans = [[(0, 3), (4, 7)], [], [(0, 2)]]
    records = [np.array([5, -1]), np.array([], dtype=np.int64), np.array([-2])]
    released = [np.array([6, -1]), np.array([], dtype=np.int64), np.array([-2])]
    Draws(np.array([2, 5, 9]), spans, records, released).save(tmp_path / "d.npz")
    back = Draws.load(tmp_path / "d.npz")
    assert back is not None and back.rows.tolist() == [2, 5, 9] and back.spans == spans
    assert [r.tolist() for r in back.records] == [[5, -1], [], [-2]] and [r.tolist() for r in back.released] == [[6, -1], [], [-2]]
    Draws(np.array([], dtype=np.int64), [], [], []).save(tmp_path / "none.npz")
    empty = Draws.load(tmp_path / "none.npz")
    assert empty is not None and empty.spans == [] and empty.records == [] and empty.released == []
    assert Draws.load(tmp_path / "missing.npz") is None
    np.savez(tmp_path / "bad.npz", rows=np.array([1]), lengths=np.array([2]), spans=np.zeros((1, 2)),
             records=np.array([1]), released=np.array([1]))
    with pytest.raises(ValueError, match="do not add up"):
        Draws.load(tmp_path / "bad.npz")


def test_a_table_side_file_is_swapped_in_with_it_and_never_published(home, demo: str, vectors: Path,
                                                                      tmp_path: Path) -> None:
    from uedp.storage.remote import TableStore
    from uedp.storage.schemas import USERS
    from uedp.storage.tables import TableWriter

    writer = TableWriter(tmp_path / "t", USERS, "k")
    for bad in ("data.parquet", "manifest.json", "a/b", ".hidden"):
        with pytest.raises(ValueError, match="cannot be a side file"):
            writer.side_file(bad)
    release = sanitize_dataset(home, SanitizeConfig(dataset=demo, epsilon=1.0, k=5, embeddings=str(vectors)))
    store = TableStore((tmp_path / "bucket").as_uri())
    store.push(home, release.dataset, "sentences")
    published = sorted(p.name for p in (tmp_path / "bucket").rglob("*") if p.is_file())
    assert "draws.npz" not in published and "manifest.json" in published


def test_a_second_machine_trains_on_the_release_the_first_drew(home, demo: str, vectors: Path, tmp_path: Path) -> None:
    """With a table store, a release drawn on one machine is pushed, and another machine pulls it instead
    of drawing its own (two draws of the same text would compose)."""
    from uedp.services.config import TrainConfig
    from uedp.services.training_inputs import draw_inputs
    from uedp.storage.home import DataHome
    from uedp.storage.remote import TableStore

    store = TableStore((tmp_path / "bucket").as_uri())
    for table in ("sentences", "users", "entities"):
        store.push(home, demo, table)
    config = TrainConfig(dataset=demo, mechanism="custext", target_epsilon=1.0, embeddings=str(vectors), k=5)
    draw_inputs(home, config, store)
    name = "demo-custext-e1-k5-token"
    drawn = _train_text(home, name)
    other = DataHome.from_env(tmp_path / "other-machine")
    store.pull_required(other, demo, ("sentences", "users", "entities"))
    draw_inputs(other, config, store)
    assert _train_text(other, name) == drawn  # pulled, not drawn again
    assert not (other.table_dir(name, "sentences") / "draws.npz").exists()


def test_a_release_of_labelled_rows_says_its_labels_are_outside_the_guarantee(home, demo: str, vectors: Path,
                                                                               tmp_path: Path) -> None:
    """Local DP draws replace the text's tokens; a row's class is copied into the release as it is, so the
    statement of a release of a classification corpus (and of any classifier trained on it) must say so."""
    from uedp.services.sanitize import LABELS_CAVEAT

    unlabelled = sanitize_dataset(home, SanitizeConfig(dataset=demo, epsilon=1.0, k=5, embeddings=str(vectors)))
    assert LABELS_CAVEAT not in unlabelled.caveats
    rows = [w for line in DEMO_CORPUS.read_text().splitlines() if line.strip() and "DOCSTART" not in line
            for w in line.split()[:1] if w.isalnum()]
    csv = write(tmp_path / "rated.train.csv", "text,user,label\n" + "".join(
        f"{' '.join(rows[i:i + 6])},u{i % 7},{i % 2}\n" for i in range(0, 600, 6)))
    ingest(home, "rated", [csv], IngestOptions(format="csv", text_col="text", user_col="user", label_col="label"))
    labelled = sanitize_dataset(home, SanitizeConfig(dataset="rated", epsilon=1.0, k=5, embeddings=str(vectors)))
    assert LABELS_CAVEAT in labelled.caveats
    assert LABELS_CAVEAT in sanitize_dataset(home, SanitizeConfig(dataset="rated", epsilon=1.0, k=5,
                                                                   embeddings=str(vectors))).caveats  # reused too
