"""`uedp report` averages seeds of one configuration, never different configurations (issue 37, item 1):
runs that differ in any setting but the seed are separate rows, named by the settings that tell them apart.
Real runs, MLflow store and report files for the end-to-end check."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from typer.testing import CliRunner

from uedp.commands import app
from uedp.flows.demo import DEMO_CORPUS
from uedp.services.config import TrainConfig
from uedp.services.report import ReportRow, summarise
from uedp.services.training import TrainResult
from uedp.storage.ingest import IngestOptions, ingest

runner = CliRunner()


def _result(config: TrainConfig, test: float, run_id: str) -> TrainResult:
    return TrainResult(run_id=run_id, mechanism=config.mechanism, categories=[], epsilon=float("inf"), delta=0.0,
                       noise_multiplier=0.0, utility_metric="perplexity", utility_valid=test, utility_test=test,
                       rounds=1, label=config.label, settings=config.settings())


def test_only_seeds_of_one_configuration_are_averaged() -> None:
    short, long_a, long_b = (TrainConfig(dataset="d", mechanism="noiseless", steps=steps, seed=seed)
                             for steps, seed in ((60, 0), (300, 0), (300, 1)))
    rows = summarise([(_result(short, 17.4, "a"), None), (_result(long_a, 2.4, "b"), None),
                      (_result(long_b, 2.6, "c"), None)])
    by_name = {row.mechanism: row for row in rows}
    assert set(by_name) == {"noiseless (steps=60)", "noiseless (steps=300)"}
    assert by_name["noiseless (steps=300)"].seeds == 2 and abs(by_name["noiseless (steps=300)"].test - 2.5) < 1e-12
    assert by_name["noiseless (steps=60)"].seeds == 1 and by_name["noiseless (steps=60)"].test == 17.4


def test_a_pretrained_start_is_a_different_configuration_and_ignored_categories_are_not() -> None:
    scratch = TrainConfig(dataset="d", mechanism="userdp", target_epsilon=8.0)
    started = TrainConfig(dataset="d", mechanism="userdp", target_epsilon=8.0, init_from="b79ff9a567734506b7f0dc86bee6beee")
    other_categories = TrainConfig(dataset="d", mechanism="userdp", target_epsilon=8.0, categories=["PERSON"], seed=1)
    rows = summarise([(_result(scratch, 20.0, "a"), 8.0), (_result(started, 12.0, "b"), 8.0),
                      (_result(other_categories, 22.0, "c"), 8.0)])
    names = sorted(row.mechanism for row in rows)
    assert names == ["userdp (init_from=None)", "userdp (init_from=b79ff9a567734506b7f0dc86bee6beee)"]
    assert next(r for r in rows if "None" in r.mechanism).seeds == 2  # userdp ignores categories: one configuration


def test_a_lone_configuration_keeps_its_plain_name() -> None:
    config = TrainConfig(dataset="d", mechanism="noiseless", steps=5)
    (row,) = summarise([(_result(config, 3.0, "a"), None), (replace(_result(config, 5.0, "b"), run_id="b"), None)])
    assert row.mechanism == "noiseless" and row.seeds == 2


def test_uedp_report_rebuilt_from_mlflow_keeps_configurations_apart(home, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    for steps, seed in ((2, 0), (3, 0), (3, 1)):
        trained = runner.invoke(app, ["train", "demo", "--mechanism", "noiseless", "--steps", str(steps), "--seed",
                                      str(seed), "--batch-size", "4", "--threads", "1", "--home", str(home.root)])
        assert trained.exit_code == 0, trained.output
    report = runner.invoke(app, ["report", "demo", "--home", str(home.root)])
    assert report.exit_code == 0, report.output
    markdown = Path(re.search(r": (\S+\.md)", report.stdout).group(1)).read_text()  # type: ignore[union-attr]
    assert re.search(r"\| noiseless \(steps=2\) \|.*\| 1 \|", markdown), markdown
    assert re.search(r"\| noiseless \(steps=3\) \|.*\| 2 \|", markdown), markdown


def _row(mechanism: str, epsilon: float, test: float, unit: str, categories: str = "PERSON") -> ReportRow:
    return ReportRow(mechanism=mechanism, categories=categories, target_epsilon=8.0, epsilon=epsilon, delta=1e-5,
                     noise_multiplier=1.0, metric="perplexity", valid=test, test=test, test_spread=0.0, seeds=1,
                     run_ids=("r",), baselines={"unigram": 300.0}, unit=unit)


def test_the_plot_keeps_nearby_epsilons_together_and_gives_each_privacy_unit_its_panel() -> None:
    """Issue 50 item 11: runs at 7.993 and 7.999 were drawn at the two ends of an axis from 7.993 to 7.999,
    and userdp beside uedp-bounded on one axis although their epsilons are for different units."""
    import matplotlib.pyplot as plt

    from uedp.privacy.mechanisms import registry
    from uedp.services.report import privacy_utility_figure

    rows = [_row("userdp (clip=1)", 7.993, 150.0, registry.get("userdp").unit, ""),
            _row("userdp (clip=2)", 7.999, 140.0, registry.get("userdp").unit, ""),
            _row("uedp-bounded", 7.996, 180.0, registry.get("uedp-bounded").unit),
            _row("noiseless", float("inf"), 60.0, "none", "")]
    fig = privacy_utility_figure(rows, "PERSON", "demo")
    fig.canvas.draw()
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["unit: one user", "unit: one user and one detected entity"]
    for ax in fig.axes:
        low, high = ax.get_xlim()
        assert low == 0 and 8 < high < 10  # the whole range from 0, not a zoom onto 0.006
        assert ax.xaxis.get_major_formatter().get_offset() == ""  # no "+7.99" offset under the axis
        labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert len(set(labels)) == len(labels) >= 3
        assert any(line.get_label() == "noiseless (no guarantee)" for line in ax.get_lines())  # on every panel
    shown = {text.get_text() for ax in fig.axes for text in ax.get_legend().get_texts()}
    assert {"userdp (clip=1)", "userdp (clip=2)", "uedp-bounded"} <= shown
    plt.close(fig)
