"""Planning and training: ``uedp epsilon`` (a budget, from the same training plan a run reads),
``train``, ``tune`` and ``sweep``."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any, Optional

import typer

from uedp.commands.common import (
    CONFIG_OPTION,
    HOME_OPTION,
    SEEDED_OPTION,
    SET_OPTION,
    STORE_HELP,
    app,
    csv_list,
    prefect_api,
    prepare_runtime,
    remember_accounting_in_home,
    short_number,
    user_errors,
)
from uedp.commands.config_options import LISTED, MECHANISMS_HELP, PLAN_OPTIONS, SWEEP_OPTIONS, TRAIN_OPTIONS
from uedp.commands.tables import baseline_warning, baselines_line, print_guarantee, print_summary
from uedp.detection.categories import DEFAULT_CATEGORIES
from uedp.errors import UedpError
from uedp.options import default_of, merged, with_options
from uedp.privacy.mechanisms import registry
from uedp.privacy.mechanisms.auto_sampling import MIN_ROUNDS
from uedp.services.config import MechanismSettings, RunSettings, TrainConfig
from uedp.services.sweep_config import SweepConfig
from uedp.storage.catalog import require_ingested, require_tables


@app.command()
@user_errors
@with_options(PLAN_OPTIONS)
def epsilon(
    mechanism: str = typer.Option(..., help="A mechanism with a planner: "
                                  + ", ".join(n for n, spec in registry.mechanisms().items() if spec.quote) + "."),
    users: int = typer.Option(..., "--users", "--units", min=1, help="Number of privacy units: training users "
                              "(userdp; for uedp the writers with a sentence that names no detected entity) or "
                              "sequences (dpsgd)."),
    count_public: bool = typer.Option(False, "--count-public", help="Plan a run that declares the number of units "
                                      "public (--public-count); default: training's DP count, composed in."),
    count_noise: Optional[float] = typer.Option(None, "--count-noise", help="Noise std of that DP count "
                                                f"\\[default: {RunSettings.model_fields['count_noise'].default}]",
                                                show_default=False),
    choose_sampling: bool = typer.Option(False, "--choose-sampling", help="userdp, uedp-bounded, uedp with a "
                                         "target epsilon: choose --q-user and --rounds, the split of the compute "
                                         "budget (--user-updates) with the least noise-to-signal, and plan that."),
    user_updates: Optional[float] = typer.Option(None, "--user-updates", min=1, help="--choose-sampling: the compute "
                                                 "budget, rounds x expected users a round \\[default: the "
                                                 "configuration's, rounds x q_user x users]", show_default=False),
    cpu_hours: Optional[float] = typer.Option(None, "--cpu-hours", min=0, help="--choose-sampling: hours of training "
                                              "to split, at --tokens-per-second (instead of --user-updates)", show_default=False),
    tokens_per_second: Optional[float] = typer.Option(None, "--tokens-per-second", min=0, help="--cpu-hours: the "
                                                      "model's training throughput on this machine "
                                                      "(benchmarks/train_throughput.py)", show_default=False),
    max_len: int = typer.Option(RunSettings.model_fields["max_len"].default, "--max-len", min=8, help="--cpu-hours: "
                                "the longest sequence (sentence or chunk) a user update reads, in tokens"),
    min_rounds: int = typer.Option(MIN_ROUNDS, "--min-rounds", min=1, help="--choose-sampling: the fewest rounds a "
                                   "split may have. The least noise-to-signal alone favours few rounds of many users; "
                                   "a model needs enough server steps to learn (a noiseless run's steps are a guide)"),
    config_file: Optional[Path] = CONFIG_OPTION,
    set_: Optional[list[str]] = SET_OPTION,
    **settings: Any,
) -> None:
    """Plan a privacy budget without training: epsilon for a noise multiplier, or z for a target epsilon.

    Reads the same defaults as training (every mechanism parameter is a flag or --set key=value). With
    --choose-sampling the planner chooses a user-level run's sampling rate and rounds for its budget: user
    updates, or hours of this machine at a measured throughput (--cpu-hours, --tokens-per-second).

    Example: uedp epsilon --mechanism uedp --users 946 --q-user 0.05 --q-entity 0.05 --rounds 500 --noise-multiplier 2

    Example: uedp epsilon --mechanism userdp --users 946 --target-epsilon 8 --choose-sampling --cpu-hours 3
    --tokens-per-second 110 --max-len 64 --local-update gradient --local-batch-size 8
    """
    if (cpu_hours is None) != (tokens_per_second is None):
        raise UedpError("--cpu-hours and --tokens-per-second go together: the time, and the throughput that turns it "
                        "into user updates")
    if cpu_hours is not None and user_updates is not None:
        raise UedpError("give the compute budget once: --user-updates, or --cpu-hours with --tokens-per-second")
    if cpu_hours is not None and not choose_sampling:
        raise UedpError("--cpu-hours is the budget --choose-sampling splits: add --choose-sampling")
    spec = registry.get(mechanism) if mechanism in registry.names() else None
    if spec is None or spec.quote is None:
        raise UedpError(f"unknown mechanism {mechanism!r} for planning; valid: "
                        + ", ".join(n for n, s in registry.mechanisms().items() if s.quote))
    values = {k: v for k, v in merged(config_file, settings, set_, LISTED).items()
              if k in MechanismSettings.model_fields or k == "steps"}  # a file may hold run settings too
    # Strict: a parameter this mechanism does not take is an error, not a silently different plan; the
    # rules between settings (a z or a target, one name per parameter) are the parameters' own.
    config = TrainConfig(**{**values, "dataset": "plan", "mechanism": mechanism})
    from uedp.privacy.accounting.calibration import check_delta  # dp_accounting, torch: after the input is checked
    from uedp.privacy.population import COUNTED_IN_WORDS, Population
    from uedp.services.training_plan import PublicFacts, plan_training

    remember_accounting_in_home()
    noise = count_noise if count_noise is not None else RunSettings.model_fields["count_noise"].default
    try:
        with warnings.catch_warnings():  # said once, below, as a line of its own (not a Python warning too)
            warnings.simplefilter("ignore")
            warning = check_delta(config.params.delta, users)  # type: ignore[attr-defined]
        # Training's count of units: declared public, or a DP count (planned at its expected value).
        population = Population.declared(users) if count_public else Population(float(users), "dp-count", noise)
        if choose_sampling:
            if cpu_hours is not None and tokens_per_second is not None:
                user_updates = _time_budget(config.params, cpu_hours, tokens_per_second, max_len)
            config = config.model_copy(update={"params": _chosen_sampling(spec, config.params, population,
                                                                          user_updates, min_rounds)})
        # The plan training builds, from the count given here: the figure printed is the plan's epsilon.
        plan = plan_training(config, PublicFacts(population, n_examples=users, train_users=users), describe=True)
    except ValueError as exc:
        raise UedpError(str(exc)) from None
    assert plan.description is not None  # every mechanism with a planner (spec.quote) describes its plan
    units = COUNTED_IN_WORDS[spec.counts or "users"]
    counted = "" if count_public or spec.counts is None else f" (incl. the DP count of {units}, noise std {noise:g})"
    lines = list(plan.description.lines)
    typer.echo(lines[0] + counted)
    for line in lines[1:]:
        typer.echo(line)
    if plan.noise_to_signal is not None:
        typer.echo(plan.noise_to_signal.line())
        if plan.noise_warning is not None:
            typer.echo(f"warning: {plan.noise_warning}", err=True)
    if warning:
        typer.echo(f"warning: {warning}", err=True)


def _time_budget(params: Any, hours: float, tokens_per_second: float, max_len: int) -> float:
    """``--cpu-hours`` in user updates, said as a line: the time at the throughput over one update's token cap."""
    from uedp.privacy.mechanisms.auto_sampling import ComputeBudget

    cap = params.tokens_per_update(max_len)
    if cap is None:
        raise ValueError(f"the planner chooses a user-level run's q_user and rounds; {params.mechanism} samples no users")
    budget = ComputeBudget(hours, tokens_per_second, cap)
    typer.echo(budget.line())
    return budget.user_updates


