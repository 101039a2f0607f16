"""The package's shape, checked from the source: one import package, layers that point one way, no import
cycles, and no mechanism named in control flow outside the privacy core (callers use the registry).

Layers, top to bottom (a module imports only from its own package or from lower layers; packages on the
same layer do not import each other):

    uedp.cli                             the entry point (answers --help and --version without importing the rest)
    uedp.commands                        the commands
    uedp.stack, uedp.options, uedp.prefect_server   the local stack; options; the temporary Prefect server
    uedp.experiments                     results pages: the papers' reproductions and uedp's own (run flows, write pages)
    uedp.flows                           Prefect flows: composition only
    uedp.tasks                           Prefect tasks: thin wrappers over the services
    uedp.services                        the pipeline's services (training, configuration, tracking, ...): no Prefect
    uedp.privacy, uedp.storage, uedp.detection, uedp.deployments
    uedp.models
    uedp.errors, uedp.progress, uedp (the package root: leaves)
"""

from __future__ import annotations

import ast
import tomllib
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

from support import REPO

# Folder on disk -> subpackage of uedp (pyproject.toml's package-dir says the same; a test checks it).
FOLDERS = {"uedp": "uedp", "experiments": "uedp.experiments", "flows": "uedp.flows", "tasks": "uedp.tasks",
           "services": "uedp.services", "storage": "uedp.storage",
           "models": "uedp.models", "privacy": "uedp.privacy", "detection": "uedp.detection",
           "deployments": "uedp.deployments"}
LAYERS = {
    "uedp.cli": 8, "uedp.commands": 7, "uedp.remembered_answers": 7, "uedp.stack": 6, "uedp.experiments": 6, "uedp.options": 6, "uedp.prefect_server": 6,
    "uedp.flows": 5, "uedp.tasks": 4, "uedp.services": 3,
    "uedp.privacy": 2, "uedp.storage": 2, "uedp.detection": 2, "uedp.deployments": 2,
    "uedp.models": 1,
    "uedp.errors": 0, "uedp": 0,
}
# The privacy core and the models know nothing of orchestration or tracking; the services nothing of Prefect.
FORBIDDEN_THIRD_PARTY = {"uedp.privacy": ("prefect", "mlflow"), "uedp.models": ("prefect", "mlflow"),
                         "uedp.services": ("prefect",)}
# A task module holds Prefect tasks and nothing else: a public function there without a decorator is a
# service in the wrong layer. (retry.py defines the retrying task decorator itself.)
TASK_MODULE_LINES = 80


def modules() -> dict[str, Path]:
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            name = ".".join((package, *parts))
            out[name.removesuffix(".__init__")] = path
    return out


def component(module: str) -> str:
    """The layer component a module belongs to (``uedp.tasks.train`` -> ``uedp.tasks``)."""
    parts = module.split(".")
    if len(parts) >= 2 and f"uedp.{parts[1]}" in LAYERS:
        return f"uedp.{parts[1]}"
    return "uedp"


