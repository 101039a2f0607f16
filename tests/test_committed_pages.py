"""Every results page `uedp reproduce` wrote under docs/results re-renders from its own results.json to the page
that is committed: a change to a page's text, claims or checks that was not rendered again (`uedp reproduce NAME
--page-only`) fails here, so a committed verdict is always what today's code says about those figures.

No training: a page's figures come back from its results.json, as `--page-only` reads them."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from uedp.errors import UedpError
from uedp.experiments.common import RunRow
from uedp.experiments.reproduce import EXPERIMENTS, rerender
from uedp.storage.home import DataHome

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
COMMITTED = [name for name in EXPERIMENTS if (RESULTS / name / "results.json").is_file()]


def _text_without_provenance(readme: Path) -> list[str]:
    """The page's lines but its "Made by" line, which a re-render extends with its own date."""
    return [line for line in readme.read_text(encoding="utf-8").splitlines() if not line.startswith("Made by ")]


def test_the_committed_pages_include_the_papers_comparisons() -> None:
    assert {"uedp-conll", "selective-conll", "sanitize-conll"} <= set(COMMITTED)


@pytest.mark.parametrize("name", COMMITTED)
def test_a_committed_page_re_renders_from_its_results_unchanged(name: str, tmp_path: Path) -> None:
    committed = RESULTS / name
    out = tmp_path / name
    shutil.copytree(committed, out)
    page = rerender(name, DataHome(tmp_path / "home"), out)
    assert _text_without_provenance(out / "README.md") == _text_without_provenance(committed / "README.md"), (
        f"docs/results/{name} is not what today's code renders from its results.json: run "
        f"`uedp reproduce {name} --page-only --out docs/results/{name}` and commit the page")
    before = json.loads((committed / "results.json").read_text(encoding="utf-8"))
    after = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert after["claims"] == before["claims"]
    # A page made before a field of RunRow existed reads back with its default: the same runs.
    assert [RunRow(**row) for row in after["runs"]] == [RunRow(**row) for row in before["runs"]]
    assert after.get("rows", []) == before.get("rows", [])
    assert [v.statement for v in page.verdicts] == [c["statement"] for c in before["claims"]]


def test_a_changed_check_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above can fail: a page whose claim check now words its figures differently renders
    another README from the same results.json."""
    name = "selective-conll"
    out = tmp_path / name
    shutil.copytree(RESULTS / name, out)
    experiment = EXPERIMENTS[name]
    render = experiment.render

    def reworded(ctx, results):  # type: ignore[no-untyped-def]
        page = render(ctx, results)
        for verdict in page.verdicts:
            object.__setattr__(verdict, "ours", verdict.ours + " (reworded)")
        page.sections = [s.replace(" | **", " (reworded) | **") for s in page.sections]
        return page

    monkeypatch.setitem(EXPERIMENTS, name, type(experiment)(**{**experiment.__dict__, "render": reworded}))
    rerender(name, DataHome(tmp_path / "home"), out)
    assert _text_without_provenance(out / "README.md") != _text_without_provenance(RESULTS / name / "README.md")


def test_a_results_file_of_another_kind_is_refused_naming_it(tmp_path: Path) -> None:
    out = tmp_path / "page"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"runs": [{"not": "a run"}], "figures": {}}), encoding="utf-8")
    with pytest.raises(UedpError, match=r"results.json: not a results file of this uedp"):
        rerender("uedp-conll", DataHome(tmp_path / "home"), out)
    with pytest.raises(UedpError, match=r"not found: --page-only rebuilds a page"):
        rerender("uedp-conll", DataHome(tmp_path / "home"), tmp_path / "nothing-here")


def test_a_resumed_pages_wall_time_says_it_left_out_the_runs_it_reused() -> None:
    """A page command run again trains only what is missing: its own minutes must not pass for the page's
    training (the WikiText page's last invocation took 91 minutes of runs that took hours in all)."""
    from uedp.experiments.reproduce import reused_runs_said

    def runs(*seconds: float) -> list[RunRow]:
        return [RunRow("noiseless", "gpt2 tiny", None, math.inf, 1.0, s, "r") for s in seconds]

    assert reused_runs_said(30.0, runs(600, 600, 300)) == ""  # 25 minutes of runs in a 30-minute command
    said = reused_runs_said(10.0, runs(3000, 3000))
    assert "reused runs finished by earlier ones" in said and "add up to 100 minutes" in said
    committed = (RESULTS / "selective-wikitext" / "README.md").read_text(encoding="utf-8")
    assert "reused runs finished by earlier ones" in committed  # that page was made so, and says it