def _chosen_sampling(spec: Any, params: Any, population: Any, user_updates: float | None, min_rounds: int) -> Any:
    """``uedp epsilon --choose-sampling``: print the planner's split of the budget and return the parameters
    with it (``q_user`` and ``rounds``)."""
    from uedp.privacy.mechanisms.auto_sampling import choose_for

    chosen, choice = choose_for(spec.quote, params, population, user_updates, min_rounds=min_rounds)
    typer.echo(choice.reason)
    for line in choice.table():
        typer.echo(line)
    return chosen


@app.command()
@user_errors
@with_options(TRAIN_OPTIONS)
def train(
    dataset: str = typer.Argument(..., help="An ingested (and detected) dataset."),
    mechanism: Optional[str] = typer.Option(None, help=f"One of {MECHANISMS_HELP} (or `mechanism:` in --config).",
                                            show_default=False),
    seeded: bool = SEEDED_OPTION,
    store: Optional[str] = typer.Option(None, help=STORE_HELP),
    home: Optional[Path] = HOME_OPTION,
    config_file: Optional[Path] = CONFIG_OPTION,
    set_: Optional[list[str]] = SET_OPTION,
    **settings: Any,
) -> None:
    """Train one configuration and log it to MLflow; prints the run id.

    Every shared setting and every mechanism parameter is a flag (defaults from the configuration, shown
    below), a key of --config, or --set key=value. Rerunning the same configuration after a crash resumes
    from its last checkpoint (weights and accountant), continuing the same MLflow run.
    """
    data_home = prepare_runtime(home)
    values = merged(config_file, settings, set_, LISTED)
    config = _train_config(dataset, mechanism, seeded, values)
    require_tables(data_home, config.dataset, store)
    from uedp.services.launch import run_training  # the training machinery (seconds): after the input is checked
    from uedp.services.tracking import run_link
    from uedp.services.training_setup import categories_warning

    if (ignored := ignored_categories(config, values.get("categories"))) is not None:
        typer.echo(f"warning: {ignored}", err=True)
    if (warning := categories_warning(data_home, config)) is not None:
        typer.echo(f"warning: {warning}", err=True)
    result = run_training(data_home, config, store_url=store)  # says "resumed from ..." when it resumes
    guarantee = (f"epsilon {short_number(result.epsilon, 4)} at delta {result.delta:g}" if math.isfinite(result.epsilon)
                 else "no privacy guarantee")
    typer.echo(f"{config.run_name()}: {guarantee}; test {result.utility_metric} {result.utility_test:.4g} "
               f"after {result.rounds} {config.step_word}s"
               + (f" (resumed after {config.step_word} {result.resumed_from})" if result.resumed_from else ""))
    if result.baselines:
        typer.echo(baselines_line(result.baselines, result.utility_metric))
    if result.start_test is not None:
        typer.echo(f"the model it started from, before fine-tuning: test {result.utility_metric} "
                   f"{result.start_test:.4g} (this run {result.utility_test:.4g})")
    if (warning := baseline_warning(config.run_name(), result)) is not None:
        typer.echo(f"warning: {warning}", err=True)
    if result.detector_recall and math.isfinite(result.epsilon):
        typer.echo(f"this epsilon covers the detected entities: {result.detector_recall}")
    if result.notes:
        typer.echo(f"note: {result.notes}")
    if result.audit_epsilon is not None:
        typer.echo(f"one-run audit ({config.audit_canaries} canaries at the unit): epsilon >= "
                   f"{result.audit_epsilon:.3g} at 95% confidence, beside the accounted {short_number(result.epsilon, 4)} "
                   f"(details: uedp attack {result.run_id} --kind audit)")
    print_guarantee(result)
    typer.echo(f"MLflow run: {result.run_id}   (browse: {run_link(data_home, result.run_id)})")


