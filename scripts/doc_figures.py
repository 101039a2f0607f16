"""Regenerate the figures the documentation quotes from a run (``make doc-figures``): the seeded demo's table
and how long the demo takes, with the machine's load while it ran.

A figure typed into a page by hand goes stale without anyone noticing (issue 50: the guide's table said
noiseless 2.926 while ``uedp demo`` printed 2.285). Here every such figure is measured by a command,
recorded in ``docs/demo-figures.json`` with the machine, its load and the commit, and rendered into the
marked blocks of the pages (``<!-- uedp:NAME -->`` ... ``<!-- /uedp:NAME -->``). ``tests/test_docs.py``
checks, cheaply, that the blocks are what the record renders and that the record was measured with the
demo's current defaults and corpus; only this script changes them.

    python scripts/doc_figures.py                  # run `uedp demo` in a fresh data home, record, render
    python scripts/doc_figures.py --fresh-clone    # also `time make demo` in a fresh clone (install included)
    python scripts/doc_figures.py --render-only    # re-render the pages from the record
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "docs" / "demo-figures.json"
GUIDE = ROOT / "docs" / "guide.md"
README = ROOT / "README.md"
DEMO_CORPUS = ROOT / "uedp" / "data" / "demo.conll"
SHOWN_HOME = "/abs/path/.uedp"  # the temporary data home, as the pages show it
# The documented way to reproduce the table digit for digit: floating-point sums change order with threads.
THREADS = "1"


def demo_fingerprint() -> str:
    """What the demo's table depends on besides the code: its configuration's defaults and its corpus."""
    from uedp.services.demo_config import DemoConfig

    defaults = DemoConfig().model_dump(mode="json", exclude={"home"})
    digest = hashlib.sha256(json.dumps(defaults, sort_keys=True).encode())
    digest.update(DEMO_CORPUS.read_bytes())
    return digest.hexdigest()[:16]


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0]) if Path("/proc/loadavg").is_file() else float("nan")


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def measure_demo() -> dict[str, Any]:
    """``uedp demo`` in a fresh data home, one torch thread: its output from the table on, and its wall time."""
    with tempfile.TemporaryDirectory(prefix="uedp-demo-") as tmp:
        home = Path(tmp) / ".uedp"
        env = os.environ | {"OMP_NUM_THREADS": THREADS, "UEDP_HOME": str(home)}
        env.pop("MLFLOW_TRACKING_URI", None)
        env.pop("PREFECT_API_URL", None)
        load_before, started = _load(), time.monotonic()
        done = subprocess.run([sys.executable, "-m", "uedp.cli", "demo"], cwd=tmp, env=env, capture_output=True,
                              text=True)
        seconds, load_after = time.monotonic() - started, _load()
        if done.returncode:
            sys.exit(f"uedp demo failed ({done.returncode}):\n{done.stderr[-3000:]}")
        lines = done.stdout.replace(str(home), SHOWN_HOME).splitlines()
    first = next(i for i, line in enumerate(lines) if "uedp demo results" in line)
    return {"output": "\n".join(line.rstrip() for line in lines[first:]).strip(),
            **_where(seconds, load_before, load_after)}


def _where(seconds: float, load_before: float, load_after: float) -> dict[str, Any]:
    """A measurement's time, and the machine, load, commit and day it was taken on."""
    return {"seconds": round(seconds, 1), "load": [load_before, load_after], "cores": os.cpu_count(),
            "commit": _commit(), "date": dt.date.today().isoformat()}


def measure_make_demo() -> dict[str, Any]:
    """``time make demo`` in a fresh clone of this commit: the README's first command, install included."""
    with tempfile.TemporaryDirectory(prefix="uedp-clone-") as tmp:
        clone = Path(tmp) / "uedp"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        load_before, started = _load(), time.monotonic()
        done = subprocess.run(["make", "demo"], cwd=clone, capture_output=True, text=True,
                              env=os.environ | {"OMP_NUM_THREADS": THREADS})
        seconds, load_after = time.monotonic() - started, _load()
        if done.returncode:
            sys.exit(f"make demo failed ({done.returncode}):\n{(done.stderr or done.stdout)[-3000:]}")
    return _where(seconds, load_before, load_after)


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(round(seconds % 60))} s" if seconds >= 60 else f"{seconds:.0f} s"


def _machine(run: dict[str, Any]) -> str:
    return (f"{run['cores']} cores, load {run['load'][0]:.1f} then {run['load'][1]:.1f}, "
            f"`{run['commit']}`, {run['date']}")


def render(record: dict[str, Any]) -> dict[str, str]:
    """Each marked block's text, from the record."""
    demo = record["demo"]
    timing = (f"`OMP_NUM_THREADS={record['threads']} uedp demo` took **{_minutes(demo['seconds'])}** from a fresh "
              f"home ({_machine(demo)})")
    make = record.get("make_demo")
    if make:
        timing += f"; `make demo` in a fresh clone, install included, **{_minutes(make['seconds'])}** ({_machine(make)})"
    timing += " (`make doc-figures`)"
    return {"demo-output": f"```\n{demo['output']}\n```", "demo-timing": timing}


def rewrite(path: Path, blocks: dict[str, str]) -> str:
    """The page with every marked block it holds replaced by its new text."""
    text = path.read_text(encoding="utf-8")
    for name, body in blocks.items():
        pattern = re.compile(rf"(<!-- uedp:{name} -->)(.*?)(<!-- /uedp:{name} -->)", re.DOTALL)
        inner = f"\n{body}\n" if "\n" in body else body  # a code block on lines of its own, a sentence inline
        text = pattern.sub(lambda m, inner=inner: f"{m.group(1)}{inner}{m.group(3)}", text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fresh-clone", action="store_true", help="also time `make demo` in a fresh clone")
    parser.add_argument("--render-only", action="store_true", help="re-render the pages from docs/demo-figures.json")
    args = parser.parse_args()
    if args.render_only:
        record = json.loads(RECORD.read_text(encoding="utf-8"))
    else:
        record = {"threads": THREADS, "fingerprint": demo_fingerprint(), "demo": measure_demo()}
        if args.fresh_clone:
            record["make_demo"] = measure_make_demo()
        elif RECORD.is_file():  # keep the last clone's timing, with its own date, until measured again
            previous = json.loads(RECORD.read_text(encoding="utf-8"))
            if previous.get("make_demo"):
                record["make_demo"] = previous["make_demo"]
        RECORD.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    blocks = render(record)
    for page in (GUIDE, README):
        page.write_text(rewrite(page, blocks), encoding="utf-8")
    print(f"uedp demo: {record['demo']['seconds']} s; pages re-rendered from {RECORD.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
