"""Entity categories: one taxonomy over spaCy/OntoNotes, CoNLL-2003 and Presidio labels.

Detectors store canonical categories; users choose categories (canonical names, aliases such as
``PER``, or composites such as ``PII``) at query time, so choosing others never re-runs detection.
The taxonomy is a data file (``detection/categories.yaml``, or the file ``UEDP_CATEGORIES`` names),
merged with the data home's labels file (``<home>/labels.yaml``, :data:`LABELS_FILE`): a corpus' or
recognizer's labels mapped onto categories (``group: ORG``) and categories of one's own, so a label
outside the packaged taxonomy needs no copy of it. ``uedp detect --label group=ORG`` writes that file.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BeforeValidator, Field

from uedp.errors import UedpError

DEFAULT_TAXONOMY = Path(__file__).with_name("categories.yaml")
LABELS_FILE = "labels.yaml"  # in the data home (DataHome.labels_file)
# The labels file in force where no data home is at hand (validating a configuration's categories, in
# this process and in the processes it starts): the CLI sets it to its data home's file. Unset: the file
# in $UEDP_HOME, else in ./.uedp (where a data home defaults to).
LABELS_ENV = "UEDP_LABELS"


@dataclass(frozen=True)
class Taxonomy:
    canonical: tuple[str, ...]
    alias_to_canonical: dict[str, str]
    coarse: dict[str, str | None]
    composites: dict[str, tuple[str, ...]]
    source: str
    labels_file: str | None = None  # the data home's labels file this taxonomy merges (when it exists)
    digest: str = ""  # hash of the files it was read from: part of detection's cache key

    def canonical_of(self, label: str) -> str | None:
        """The canonical category of a detector's label, or None when the taxonomy does not know it."""
        return self.alias_to_canonical.get(label.upper())

    def names(self) -> list[str]:
        return list(self.canonical) + sorted(self.composites)

    def how_to_add(self, label: str = "LABEL") -> str:
        """How to map an unknown label onto a category, or add it as one: the option and the file."""
        example = label.upper() if label != "LABEL" else "CATEGORY"
        where = self.labels_file or f"<data home>/{LABELS_FILE}"
        return (f"map it onto a category with `uedp detect DATASET --label {label}=ORG` (or add it as a category: "
                f"--label {label}={example}), or write `{label}: ORG` under `labels:` in {where}")

    def refuse_unknown(self, labels: Iterable[str], emitted_by: str, dataset: str = "DATASET") -> None:
        """Every label the taxonomy does not know, in one error with the ``--label`` option for each (a corpus
        with a tag set of its own, like WNUT-17's, then takes one command, not one run per label)."""
        unknown = sorted({label for label in labels if self.canonical_of(label) is None}, key=str.lower)
        if not unknown:
            return
        options = " ".join(f"--label {label}=CATEGORY" for label in unknown)
        each = "\n".join(f"  --label {label}=ORG (map it onto a category) or --label {label}={label.upper()} "
                         f"(add it as a category)" for label in unknown)
        where = self.labels_file or f"<data home>/{LABELS_FILE}"
        raise UedpError(f"{emitted_by}: {len(unknown)} label{'s' if len(unknown) > 1 else ''} the category taxonomy "
                        f"{self.source} does not know: {', '.join(unknown)}. Say what each "
                        f"is, all in one command: uedp detect {dataset} {options}, with CATEGORY one of "
                        f"{', '.join(self.canonical)} or a new name:\n{each}\n(or write `LABEL: CATEGORY` lines under "
                        f"`labels:` in {where})")

    def resolve(self, raw: str | list[str]) -> list[str]:
        """``"PER,PII"`` (or a list) -> sorted canonical categories; unknown names list the valid ones."""
        items = raw.split(",") if isinstance(raw, str) else list(raw)
        wanted = [item.strip().upper() for item in items if item.strip()]
        if not wanted:
            raise UedpError(f"no entity categories given; choose from {','.join(self.names())}")
        resolved: set[str] = set()
        unknown = []
        for name in wanted:
            if name in self.composites:
                resolved.update(self.composites[name])
            elif name in self.alias_to_canonical:
                resolved.add(self.alias_to_canonical[name])
            else:
                unknown.append(name)
        if unknown:
            raise UedpError(f"unknown entity categories {','.join(unknown)}; valid: {','.join(self.names())} "
                            f"(a label of your own: {self.how_to_add(unknown[0])})")
        return sorted(resolved)


