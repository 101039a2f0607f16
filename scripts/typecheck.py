"""Run mypy on the installed layout of the ``uedp`` package.

The package's subpackages live in the design card's top-level folders (pyproject.toml's ``package-dir``).
mypy resolves ``uedp.privacy`` from folders on its search path and does not follow setuptools' editable
import hook, so this script links the folders into the layout a wheel installs (``<tmp>/uedp/privacy`` ->
``privacy/``...) under ``.mypy_cache/layout`` and checks that, with the cache beside it (warm: seconds). Configuration (strict on the privacy core) is pyproject.toml's.

    python scripts/typecheck.py            # what `make lint` and CI run
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    mapping = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-dir"]
    # The layout sits at one place inside the repository's mypy cache, so a second check reuses the first's
    # analysis (about 50 s cold on 2 cores, seconds warm); it is rebuilt every time (folders come and go).
    cache = REPO / ".mypy_cache"
    layout = cache / "layout"
    shutil.rmtree(layout, ignore_errors=True)
    layout.mkdir(parents=True)
    tmp = str(layout)
    root = Path(tmp) / "uedp"
    root.mkdir()
    for entry in (REPO / mapping["uedp"]).iterdir():  # the root package's own modules and data
        if entry.name != "__pycache__":
            (root / entry.name).symlink_to(entry)
    for package, folder in mapping.items():
        if package != "uedp":
            (root / package.split(".", 1)[1]).symlink_to(REPO / folder)
    command = [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"), "--cache-dir",
               str(cache), "-p", "uedp"]
    env = os.environ | {"MYPYPATH": tmp}
    done = subprocess.run(command, cwd=tmp, env=env, text=True, capture_output=True)
    # Report paths in the repository, not in the temporary tree.
    print(done.stdout.replace(str(root) + "/", "").strip())
    if done.stderr.strip():
        print(done.stderr.strip(), file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