def imports(path: Path, module: str) -> list[tuple[str, int]]:
    """Absolute module names a file imports (``from a import b`` counts ``a.b`` when that is a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            out.append((base, node.lineno))
            out += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return out


ALL = modules()


def test_pyproject_lists_every_package_and_maps_every_folder() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert {k: v for k, v in config["package-dir"].items()} == {package: folder for folder, package in FOLDERS.items()}
    packages = {name for name, path in ALL.items() if path.name == "__init__.py"}
    assert set(config["packages"]) == packages, "a folder with __init__.py is missing from pyproject's packages"


def layer_violations(mods: dict[str, Path]) -> list[str]:
    out = []
    for module, path in mods.items():
        mine = component(module)
        for name, line in imports(path, module):
            target_module = name if name in mods else name.rsplit(".", 1)[0]
            if name.split(".")[0] == "uedp" and target_module in mods | ALL:
                target = component(target_module)
                if target != mine and not LAYERS[target] < LAYERS[mine]:
                    out.append(f"{path}:{line} imports {name} ({target} is not below {mine})")
            for forbidden in FORBIDDEN_THIRD_PARTY.get(mine, ()):
                if name.split(".")[0] == forbidden:
                    out.append(f"{path}:{line}: {mine} must not import {forbidden}")
    return out


def import_cycles(mods: dict[str, Path]) -> list[list[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in mods.items():
        for name, _ in imports(path, module):
            target = name if name in mods else name.rsplit(".", 1)[0]
            if target in mods and target != module and not module.startswith(target + "."):
                graph[module].add(target)
    # Tarjan's strongly connected components: any component of two or more modules is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = []
            while True:
                top = stack.pop()
                members.append(top)
                if top == node:
                    break
            if len(members) > 1:
                cycles.append(sorted(members))

    for node in sorted(mods):
        if node not in index:
            visit(node)
    return cycles


def mechanism_names_in_control_flow(mods: dict[str, Path], names: set[str]) -> list[str]:
    """Comparisons, membership tests and dict keys against a mechanism's name, outside the privacy core and
    the reproductions (each is one paper's experiment: which mechanisms it compares is its content)."""
    found = []
    for module, path in mods.items():
        if component(module) in ("uedp.privacy", "uedp.experiments"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            constants: list[ast.expr] = []
            if isinstance(node, ast.Compare):
                for operand in (node.left, *node.comparators):
                    constants += operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
            elif isinstance(node, ast.Dict):
                constants += [k for k in node.keys if k is not None]
            elif isinstance(node, ast.MatchValue):
                constants.append(node.value)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                    "get", "startswith", "endswith", "index", "count", "removeprefix", "removesuffix"):
                constants += node.args  # registry.get("dpsgd"), name.startswith("uedp")
            found += [f"{path}:{node.lineno} ({c.value!r})" for c in constants  # type: ignore[attr-defined]
                      if isinstance(c, ast.Constant) and c.value in names]
    return found


def mechanism_names() -> set[str]:
    from uedp.privacy.mechanisms import registry

    return set(registry.names())


def test_no_import_runs_upward_or_sideways() -> None:
    assert not layer_violations(ALL)


def thick_tasks(mods: dict[str, Path]) -> list[str]:
    """Task modules that are more than thin Prefect wrappers: a public undecorated function, no Prefect
    import, or more than :data:`TASK_MODULE_LINES` lines."""
    found = []
    for module, path in mods.items():
        if component(module) != "uedp.tasks" or path.name in ("__init__.py", "retry.py"):
            continue
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        if not any(name.split(".")[0] == "prefect" for name, _ in imports(path, module)):
            found.append(f"{path}: imports no Prefect (a service belongs in uedp.services)")
        if len(text.splitlines()) > TASK_MODULE_LINES:
            found.append(f"{path}: {len(text.splitlines())} lines (a task wraps a service in a few)")
        found += [f"{path}:{node.lineno} {node.name} is not a Prefect task" for node in tree.body
                  if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and not node.decorator_list]
    return found


def test_tasks_are_thin_prefect_wrappers() -> None:
    assert not thick_tasks(ALL)


def test_no_import_cycle_between_modules() -> None:
    assert not import_cycles(ALL)


def test_no_mechanism_is_named_in_control_flow_outside_the_privacy_core() -> None:
    assert not mechanism_names_in_control_flow(ALL, mechanism_names())


def test_the_architecture_checks_catch_planted_violations(tmp_path: Path) -> None:
    """The checks can fail: an upward import, a cycle, Prefect in the privacy core and a name comparison."""
    def planted(name: str, text: str) -> Path:
        path = tmp_path / f"{name}.py"
        path.write_text(text, encoding="utf-8")
        return path

    mods = {
        "uedp.privacy.bad": planted("bad", "import prefect\nfrom uedp.tasks.train import train_task\n"),
        "uedp.services.bad": planted("sbad", "from prefect import task\n"),
        "uedp.tasks.thick": planted("thick", "from uedp.services.training import run\n\ndef train(config):\n"
                                             "    return run(config)\n"),
        "uedp.tasks.a": planted("a", "from uedp.tasks import b\n"),
        "uedp.tasks.b": planted("b", "import uedp.tasks.a\nif config.mechanism in ('dpsgd', 'x'):\n    pass\n"
                                     "spec = registry.get('uedp-naive')\n"),
    }
    violations = layer_violations(mods)
    assert any("imports uedp.tasks.train" in v for v in violations)
    assert any("must not import prefect" in v for v in violations)
    assert any("uedp.services must not import prefect" in v for v in violations)
    thick = {"uedp.tasks.thick": mods["uedp.tasks.thick"]}
    assert thick_tasks(thick) == [f"{mods['uedp.tasks.thick']}: imports no Prefect (a service belongs in uedp.services)",
                                 f"{mods['uedp.tasks.thick']}:3 train is not a Prefect task"]
    assert import_cycles(mods) == [["uedp.tasks.a", "uedp.tasks.b"]]
    assert mechanism_names_in_control_flow(mods, mechanism_names()) == [f"{mods['uedp.tasks.b']}:2 ('dpsgd')",
                                                                        f"{mods['uedp.tasks.b']}:4 ('uedp-naive')"]


# Training set-up opens its inputs and never makes them: the services that draw from the private data or
# file a draw in the privacy ledger are outside everything set-up imports (services.training_inputs draws
# a configuration's local-DP release before training, in one place).
SETUP = "uedp.services.training_setup"
DRAWING_SERVICES = ("uedp.services.sanitize", "uedp.services.sanitize_attack", "uedp.services.training_inputs",
                    "uedp.services.privacy_budget")
# The questions only the training plan asks a built mechanism (what it will spend, whether it can learn);
# everyone else reads the plan's answers.
PLAN = "uedp.services.training_plan"
PLAN_QUESTIONS = ("planned_epsilon", "noise_to_signal")


def import_closure(mods: dict[str, Path], start: str) -> dict[str, str]:
    """Every module ``start`` reaches through imports, each with the module that imports it."""
    reached: dict[str, str] = {}
    todo = [start]
    while todo:
        module = todo.pop()
        for name, _ in imports(mods[module], module):
            target = name if name in mods else name.rsplit(".", 1)[0]
            if target in mods and target not in reached and target != start:
                reached[target] = module
                todo.append(target)
    return reached


def setup_draws(mods: dict[str, Path]) -> list[str]:
    reached = import_closure(mods, SETUP)
    return [f"{SETUP} reaches {service} (imported by {reached[service]})" for service in DRAWING_SERVICES
            if service in reached]


def epsilon_outside_the_plan(mods: dict[str, Path]) -> list[str]:
    """Calls of a mechanism's plan questions outside the privacy core and the training plan, and any
    ``getattr`` for them (the protocol declares both: nothing looks them up by name)."""
    found = []
    for module, path in mods.items():
        asks = component(module) == "uedp.privacy" or module == PLAN
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Attribute) and node.func.attr in PLAN_QUESTIONS and not asks:
                found.append(f"{path}:{node.lineno} calls .{node.func.attr}() (read the training plan)")
            if (isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") and len(node.args) > 1
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in PLAN_QUESTIONS):
                found.append(f"{path}:{node.lineno} looks up {node.args[1].value!r} by name (the protocol declares it)")
    return found


