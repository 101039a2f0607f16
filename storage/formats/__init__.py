"""Streaming readers for the corpus formats uedp ingests. Each yields plain records and raises
``FormatError`` naming the file and line of the first bad input."""

from pathlib import Path

from uedp.errors import UedpError


class FormatError(UedpError):
    def __init__(self, path: Path, line: int | None, problem: str):
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")
        self.path, self.line, self.problem = path, line, problem