def ignored_categories(config: Any, given: Any) -> str | None:
    """Said when --categories other than the default are given to a mechanism that trains the same whatever
    the categories (a logged configuration fed back with --config holds the default: nothing to say)."""
    if given is None or config.spec.uses_categories(config.params):
        return None
    if set(config.categories) == set(DEFAULT_CATEGORIES):
        return None
    shown = given if isinstance(given, str) else ",".join(given)
    unit = "no privacy unit" if config.spec.unit == "none" else f"its unit: {config.spec.unit}"
    return (f"{config.mechanism} ignores --categories {shown}: it trains the same whatever entities a sentence names "
            f"({unit}; its report says 'any'). To protect entities of these categories as such, train "
            "uedp-bounded, uedp or selective")


def _train_config(dataset: str, mechanism: Optional[str], seeded: bool, values: dict[str, Any]) -> Any:
    """The configuration ``uedp train`` (and ``uedp tune``) builds from its flags, config file and --set
    values. The rules between settings are the parameters models' own (privacy/mechanisms/params.py)."""
    if mechanism is not None:
        values["mechanism"] = mechanism
    if "mechanism" not in values:
        raise UedpError(f"--mechanism is required (one of {MECHANISMS_HELP})")
    if values.get("mechanism") not in registry.names():
        raise UedpError(f"unknown mechanism {values.get('mechanism')!r}; valid: {MECHANISMS_HELP}")
    if seeded:
        values["randomness"] = "seeded"
    from uedp.services.tuned import TUNABLE

    if values.get("tuned") and (given := [n for n in TUNABLE if values.get(n) is not None]):
        raise UedpError(f"--tuned {values['tuned']} sets the searched values: drop --"
                        f"{' and --'.join(g.replace('_', '-') for g in given)} (or drop --tuned)")
    return TrainConfig(**{**values, "dataset": dataset})  # the named dataset wins over a config file's