@dataclass
class _Draft:
    """A taxonomy being built: the packaged (or UEDP_CATEGORIES) file, then the labels file over it."""

    order: list[str]
    aliases: dict[str, str]  # upper-case label -> canonical
    coarse: dict[str, str | None]
    composites: dict[str, tuple[str, ...]]

    def add_category(self, name: str, aliases: list[str], where: str) -> None:
        if name in self.composites:
            raise UedpError(f"{where}: {name} is a composite of the taxonomy, not a category")
        if name not in self.coarse:
            if name in self.aliases:
                raise UedpError(f"{where}: {name} is already a label of {self.aliases[name]}; map it there "
                                f"(`{name}: {self.aliases[name]}` under `labels:`) or choose another name")
            self.order.append(name)
            self.coarse[name] = None
            self.aliases[name] = name
        for alias in aliases:
            self.map_label(alias, name, where)

    def map_label(self, label: str, category: str, where: str) -> None:
        """``label`` becomes an alias of ``category`` (moved from another category's aliases, if there)."""
        label = label.upper()
        if label in self.composites:
            raise UedpError(f"{where}: {label} is a composite of the taxonomy; it cannot be a label of {category}")
        if label in self.coarse and label != category:
            raise UedpError(f"{where}: {label} is a category of the taxonomy; it cannot be a label of {category} "
                            "(choose both at query time instead)")
        self.aliases[label] = category

    def build(self, source: str, labels_file: str | None, digest: str) -> Taxonomy:
        return Taxonomy(tuple(self.order), dict(self.aliases), dict(self.coarse), dict(self.composites), source,
                        labels_file, digest)


def _read_base(path: Path) -> _Draft:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        categories: dict[str, dict[str, Any]] = data["categories"]  # parsed YAML: values are untyped
        composites = {name.upper(): tuple(members) for name, members in (data.get("composites") or {}).items()}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise UedpError(f"cannot read the category taxonomy {path}: {exc}") from None
    aliases: dict[str, str] = {}
    for name, spec in categories.items():
        for alias in [name, *(spec.get("aliases") or [])]:
            if aliases.setdefault(str(alias).upper(), name) != name:
                raise UedpError(f"{path}: label {alias!r} is an alias of both {aliases[str(alias).upper()]} and {name}")
    for name, members in composites.items():
        missing = [m for m in members if m not in categories]
        if missing or name in aliases:
            raise UedpError(f"{path}: composite {name} names unknown categories {missing} or shadows a category")
    coarse: dict[str, str | None] = {name: spec.get("coarse") for name, spec in categories.items()}
    return _Draft(list(categories), aliases, coarse, composites)


def load_taxonomy(path: Path) -> Taxonomy:
    """The taxonomy of one file alone (no labels file)."""
    return _read_base(path).build(str(path), None, _digest(path.read_bytes()))


def _digest(*contents: bytes) -> str:
    """The packaged file alone hashes as it always did (detection keys of homes without labels stay valid)."""
    return hashlib.sha256(b"\0".join(contents)).hexdigest()


