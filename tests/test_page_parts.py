"""The parts every results page is made of (experiments/common, corpora, runs, claims, page, epsilon_curves),
each on its own: the numbers and sentences a page prints, its inputs' copies, the rows all pages share, the
judging of claims and the curves' claims. The pages themselves run end to end in tests/test_reproduce*.py."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from uedp.errors import UedpError
from uedp.experiments.claims import (
    EXPOSURE_MARGIN,
    MEASURABLE_EXPOSURE,
    Claim,
    clearly_above,
    exposure_unmeasurable,
    judge,
)
from uedp.experiments.common import Context, Results, RunRow
from uedp.experiments.corpora import CORPORA, conll_documents, conll_inputs, corpus_folder, write_if_changed
from uedp.experiments.epsilon_curves import epsilon_at, plus_no_worse_than_naive, uedp_above_userdp_at_50
from uedp.experiments.page import (
    budget_at,
    budgets_sentence,
    markdown_table,
    number,
    one_budget_sentence,
    perplexity_text,
    verdict_table,
    write_command_file,
)
from uedp.experiments.runs import SHARED_ROW_KEYS, _variant, shared_rows
from uedp.services.config import TrainConfig
from uedp.storage.home import DataHome


def run(label: str, perplexity: float, target: float | None = None, family: str = "gpt2 tiny", **kw: object) -> RunRow:
    return RunRow(label, family, target, target if target else math.inf, perplexity, 90.0, label.ljust(32, "0"),
                  **kw)  # type: ignore[arg-type]


# --- numbers and sentences -----------------------------------------------------------------------------------


def test_numbers_read_as_a_page_prints_them() -> None:
    assert number(3.14159) == "3.14" and number(3.14159, 4) == "3.142"
    assert number(math.nan) == "-" and number(math.inf) == "inf" and number(123456.0) == "1.23e+05"
    assert perplexity_text(12.3456) == "12.35"
    assert perplexity_text(300.0) == "300 (worse than uniform)"  # a byte model: 257 is a uniform guess
    assert perplexity_text(300.0, uniform=49_152.0) == "300"  # SmolLM2's vocabulary
    assert perplexity_text(5e6) == "5.0e+06 (diverged)"


class Budget:
    def __init__(self, epsilon: float = 8.0, epsilons: tuple[float, ...] = (), noise_multiplier: float | None = None):
        self.epsilon, self.epsilons, self.noise_multiplier = epsilon, epsilons, noise_multiplier


def test_a_pages_budget_reads_as_its_epsilon_or_the_noise_that_stands_in_for_it() -> None:
    assert budget_at(Budget(8.0)) == "epsilon 8" and budget_at(Budget(noise_multiplier=1.5)) == "noise multiplier 1.5"
    assert one_budget_sentence(Budget(3.0)) == "Target epsilon 3"
    assert one_budget_sentence(Budget(noise_multiplier=2.0)).startswith("Noise multiplier 2 (no calibration")
    assert budgets_sentence(Budget(epsilons=(2.0, 8.0))) == "Target epsilons 2, 8"
    assert budgets_sentence(Budget(noise_multiplier=1.0)).startswith("Noise multiplier 1 for every private mechanism")


def test_tables_are_markdown_with_numbers_right_aligned() -> None:
    table = markdown_table(["mechanism", "perplexity"], [["dpsgd", "12.3"], ["noiseless", "9.1"]])
    assert table.splitlines() == ["| mechanism | perplexity |", "|---|---:|", "| dpsgd | 12.3 |", "| noiseless | 9.1 |"]
    verdicts = judge([Claim("dpsgd is worse", "the paper agrees", "reproduces", lambda r: (True, "12.3 > 9.1"))],
                     Results(), "cpu")
    assert verdict_table(verdicts).splitlines()[-1] == "| dpsgd is worse | the paper agrees | 12.3 > 9.1 | **reproduces** |"


def test_the_command_file_records_the_command_machine_and_wall_time(tmp_path: Path) -> None:
    write_command_file(tmp_path, 12.34, "1 torch thread", "sweep: 4 runs", name="command-base.txt")
    lines = (tmp_path / "command-base.txt").read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("python ") and lines[1] == "sweep: 4 runs"
    assert "(1 torch thread)" in lines[2] and f"{os.cpu_count()} CPUs" in lines[2]
    assert lines[3] == "total wall time: 12.3 min"


# --- claims --------------------------------------------------------------------------------------------------


def test_a_claim_is_judged_at_its_scales_and_a_missing_run_is_not_measured() -> None:
    results = Results([run("noiseless", 9.0), run("dpsgd", 12.0, 8.0)])
    both = Claim("dpsgd is worse than noiseless", "seed", "reproduces",
                 lambda r: (r.perplexity("dpsgd") > r.perplexity("noiseless"), "ours"))
    full_only = Claim("userdp is measured", "seed", "extends", lambda r: (r.perplexity("userdp") > 0, "ours"),
                      ("cpu", "gpu"))
    at_ci = judge([both, full_only], results, "ci")
    assert [v.statement for v in at_ci] == ["dpsgd is worse than noiseless"] and at_ci[0].verdict == "reproduces"
    at_cpu = judge([both, full_only], results, "cpu")
    assert at_cpu[1].holds is False and at_cpu[1].ours == "not measured (no finished run of userdp)"
    assert at_cpu[1].verdict == "does not hold at this scale"


def test_results_average_seeds_and_select_by_target_and_family() -> None:
    results = Results([run("dpsgd", 10.0, 8.0), run("dpsgd", 14.0, 8.0), run("dpsgd", 30.0, 2.0),
                       run("dpsgd", 99.0, 8.0, family="lstm tiny", extra={"canary_exposure_mean": 3.0})])
    assert results.perplexity("dpsgd", 8.0, "gpt2 tiny") == 12.0 and results.targets() == [2.0, 8.0]
    assert results.extra("dpsgd", "canary_exposure_mean") == 3.0
    with pytest.raises(UedpError, match="no finished run of dpsgd at epsilon 3"):
        results.perplexity("dpsgd", 3.0)
    with pytest.raises(UedpError, match="no canary_exposure_mean for dpsgd at epsilon 2"):
        results.extra("dpsgd", "canary_exposure_mean", 2.0)


def test_exposures_compare_only_above_chance_and_by_a_margin() -> None:
    assert exposure_unmeasurable(MEASURABLE_EXPOSURE) is None
    assert "not measurable at this scale" in (exposure_unmeasurable(MEASURABLE_EXPOSURE - 0.01) or "")
    assert clearly_above(5.0 + EXPOSURE_MARGIN + 0.01, 5.0) and not clearly_above(5.0 + EXPOSURE_MARGIN, 5.0)


# --- epsilon curves ------------------------------------------------------------------------------------------


def curves(uedp: list[float], naive: list[float], userdp: list[float]) -> Results:
    rounds = [10.0, 50.0, 100.0]
    return Results(figures={"epsilon_curves": {name: [[t, e] for t, e in zip(rounds, values)] for name, values in
                                                (("uedp", uedp), ("uedp-naive", naive), ("userdp", userdp))}})


def test_the_curves_claims_compare_at_fifty_rounds_and_at_every_round() -> None:
    r = curves([0.5, 1.2, 2.0], [0.5, 1.3, 2.0], [0.4, 1.0, 1.6])
    assert epsilon_at(r.figures["epsilon_curves"], "uedp", 50.0) == 1.2
    holds, ours = uedp_above_userdp_at_50(r)
    assert holds and ours == "uedp 1.2, uedp-naive 1.3, userdp 1"
    holds, ours = plus_no_worse_than_naive(r)
    assert holds and ours.startswith("uedp <= uedp-naive at all 3 round counts (2 equal")
    assert not plus_no_worse_than_naive(curves([0.5, 1.4, 2.0], [0.5, 1.3, 2.0], [0.4, 1.0, 1.6]))[0]
    assert not uedp_above_userdp_at_50(curves([0.5, 0.9, 2.0], [0.5, 1.3, 2.0], [0.4, 1.0, 1.6]))[0]


# --- rows every page shares ------------------------------------------------------------------------------------


def test_shared_rows_carry_the_keys_every_page_has_and_leave_out_rows_made_before_them() -> None:
    rows = shared_rows([run("dpsgd", 12.0, 8.0, mechanism="dpsgd", variant="lora8", seed=0, start="smollm2"),
                        run("noiseless", 9.0)], "conll")  # the second: a page made before the keys existed
    assert len(rows) == 1 and set(SHARED_ROW_KEYS) <= set(rows[0])
    assert rows[0] | {"minutes": 0} == {"corpus": "conll", "mechanism": "dpsgd", "variant": "lora8", "start": "smollm2",
                                        "target_epsilon": 8.0, "seed": 0, "perplexity_test": 12.0, "epsilon": 8.0,
                                        "family": "gpt2 tiny", "run_id": "dpsgd".ljust(32, "0"), "minutes": 0}
    assert shared_rows([run("dpsgd", 1.0, 8.0, mechanism="dpsgd")], "c")[0]["minutes"] == 1.5


def test_a_rows_variant_is_its_label_beyond_the_mechanism_and_its_lora_rank() -> None:
    assert _variant(TrainConfig(dataset="d", mechanism="dpsgd")) == ""
    assert _variant(TrainConfig(dataset="d", mechanism="dpsgd", lora_rank=8)) == "lora8"
    bounded = TrainConfig(dataset="d", mechanism="uedp-bounded", holders_per_entity=4)
    assert _variant(bounded) == bounded.label[len("uedp-bounded"):].strip("-")


# --- inputs --------------------------------------------------------------------------------------------------


def test_conll_documents_split_at_docstart_and_drop_empty_ones(tmp_path: Path) -> None:
    path = tmp_path / "eng.train"
    path.write_text("-DOCSTART- -X- O O\n\nEU NNP B-NP B-ORG\n\n-DOCSTART- -X- O O\n\n-DOCSTART- -X- O O\n\n"
                    "Peter NNP B-NP B-PER\n.\n", encoding="utf-8")
    documents = conll_documents(path)
    assert len(documents) == 2 and documents[0][2].startswith("EU") and documents[1][2].startswith("Peter")


def test_a_copy_is_rewritten_only_when_its_text_changes(tmp_path: Path) -> None:
    target = write_if_changed(tmp_path / "eng.testb", "one\n")
    os.utime(target, (1_000_000, 1_000_000))
    write_if_changed(target, "one\n")
    assert target.stat().st_mtime == 1_000_000  # unchanged: its tables' cache key holds, the ingest is reused
    write_if_changed(target, "two\n")
    assert target.read_text(encoding="utf-8") == "two\n" and not list(tmp_path.glob(".*tmp*"))


def test_a_missing_corpus_names_the_option_the_variable_and_where_to_get_it(tmp_path: Path) -> None:
    ctx = Context("sanitize-sst2", "ci", DataHome(tmp_path / "home"), tmp_path)
    (tmp_path / "train.tsv").write_text("x", encoding="utf-8")
    with pytest.raises(UedpError) as caught:
        corpus_folder(ctx, "sst2", ["train.tsv", "dev.tsv|validation.tsv"])
    message = str(caught.value)
    assert "no dev.tsv or validation.tsv" in message and "--sst2-dir" in message and "UEDP_SST2_DIR" in message
    assert "uedp never downloads it" in message and message.split(";")[0].endswith(": no dev.tsv or validation.tsv")
    assert corpus_folder(ctx, "sst2", ["train.tsv"]) == tmp_path
    assert {c.key for c in CORPORA.values()} == set(CORPORA)


def test_conll_inputs_copy_the_first_documents_of_each_file(tmp_path: Path) -> None:
    folder = tmp_path / "conll"
    folder.mkdir()
    for name in ("eng.train", "eng.testa", "eng.testb"):
        (folder / name).write_text("".join(f"-DOCSTART- -X- O O\n\n{name}{i} NNP B-NP O\n\n" for i in range(5)),
                                   encoding="utf-8")
    ctx = Context("uedp-conll", "ci", DataHome(tmp_path / "home"), folder, conll_dir=folder)
    whole, name = conll_inputs(ctx, None)
    assert name == "conll2003" and [p.name for p in whole] == ["eng.train", "eng.testa", "eng.testb"]
    firsts, name = conll_inputs(ctx, {"train": 3, "valid": 1, "test": 2})
    assert name == "conll2003-first-3-1-2"
    assert [len(conll_documents(p)) for p in firsts] == [3, 1, 2]
    with pytest.raises(UedpError, match="give --conll-dir"):
        conll_inputs(Context("uedp-conll", "ci", DataHome(tmp_path / "home"), folder), None)
    (folder / "eng.testa").unlink()
    with pytest.raises(UedpError, match=r"CoNLL-2003 file\(s\) not found: .*eng.testa"):
        conll_inputs(ctx, None)
