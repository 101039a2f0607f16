"""``uedp reproduce``: the CoNLL-2003 experiments at their ``ci`` scale on the real files, through
the real flows, MLflow store and Parquet tables; each page's claims for that scale must hold, and the
page must be whole (README, PNGs, results.json) with the command and the machine on it.

Also the parts that need no training: the offline word vectors and attacker, the CoNLL document split,
the claims' verdicts, and a page that fails half-way leaving the old page intact.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from uedp.errors import UedpError
from uedp.experiments.claims import Claim, judge
from uedp.experiments.common import Context, Results, RunRow
from uedp.experiments.corpora import conll_documents
from uedp.experiments.page import Page
from uedp.experiments.reproduce import EXPERIMENTS, reproduce
from uedp.experiments.sanitize_conll import SCALES as SCALES_OF_SANITIZE

from support import check_ci_page

CONLL_EXPERIMENTS = [name for name, experiment in EXPERIMENTS.items() if experiment.corpus == "conll"]
# uedp-conll and selective-conll are run from scratch and from the public base in one page each by
# tests/test_reproduce_starts.py, which checks the same (support.check_ci_page) on those pages: their
# from-scratch rows and claims are these pages'. Running them here again trained the same rows twice.
WITH_A_SECOND_START = ("uedp-conll", "selective-conll")


def test_the_conll_pages_with_a_second_start_are_checked_whole_elsewhere() -> None:
    assert set(WITH_A_SECOND_START) == {n for n, e in EXPERIMENTS.items() if e.takes_start and e.corpus == "conll"}


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in CONLL_EXPERIMENTS if n not in WITH_A_SECOND_START])
def test_ci_scale_runs_the_experiment_and_its_claims_hold(name: str, home, shared_conll: Path, prefect_server,
                                                          tmp_path: Path) -> None:
    out = tmp_path / "page"
    lines: list[str] = []
    page = reproduce(name, "ci", home, shared_conll, out, say=lines.append)
    check_ci_page(name, page, out)


def test_every_experiment_is_offered_by_the_cli() -> None:
    from uedp.commands.results import REPRODUCE_NAMES

    assert set(REPRODUCE_NAMES) == set(EXPERIMENTS)


def test_unknown_experiment_or_scale_is_one_clear_error(home, tmp_path: Path) -> None:
    with pytest.raises(UedpError, match="unknown experiment 'nosuch'; valid: uedp-conll"):
        reproduce("nosuch", "ci", home, tmp_path, tmp_path / "out")
    with pytest.raises(UedpError, match="unknown scale 'huge'"):
        reproduce("uedp-conll", "huge", home, tmp_path, tmp_path / "out")  # type: ignore[arg-type]


def test_missing_conll_files_are_named(home, tmp_path: Path, prefect_server) -> None:
    with pytest.raises(UedpError, match=r"eng\.train.*--conll-dir"):
        reproduce("uedp-conll", "ci", home, tmp_path / "nowhere", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_every_experiment_names_its_corpus_folder_and_where_to_get_it(home, tmp_path: Path, monkeypatch) -> None:
    """A page whose corpus folder is not given, or lacks a file, stops before anything is written with
    one error naming the option and where to get the corpus (uedp never downloads one)."""
    from typer.testing import CliRunner

    from uedp.cli import app
    from uedp.experiments.common import Context
    from uedp.experiments.corpora import CORPORA, corpus_folder

    for corpus in CORPORA.values():
        monkeypatch.delenv(corpus.env, raising=False)
    for name, experiment in EXPERIMENTS.items():
        corpus = CORPORA[experiment.corpus]
        if corpus.key == "conll":
            continue  # has a default folder; its missing files are named by the test below
        result = CliRunner().invoke(app, ["reproduce", name, "--scale", "ci", "--home", str(tmp_path / "h"),
                                          "--out", str(tmp_path / name)])
        assert result.exit_code != 0, name
        assert corpus.option in result.output and "never downloads" in result.output, result.output
        assert not (tmp_path / name).exists()
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "valid.txt").write_text("x\n", encoding="utf-8")
    ctx = Context("selective-wikitext", "ci", home, tmp_path / "corpus")
    with pytest.raises(UedpError, match=r"no train\.txt or wiki\.train\.tokens; give --wikitext-dir") as caught:
        corpus_folder(ctx, "wikitext", ["train.txt|wiki.train.tokens", "valid.txt|wiki.valid.tokens"])
    assert "valid" not in str(caught.value).split(";")[0]  # the file that is there is not named missing
    assert corpus_folder(ctx, "wikitext", ["valid.txt"]) == tmp_path / "corpus"


def test_conll_documents_split_at_docstart(tmp_path: Path) -> None:
    path = tmp_path / "eng.train"
    path.write_text("-DOCSTART- -X- O O\n\nEU NNP B-NP B-ORG\n\n-DOCSTART- -X- O O\n\nPeter NNP B-NP B-PER\n"
                    "Blackburn NNP I-NP I-PER\n\n-DOCSTART- -X- O O\n\n", encoding="utf-8")
    documents = conll_documents(path)
    assert len(documents) == 2  # the empty last document is dropped
    assert documents[1][2].startswith("Peter")


def _row(label: str, perplexity: float, target: float | None = None) -> RunRow:
    return RunRow(label, "gpt2 tiny", target, math.inf if target is None else target, perplexity, 1.0, "r" * 32)


def test_claims_are_judged_on_the_figures_and_a_missing_run_is_not_a_pass() -> None:
    results = Results([_row("noiseless", 10.0), _row("userdp", 20.0, 2.0)])
    better = Claim("noiseless beats userdp", "the seed", "reproduces",
                   lambda r: (r.perplexity("noiseless") < r.perplexity("userdp"), "ours"))
    missing = Claim("uedp beats userdp", "the seed", "contradicts",
                    lambda r: (r.perplexity("uedp") < r.perplexity("userdp"), "ours"))
    ci_only = Claim("never judged at cpu", "", "reproduces", lambda r: (True, ""), ("ci",))
    verdicts = judge([better, missing, ci_only], results, "cpu")
    assert [v.verdict for v in verdicts] == ["reproduces", "does not hold at this scale"]
    assert "not measured (no finished run of uedp)" in verdicts[1].ours
    worse = Results([_row("noiseless", 30.0), _row("userdp", 20.0, 2.0)])
    assert not judge([better], worse, "cpu")[0].holds


def test_a_page_that_fails_half_way_leaves_the_old_page_whole(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = tmp_path / "page"
    out.mkdir()
    (out / "README.md").write_text("the old page\n", encoding="utf-8")

    class Broken:
        def savefig(self, path: Path) -> None:
            Path(path).write_bytes(b"half")
            raise OSError("disk full")

    page = Page("t", ["x"], {"a.png": Broken()}, Results(), [])
    with pytest.raises(OSError, match="disk full"):
        page.write(out)
    assert (out / "README.md").read_text(encoding="utf-8") == "the old page\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page"]
    figure = plt.figure()
    Page("t", ["new"], {"a.png": figure}, Results(), []).write(out)
    assert (out / "README.md").read_text(encoding="utf-8") == "# t\n\nnew\n"
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "a.png", "results.json"]


def test_word_vectors_from_public_text_put_related_words_together() -> None:
    from uedp.privacy.sanitization.embeddings import word_vectors_from_text

    cities = ["paris", "london", "berlin", "madrid", "rome", "vienna"]
    numbers = ["one", "two", "three", "four", "five", "six"]
    rng = np.random.default_rng(0)
    texts = [f"he flew to {rng.choice(cities)} on monday ." for _ in range(300)]
    texts += [f"she bought {rng.choice(numbers)} apples today ." for _ in range(300)]
    embeddings = word_vectors_from_text(texts, dim=8)
    assert np.allclose(np.linalg.norm(embeddings.vectors, axis=1), 1.0, atol=1e-5)

    def cosine(a: str, b: str) -> float:
        return float(embeddings.vectors[embeddings.index[a]] @ embeddings.vectors[embeddings.index[b]])

    assert cosine("paris", "london") > cosine("paris", "three") + 0.3
    assert cosine("two", "five") > cosine("two", "berlin") + 0.3
    with pytest.raises(UedpError, match="too few"):
        word_vectors_from_text(["a b c"], dim=8)


def test_saved_vectors_load_back(tmp_path: Path) -> None:
    from uedp.privacy.sanitization.embeddings import load_vectors, save_npz, word_vectors_from_text

    texts = [f"w{i} w{i + 1} w{i + 2} w{(i * 7) % 50}" for i in range(200)]
    embeddings = word_vectors_from_text(texts, dim=4)
    loaded = load_vectors(save_npz(embeddings, tmp_path / "v.npz"))
    assert loaded.tokens == embeddings.tokens and np.allclose(loaded.vectors, embeddings.vectors)


def _release(label: str, epsilon: float, kept: float, attacked: float, original: float = 0.25) -> RunRow:
    return RunRow(label, "gpt2 tiny", epsilon, epsilon, 20.0, 1.0, "r" * 32,
                  {"kept_token_share": kept, "mask_inference_success": attacked,
                   "mask_inference_success_original": original})


def test_sanitize_attack_claims_fail_on_a_release_that_hides_nothing_or_an_attacker_that_ignores_context() -> None:
    from uedp.experiments.sanitize_conll import SCALES, attack_on_original, claims

    def verdicts(runs: list[RunRow]) -> dict[str, bool]:
        results = Results([_row("noiseless", 10.0), *runs])
        return {v.statement: v.holds for v in judge(claims(SCALES["cpu"]), results, "cpu")}

    hides = "every release hides tokens from the attack: it recovers fewer than from the original text"
    rises = "the mask-token inference attack recovers more as epsilon rises"
    sound = [_release("custext", 1.0, 0.1, 0.08), _release("custext", 10.0, 0.5, 0.15)]
    assert attack_on_original(Results(sound)) == pytest.approx(0.25)
    assert verdicts(sound)[hides] and verdicts(sound)[rises]
    # a broken sanitizer that releases the text unchanged: the attack does as well as on the original
    assert not verdicts([_release("custext", 1.0, 1.0, 0.25), _release("custext", 10.0, 1.0, 0.25)])[hides]
    # an attacker that guesses "." everywhere: the same success on every release (the old page's 6.2%)
    assert not verdicts([_release("custext", 1.0, 0.1, 0.062), _release("custext", 10.0, 0.5, 0.062)])[rises]


def test_a_page_re_rendered_twice_says_so_once(home, tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    from uedp.experiments.reproduce import rerender
    from uedp.experiments.sanitize_conll import page

    out = tmp_path / "sanitize-conll"
    results = Results([_row("noiseless", 10.0), _release("custext", 1.0, 0.1, 0.08),
                       _release("custext", 10.0, 0.5, 0.15)],
                      {"dataset": "d", "public_sentences": 10, "vocabulary_coverage": 0.9, "scale": "cpu"})
    made = page(Context("sanitize-conll", "cpu", home, tmp_path), SCALES_OF_SANITIZE["cpu"], results)
    made.sections.insert(1, "Made by `uedp reproduce sanitize-conll` (cpu scale) in **1.0 minutes**.")
    made.write(out)  # as an older uedp wrote it: no made_by in results.json
    plt.close("all")
    for _ in range(2):
        rerender("sanitize-conll", home, out)
    text = (out / "README.md").read_text(encoding="utf-8")
    assert text.count("Made by `uedp reproduce sanitize-conll`") == 1
    assert text.count("re-rendered from `results.json`") == 1
    assert json.loads((out / "results.json").read_text(encoding="utf-8"))["figures"]["made_by"].startswith("Made by")


def test_exposure_claims_are_not_passed_on_what_a_random_rank_gives() -> None:
    """Exposures near a random rank's 1.44 bits say the attack found nothing: a claim comparing them must
    not hold whichever way the noise fell; with the noiseless model's canaries found, it is judged by a margin."""
    from uedp.experiments.claims import MEASURABLE_EXPOSURE
    from uedp.experiments.selective_conll import SCALES as SELECTIVE_SCALES
    from uedp.experiments.selective_conll import claims

    def results(noiseless: float, dpsgd: float, selective: float) -> Results:
        return Results([RunRow(label, "gpt2 tiny", None, 1.0, 10.0, 1.0, "r" * 32, {"canary_exposure_mean": value})
                        for label, value in (("noiseless", noiseless), ("dpsgd", dpsgd), ("selective", selective))])

    hides, missed = [c for c in claims(SELECTIVE_SCALES["cpu"]) if "canar" in c.statement or "secret" in c.statement]
    noise = results(2.3, 1.3, 2.0)  # the committed page's figures before this check: ordered, by chance
    for claim in (hides, missed):
        holds, ours = claim.check(noise)
        assert not holds and "not measurable at this scale" in ours
    found = results(MEASURABLE_EXPOSURE + 6, 1.5, 4.0)
    assert hides.check(found)[0] and missed.check(found)[0]
    assert not missed.check(results(MEASURABLE_EXPOSURE + 6, 1.5, 2.0))[0]  # within the margin: not shown