def test_training_setup_opens_its_inputs_and_draws_none() -> None:
    assert not setup_draws(ALL)


def test_the_training_plan_is_the_only_way_a_run_learns_its_epsilon() -> None:
    assert not epsilon_outside_the_plan(ALL)


def test_the_plan_and_setup_rules_catch_planted_violations(tmp_path: Path) -> None:
    """Set-up importing a release-drawing service (through a helper), a service asking a mechanism its
    epsilon, and a lookup by name: each is caught, and the real modules pass."""
    def planted(name: str, text: str) -> Path:
        path = tmp_path / f"{name}.py"
        path.write_text(text, encoding="utf-8")
        return path

    mods = {
        SETUP: planted("setup", "from uedp.services import helper\n"),
        "uedp.services.helper": planted("helper", "from uedp.services.sanitize import sanitize_dataset\n"),
        "uedp.services.sanitize": planted("sanitize", "x = 1\n"),
        "uedp.services.training": planted("training", "epsilon = s.mechanism.planned_epsilon()\n"),
        "uedp.services.report": planted("report", "ask = getattr(mechanism, 'noise_to_signal', None)\n"),
        PLAN: planted("plan", "epsilon = mechanism.planned_epsilon()\n"),
    }
    assert setup_draws(mods) == [f"{SETUP} reaches uedp.services.sanitize (imported by uedp.services.helper)"]
    assert epsilon_outside_the_plan(mods) == [
        f"{mods['uedp.services.training']}:1 calls .planned_epsilon() (read the training plan)",
        f"{mods['uedp.services.report']}:1 looks up 'noise_to_signal' by name (the protocol declares it)"]


# Outside the privacy core, a mechanism is known through its interface only: the registry (its spec), its
# parameters' model and their declared facts (stated_delta, clip_bound, plans_sampling, length(), ...), the
# Mechanism protocol (base) and the sampling planner. Its implementation module, or a parameter read by name
# with getattr/hasattr, would tie a service to one mechanism's internals.
MECHANISM_INTERFACE = ("registry", "params", "base", "auto_sampling", "specs")
# Modules that reach inside a mechanism on purpose, and why.
REACHES_INSIDE = {"uedp.experiments.one_run_audit": "breaks dpsgd's noise on purpose: the audit must catch it"}