def _name(value: object, where: str, what: str) -> str:
    """A label or category name from YAML or the command line: a non-empty string without commas."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise UedpError(f"{where}: the {what} must be a name, not {value!r}")
    name = str(value).strip()
    if not name or "," in name or any(c.isspace() for c in name):
        raise UedpError(f"{where}: the {what} {name!r} must be a non-empty name without commas or spaces")
    return name


def _labels_spec(path: Path) -> dict[str, Any]:
    """The labels file's content, checked for shape: ``labels:`` (label -> category) and ``categories:``."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UedpError(f"cannot read the labels file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise UedpError(f"cannot read the labels file {path}{where}: {problem} (not valid YAML)") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise UedpError(f"{path}: expected a mapping with `labels:` (LABEL: CATEGORY) and/or `categories:`")
    unknown = sorted(set(map(str, data)) - {"labels", "categories"})
    if unknown:
        raise UedpError(f"{path}: unknown key {unknown[0]!r} (expected `labels:` and/or `categories:`)")
    for key in ("labels", "categories"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise UedpError(f"{path}: `{key}:` must be a mapping ({'LABEL: CATEGORY' if key == 'labels' else 'NAME: {aliases: [...], coarse: ...}'})")
    return data


def _apply_labels(draft: _Draft, spec: dict[str, Any], path: Path | str) -> None:
    for raw_name, raw in (spec.get("categories") or {}).items():
        where = f"{path}: categories entry {raw_name!r}"
        name = _name(raw_name, where, "category").upper()
        raw = {} if raw is None else raw
        if not isinstance(raw, dict) or set(map(str, raw)) - {"aliases", "coarse"}:
            raise UedpError(f"{where}: expected {{aliases: [LABEL, ...], coarse: PER|LOC|ORG|MISC|null}}, got {raw!r}")
        aliases = raw.get("aliases") or []
        aliases = [aliases] if isinstance(aliases, (str, int)) else aliases
        if not isinstance(aliases, list):
            raise UedpError(f"{where}: aliases must be a list of labels, not {aliases!r}")
        draft.add_category(name, [_name(a, where, "alias") for a in aliases], where)
        if "coarse" in raw:
            coarse = raw["coarse"]
            draft.coarse[name] = None if coarse is None else _name(coarse, where, "coarse class").upper()
    for raw_label, raw_category in (spec.get("labels") or {}).items():
        where = f"{path}: labels entry {raw_label!r}: {raw_category!r}"
        _map_onto(draft, _name(raw_label, where, "label"), _name(raw_category, where, "category"), where)


def _map_onto(draft: _Draft, label: str, category: str, where: str) -> None:
    """``label`` onto ``category``: a category or an alias of one; a name the taxonomy lacks is added."""
    target = category.upper()
    if target in draft.composites:
        raise UedpError(f"{where}: {target} is a composite; map the label onto one category of it "
                        f"({', '.join(draft.composites[target])})")
    target = draft.aliases.get(target, target)
    if target not in draft.coarse:
        draft.add_category(target, [], where)
    draft.map_label(label, target, where)


@lru_cache(maxsize=8)
def _cached(base: str, base_stamp: tuple[int, ...], labels: str, labels_stamp: tuple[int, ...] | None) -> Taxonomy:
    """Keyed by the files' stamps (inode, size, mtime): an edited file is read again."""
    base_path, labels_path = Path(base), Path(labels)
    draft = _read_base(base_path)
    contents = [base_path.read_bytes()]
    source = str(base_path)
    if labels_stamp is not None:
        _apply_labels(draft, _labels_spec(labels_path), labels_path)
        contents.append(labels_path.read_bytes())
        source = f"{base_path} + {labels_path}"
    return draft.build(source, str(labels_path), _digest(*contents))


def _stamp(path: Path) -> tuple[int, ...] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UedpError(f"cannot read {path}: {exc.strerror}") from None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def labels_in_force() -> Path:
    """The labels file used where none is named: ``UEDP_LABELS`` (the CLI's data home), else the default home's."""
    raw = os.environ.get(LABELS_ENV) or str(Path(os.environ.get("UEDP_HOME") or ".uedp") / LABELS_FILE)
    return Path(raw).expanduser().resolve()


def _base_path() -> Path:
    return Path(os.environ.get("UEDP_CATEGORIES") or str(DEFAULT_TAXONOMY))


def taxonomy(labels_file: str | os.PathLike[str] | None = None) -> Taxonomy:
    """The taxonomy in force: ``UEDP_CATEGORIES`` if set, else the packaged file, merged with the data
    home's labels file (``labels_file``: pass ``home.labels_file``; default :func:`labels_in_force`)."""
    base = _base_path()
    labels = Path(labels_file).expanduser().resolve() if labels_file is not None else labels_in_force()
    base_stamp = _stamp(base)
    if base_stamp is None:
        raise UedpError(f"cannot read the category taxonomy {base}: no such file")
    return _cached(str(base), base_stamp, str(labels), _stamp(labels))


def parse_label_option(raw: str) -> tuple[str, str]:
    """``--label group=ORG`` -> ``("group", "ORG")``; one line naming the option when malformed."""
    label, sep, category = raw.partition("=")
    if not sep or not label.strip() or not category.strip():
        raise UedpError(f"invalid --label {raw!r}: expected LABEL=CATEGORY, e.g. --label group=ORG (map a label onto "
                        "a category) or --label TRACKING_NUMBER=TRACKING_NUMBER (add a category)")
    where = f"--label {raw}"
    return _name(label, where, "label"), _name(category, where, "category")


def save_labels(labels_file: str | os.PathLike[str], options: list[str]) -> Taxonomy:
    """Merge ``--label LABEL=CATEGORY`` options into the labels file (checked first, then written
    atomically: a temporary file, then ``os.replace``) and return the taxonomy with them."""
    path = Path(labels_file).expanduser().resolve()
    pairs = [(raw, *parse_label_option(raw)) for raw in options]
    current = taxonomy(path)  # the file as it is must be valid before it is added to
    if not pairs:
        return current
    spec = _labels_spec(path) if path.is_file() else {}
    labels = {str(k): v for k, v in (spec.get("labels") or {}).items()}
    draft = _Draft(list(current.canonical), dict(current.alias_to_canonical), dict(current.coarse),
                   dict(current.composites))
    for raw, label, category in pairs:
        _map_onto(draft, label, category, f"--label {raw}")  # a bad option fails here, before the file changes
        labels = {k: v for k, v in labels.items() if k.upper() != label.upper()} | {label: category}
    spec = {**spec, "labels": labels}
    _apply_labels(_read_base(_base_path()), spec, path)  # the file as it will be
    text = ("# uedp's labels for this data home, merged over the category taxonomy (see docs/guide.md).\n"
            "# labels: a corpus' or recognizer's label -> a category (a name the taxonomy lacks adds it)\n"
            "# categories: NAME: {aliases: [LABEL, ...], coarse: PER|LOC|ORG|MISC|null}\n"
            + yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise UedpError(f"cannot write the labels file {path}: {exc.strerror}") from None
    return taxonomy(path)


def parse_categories(raw: str | list[str]) -> list[str]:
    return taxonomy().resolve(raw)


def _choices_schema(schema: dict[str, object]) -> None:
    """JSON schema of a categories field: the taxonomy's categories and composites as choices, so the
    Prefect UI renders a multi-select (read when the schema is generated, so UEDP_CATEGORIES applies)."""
    tax = taxonomy()
    schema["items"] = {"type": "string", "enum": [*tax.canonical, *tax.composites]}


# A pydantic field type: accepts "PERSON,LOC" or a list, validates and normalises with the taxonomy.
Categories = Annotated[list[str], BeforeValidator(lambda raw: parse_categories(raw)),
                       Field(json_schema_extra=_choices_schema)]

DEFAULT_CATEGORIES = ("PERSON", "LOC", "ORG", "PHONE_NUMBER", "EMAIL_ADDRESS")


def default_categories() -> list[str]:
    """The categories a configuration treats as sensitive unless told otherwise (defined once)."""
    return list(DEFAULT_CATEGORIES)