@app.command()
@user_errors
@with_options(TRAIN_OPTIONS)
def tune(
    dataset: str = typer.Argument(..., help="A public proxy dataset (e.g. the base's corpus, ingested with about as "
                                  "many writers or pseudo-writers as the private dataset); never the private one."),
    mechanism: Optional[str] = typer.Option(None, help=f"One of {MECHANISMS_HELP} (or `mechanism:` in --config).",
                                            show_default=False),
    grid_axes: Optional[list[str]] = typer.Option(None, "--grid", show_default=False, help="NAME=V1,V2,...: values "
                                                  "to try, for server_lr, clip, local_lr or lr; repeatable (every "
                                                  "combination is one trial)."),
    seeded: bool = SEEDED_OPTION,
    home: Optional[Path] = HOME_OPTION,
    config_file: Optional[Path] = CONFIG_OPTION,
    set_: Optional[list[str]] = SET_OPTION,
    **settings: Any,
) -> None:
    """Choose learning rates and clip on public text: one training run per grid point on DATASET with the
    settings the private run will use, keeping the least validation perplexity.

    Prints the search's key; `uedp train PRIVATE --tuned KEY` takes its values and names the search in its
    privacy statement. A private run whose own text is the searched dataset's is refused (a search on private
    data is a release its epsilon does not count). The same search again reuses its record.
    """
    data_home = prepare_runtime(home)
    config = _train_config(dataset, mechanism, seeded, merged(config_file, settings, set_, LISTED))
    require_ingested(data_home, config.dataset)
    from uedp.services.tune import tune as run_search
    record = run_search(data_home, config, parse_grid(grid_axes or []), say=typer.echo)
    for trial in record.trials:
        chosen = "*" if trial.values == record.chosen else " "
        typer.echo(f"  {chosen} {', '.join(f'{k} {v:g}' for k, v in trial.values.items())}: validation perplexity "
                   f"{trial.perplexity_valid:.4g} (run {trial.run_id})")
    typer.echo(f"--tuned {record.key}")


