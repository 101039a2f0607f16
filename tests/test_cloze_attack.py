"""The mask-token inference attack's offline attacker (a bigram cloze model built from public text):
it guesses from both neighbours and never from the masked word itself, it saves and loads, the attack's
loader tells its two kinds of attacker apart, and, through the real sanitize task, its success moves
with what a release keeps (the attacker it replaces guessed "." everywhere and scored the same 6.2% on
every release of CoNLL-2003, whatever the epsilon).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from uedp.privacy.attacks.cloze import BigramCloze
from uedp.privacy.attacks.mask_inference import inference_success, load_predictor
from uedp.privacy.sanitization.embeddings import words_of

PUBLIC = ["She moved to New York last year .", "The New York office opened in May .",
          "He flew from New Delhi to Paris .", "They met in New York again .", "We drove from New Delhi to Agra .",
          "The office in Paris opened in June .", "She flew to Paris last May ."]


def test_the_guess_comes_from_both_neighbours() -> None:
    model = BigramCloze.fit(PUBLIC)
    assert model.predict([["We", "visited", "New", "MASKED", "city"]], [3]) == ["york"]  # only York follows New
    assert model.predict([["flew", "from", "New", "MASKED", "to", "Paris"]], [3]) == ["delhi"]  # Delhi precedes "to"
    assert model.predict([["<unk>", "MASKED", "to", "Agra"]], [1]) == ["delhi"]  # the left tells nothing here


def test_the_masked_word_itself_is_never_looked_at() -> None:
    model = BigramCloze.fit(PUBLIC)
    sentences = [["moved", "to", word, "York"] for word in ("New", "Old", "<unk>", "zzz")]
    assert len(set(model.predict(sentences, [2] * 4))) == 1


def test_unknown_neighbours_fall_back_to_word_frequency() -> None:
    model = BigramCloze.fit(PUBLIC)
    guess = model.predict([["<unk>", "MASKED", "<unk>"]], [1])[0]
    assert guess in {".", "new", "in"}  # the commonest words of the public text, never a sentence mark
    assert guess not in {"<s>", "</s>"}


def test_saved_model_predicts_the_same_and_the_loader_finds_it(tmp_path: Path) -> None:
    model = BigramCloze.fit(PUBLIC)
    folder = model.save(tmp_path / "cloze")
    assert not list(folder.glob(".*tmp*"))
    loaded = load_predictor(folder, torch.device("cpu"))
    sentences = [words_of(t) for t in PUBLIC]
    jobs = [(s, j) for s in sentences for j in range(len(s))]
    assert loaded([s for s, _ in jobs], [j for _, j in jobs]) == model.predict([s for s, _ in jobs], [j for _, j in jobs])
    assert BigramCloze.load(folder).words == model.words


def test_a_folder_without_an_attacker_is_one_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"empty holds neither a bigram cloze model nor a masked language model"):
        load_predictor(empty, torch.device("cpu"))
    with pytest.raises(ValueError, match="at least one word"):
        BigramCloze.fit(["", "  "])


def test_attack_success_is_higher_on_text_the_release_kept() -> None:
    model = BigramCloze.fit(PUBLIC)
    original = [words_of(t) for t in PUBLIC]
    scrambled = [["<unk>"] * len(s) for s in original]
    full = inference_success(original, original, model.predict)
    assert full > 0.5  # it knows this text
    assert inference_success(original, scrambled, model.predict) < full / 2


@pytest.mark.slow
def test_through_the_sanitize_task_the_attack_tracks_the_epsilon(home, tmp_path: Path) -> None:
    """A release at a tiny epsilon hides more from the attacker than one at a huge epsilon, which keeps
    almost everything and is attacked almost as well as the original text."""
    import re

    import numpy as np

    from uedp.detection.pipeline import DetectorConfig
    from uedp.flows.demo import DEMO_CORPUS
    from uedp.services.detect import detect_entities
    from uedp.services.sanitize import SanitizeConfig, sanitize_dataset
    from uedp.storage.ingest import IngestOptions, ingest
    from uedp.storage.tables import read_table

    from support import write

    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    words = sorted({w for w in re.findall(r"\w+(?:['’-]\w+)*|[^\w\s]", DEMO_CORPUS.read_text()) if w.strip()})
    rng = np.random.default_rng(0)
    vectors = write(tmp_path / "vectors.txt", "".join(f"{w} " + " ".join(f"{x:.4f}" for x in rng.normal(size=8)) + "\n"
                                                      for w in words if "DOCSTART" not in w))
    # The attacker holds text like the private text (here: the demo's own train split, the strongest case).
    train = [r["text"] for r in read_table(home.table_dir("demo", "sentences")).to_pylist() if r["split"] == "train"]
    attacker = BigramCloze.fit(train).save(tmp_path / "attacker")
    results = {eps: sanitize_dataset(home, SanitizeConfig(dataset="demo", epsilon=eps, k=10, embeddings=str(vectors),
                                                          attack_model=str(attacker), attack_sentences=120))
               for eps in (0.5, 200.0)}
    low, high = results[0.5], results[200.0]
    assert low.mask_inference_success_original == pytest.approx(high.mask_inference_success_original)  # same sample
    assert high.mask_inference_success_original > 0.3
    assert low.mask_inference_success < 0.6 * high.mask_inference_success
    assert high.mask_inference_success > 0.8 * high.mask_inference_success_original