def mechanism_internals_outside_privacy(mods: dict[str, Path]) -> list[str]:
    found = []
    for module, path in mods.items():
        if component(module) == "uedp.privacy" or module in REACHES_INSIDE:
            continue
        for name, line in imports(path, module):
            parts = name.split(".")
            if parts[:3] == ["uedp", "privacy", "mechanisms"] and len(parts) > 3 and parts[3] not in MECHANISM_INTERFACE:
                found.append(f"{path}:{line} imports {'.'.join(parts[:4])} (a mechanism's implementation)")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                    and node.args and _names_params(node.args[0])):
                found.append(f"{path}:{node.lineno} {node.func.id} on a mechanism's parameters")
    return sorted(set(found))


def _names_params(expression: ast.expr) -> bool:
    return ((isinstance(expression, ast.Attribute) and expression.attr == "params")
            or (isinstance(expression, ast.Name) and expression.id == "params"))


def test_services_know_a_mechanism_through_its_interface_only() -> None:
    assert not mechanism_internals_outside_privacy(ALL)


def test_the_interface_rule_catches_planted_violations(tmp_path: Path) -> None:
    planted = tmp_path / "leaky.py"
    planted.write_text("from uedp.privacy.mechanisms.userdp import UserDp\nfrom uedp.privacy.mechanisms import registry\n"
                       "def f(config, params):\n    return getattr(config.params, 'q_user', 0), hasattr(params, 'k')\n",
                       encoding="utf-8")
    inside = tmp_path / "inside.py"
    inside.write_text("from uedp.privacy.mechanisms.userdp import UserDp\nx = getattr(params, 'k')\n", encoding="utf-8")
    found = mechanism_internals_outside_privacy({"uedp.services.leaky": planted, "uedp.privacy.inside": inside})
    assert found == [f"{planted}:1 imports uedp.privacy.mechanisms.userdp (a mechanism's implementation)",
                     f"{planted}:4 getattr on a mechanism's parameters", f"{planted}:4 hasattr on a mechanism's parameters"]


def nodes(mods: dict[str, Path], exempt: Callable[[str], bool] = lambda module: False) -> Iterator[tuple[Path, ast.AST]]:
    """Every syntax node of the modules a rule covers (those ``exempt`` does not name), with its file."""
    for module, path in mods.items():
        if not exempt(module):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                yield path, node


def in_storage(module: str) -> bool:
    return component(module) == "uedp.storage"


# Storage names every folder of the data home (DataHome's named locations); elsewhere a path is never built from
# the home's root (``home.root / "cache"``), so moving a folder is one change and `uedp` agrees with itself.
def paths_built_from_the_home_root(mods: dict[str, Path]) -> list[str]:
    found = []
    for path, node in nodes(mods, in_storage):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _is_home_root(node.left):
            found.append(f"{path}:{node.lineno} builds a path from the data home's root")
    return found


def _is_home_root(expression: ast.expr) -> bool:
    if not (isinstance(expression, ast.Attribute) and expression.attr == "root"):
        return False
    owner = expression.value
    return ((isinstance(owner, ast.Name) and owner.id in ("home", "data_home"))
            or (isinstance(owner, ast.Attribute) and owner.attr in ("home", "data_home")))


def test_only_storage_builds_paths_in_the_data_home() -> None:
    assert not paths_built_from_the_home_root(ALL)


def test_the_named_locations_rule_catches_a_planted_path(tmp_path: Path) -> None:
    planted = tmp_path / "paths.py"
    planted.write_text("def f(home, ctx, tree):\n    a = home.root / 'cache'\n    b = ctx.home.root / 'x'\n"
                       "    return tree.root / 'fine', str(home.root)\n", encoding="utf-8")
    assert paths_built_from_the_home_root({"uedp.services.paths": planted}) == [
        f"{planted}:2 builds a path from the data home's root", f"{planted}:3 builds a path from the data home's root"]
    assert not paths_built_from_the_home_root({"uedp.storage.paths": planted})


# A table's manifest is read by storage and handed out typed (storage/manifests.py): elsewhere ``read_manifest``
# is neither imported nor called, so how a field is spelt inside manifest.json is known in one place.
def manifests_read_outside_storage(mods: dict[str, Path]) -> list[str]:
    found = []
    for path, node in nodes(mods, in_storage):
        if isinstance(node, ast.ImportFrom) and any(alias.name == "read_manifest" for alias in node.names):
            found.append(f"{path}:{node.lineno} imports read_manifest")
        elif isinstance(node, ast.Call) and (
                (isinstance(node.func, ast.Name) and node.func.id == "read_manifest")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "read_manifest")):
            found.append(f"{path}:{node.lineno} reads a manifest")
    return found


def test_only_storage_reads_a_tables_manifest() -> None:
    assert not manifests_read_outside_storage(ALL)