@app.command()
@user_errors
@with_options(SWEEP_OPTIONS)
def sweep(
    dataset: str = typer.Argument(..., help="An ingested and detected dataset."),
    mechanisms: Optional[str] = typer.Option(None, help=f"Comma-separated: {MECHANISMS_HELP} "
                                             f"{default_of(SweepConfig, 'mechanisms')}", show_default=False),
    categories: Optional[list[str]] = typer.Option(None, show_default=False, help="A set of sensitive categories "
                                                   f"{default_of(SweepConfig, 'category_sets')}; repeat the "
                                         "option for several sets (e.g. --categories PERSON --categories PII)."),
    epsilons: Optional[str] = typer.Option(None, help="Comma-separated target epsilons for every private mechanism "
                                           "(default: the noise multiplier)."),
    seeds: Optional[str] = typer.Option(None, show_default=False, help="Comma-separated seeds (initial weights; "
                                        f"sampling and noise too with --seeded) {default_of(SweepConfig, 'seeds')}"),
    grid_axes: Optional[list[str]] = typer.Option(None, "--grid", show_default=False, help="NAME=V1,V2,...: one more "
                                                  "axis over a mechanism parameter; each mechanism that takes it runs "
                                                  "once per value (e.g. --grid holders_per_entity=1,4,16); repeatable."),
    seeded: bool = SEEDED_OPTION,
    reuse_finished: bool = typer.Option(False, "--reuse-finished", help="Do not train again a configuration "
                                        "already trained to the end on the same data, detections and start: "
                                        "report its finished run (a sweep stopped halfway continues)."),
    store: Optional[str] = typer.Option(None, help=STORE_HELP),
    home: Optional[Path] = HOME_OPTION,
    config_file: Optional[Path] = CONFIG_OPTION,
    set_: Optional[list[str]] = SET_OPTION,
    **settings: Any,
) -> None:
    """Train every mechanism x category set x epsilon x seed as a Prefect flow; nested MLflow runs under one
    parent, and a privacy-utility report (PNG plots + Markdown) on the parent run and under the data home.

    The grid is set by the options above; the base configuration by every other flag (defaults from the
    configuration), --config or --set key=value."""
    data_home = prepare_runtime(home)
    try:
        targets = [float(e) for e in csv_list(epsilons)]
        seed_list = [int(s) for s in csv_list(seeds)]
    except ValueError as exc:
        raise UedpError(f"--epsilons and --seeds take comma-separated numbers: {exc}") from None
    grid = {"mechanisms": csv_list(mechanisms) if mechanisms else None, "category_sets": categories or None,
            "target_epsilons": targets or None, "seeds": seed_list or None, "store": store,
            "randomness": "seeded" if seeded else None, "grid": parse_grid(grid_axes or []) or None,
            "reuse_finished": True if reuse_finished else None}
    values = merged(config_file, settings, set_, LISTED) | {k: v for k, v in grid.items() if v is not None}
    config = SweepConfig(**{**values, "home": str(data_home.root), "dataset": dataset})
    require_tables(data_home, dataset, store)
    from uedp.flows.sweep import sweep_flow  # Prefect and the training machinery (seconds): after the input is checked
    from uedp.services.launch import preflight_sweep
    from uedp.services.sweep import SweepFailed
    from uedp.services.tracking import run_link

    items = preflight_sweep(data_home, config)
    typer.echo(f"uedp sweep: {len(items)} configurations on {dataset!r}")
    failed: SweepFailed | None = None
    with prefect_api(data_home):
        try:
            outcome = sweep_flow(config, progress=True)
        except SweepFailed as exc:  # what finished is still worth a table and a report
            failed, outcome = exc, exc.outcome
    if outcome.runs:
        print_summary(outcome.runs, title=f"uedp sweep on {dataset}")
    typer.echo(f"\nreport: {outcome.report[0] if outcome.report else '-'}")
    typer.echo(f"MLflow parent run: {outcome.parent_run_id}   (browse: {run_link(data_home, outcome.parent_run_id)})")
    if failed is not None:
        for failure in outcome.failures:
            typer.echo(f"failed: {failure.describe()}", err=True)
        raise UedpError(f"{len(outcome.failures)} of {failed.total} configurations failed (causes above)")


def parse_grid(axes: list[str]) -> dict[str, list[Any]]:
    """``--grid name=1,4,16`` -> ``{"name": [1, 4, 16]}`` (numbers where they parse, text otherwise)."""
    out: dict[str, list[Any]] = {}
    for axis in axes:
        name, sep, values = axis.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise UedpError(f"--grid takes NAME=V1,V2,... (e.g. holders_per_entity=1,4,16), got {axis!r}")
        out[name.strip().replace("-", "_")] = [_scalar(v) for v in csv_list(values)]
    return out


def _scalar(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