def test_the_manifest_rule_catches_a_planted_read(tmp_path: Path) -> None:
    planted = tmp_path / "manifests.py"
    planted.write_text("from uedp.storage.tables import read_manifest\nfrom uedp.storage import tables\n"
                       "def f(home):\n    a = tables.read_manifest(home)\n    return read_manifest(home)\n",
                       encoding="utf-8")
    assert manifests_read_outside_storage({"uedp.services.manifests": planted}) == [
        f"{planted}:1 imports read_manifest", f"{planted}:4 reads a manifest", f"{planted}:5 reads a manifest"]
    assert not manifests_read_outside_storage({"uedp.storage.manifests": planted})


# One spelling of an MLflow store's address (storage.home.sqlite_uri, DataHome.mlflow_tracking_uri): a page or
# service that wrote its own would miss MLFLOW_TRACKING_URI and the home's layout.
def sqlite_addresses_outside_storage(mods: dict[str, Path]) -> list[str]:
    found = []
    for path, node in nodes(mods, in_storage):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("sqlite:///"):
            found.append(f"{path}:{node.lineno} spells an MLflow store's address")
    return found


def test_only_storage_spells_an_mlflow_stores_address() -> None:
    assert not sqlite_addresses_outside_storage(ALL)


def test_the_address_rule_catches_a_planted_one(tmp_path: Path) -> None:
    planted = tmp_path / "address.py"
    planted.write_text("def f(home):\n    return f'sqlite:///{home}/mlflow.db'\n", encoding="utf-8")
    assert sqlite_addresses_outside_storage({"uedp.experiments.address": planted}) == [
        f"{planted}:2 spells an MLflow store's address"]
    assert not sqlite_addresses_outside_storage({"uedp.storage.address": planted})


# One way into training (services.launch.run_training): it pulls a store's tables, draws a local-DP release once,
# starts torchrun and scores the audit. Only it and a torchrun rank's worker call the training itself, so no caller
# (tune, pretrain, the synthetic measures) can skip a step of it.
LAUNCH = frozenset({"uedp.services.launch", "uedp.services.torchrun", "uedp.services.training"})


def trainings_started_outside_the_launch(mods: dict[str, Path]) -> list[str]:
    found = []
    for path, node in nodes(mods, LAUNCH.__contains__):
        if isinstance(node, ast.ImportFrom) and any(alias.name == "train_configuration" for alias in node.names):
            found.append(f"{path}:{node.lineno} imports train_configuration (use services.launch.run_training)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "train_configuration":
            found.append(f"{path}:{node.lineno} calls train_configuration (use services.launch.run_training)")
    return found


def test_every_caller_trains_through_the_one_launch() -> None:
    assert not trainings_started_outside_the_launch(ALL)


def test_the_launch_rule_catches_a_planted_shortcut(tmp_path: Path) -> None:
    planted = tmp_path / "shortcut.py"
    planted.write_text("from uedp.services.training import train_configuration\nfrom uedp.services import training\n"
                       "def f(home, config):\n    return training.train_configuration(home, config)\n", encoding="utf-8")
    assert trainings_started_outside_the_launch({"uedp.services.tune": planted}) == [
        f"{planted}:1 imports train_configuration (use services.launch.run_training)",
        f"{planted}:4 calls train_configuration (use services.launch.run_training)"]
    assert not trainings_started_outside_the_launch({"uedp.services.launch": planted})


# One word per concept (docs/ARCHITECTURE.md, "Words"): "plan" is the training plan and nothing else. A class
# named ...Plan or a function or method named plan would bring back the five meanings the word once had
# (a quote, a schedule, a sweep's items, an audit draw, a detection's work).
THE_PLAN = frozenset({"TrainingPlan"})


def other_plans(mods: dict[str, Path]) -> list[str]:
    found = []
    for path, node in nodes(mods):
        if isinstance(node, ast.ClassDef) and node.name.endswith("Plan") and node.name not in THE_PLAN:
            found.append(f"{path}:{node.lineno} class {node.name}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in ("plan", "_plan"):
            found.append(f"{path}:{node.lineno} def {node.name}")
    return found


def test_plan_names_the_training_plan_only() -> None:
    assert not other_plans(ALL)


def test_the_naming_rule_catches_a_planted_plan(tmp_path: Path) -> None:
    planted = tmp_path / "words.py"
    planted.write_text("class TrainingPlan:\n    pass\n\nclass AuditPlan:\n    def plan(self):\n        pass\n",
                       encoding="utf-8")
    assert other_plans({"uedp.services.words": planted}) == [f"{planted}:4 class AuditPlan", f"{planted}:5 def plan"]
