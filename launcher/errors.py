"""The launcher's two error families: bad input (exit 2) and run failure (exit 1)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with the user's input.

    Attributes:
      source: where the value came from: a file path, ``--set`` or a flag name.
      line: 1-based line in ``source`` when known, else None.
      path: dotted key path (``train.learning_rate``), or "" for the whole file.
      message: what was seen, what was expected, and what to do.
    """

    source: str
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = self.source if self.line is None else f"{self.source}:{self.line}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class SpecError(Exception):
    """Bad input: the spec, a flag, or a file it names. Nothing was started.

    Carries every problem found, so the user fixes them all in one go.
    """

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class LaunchError(Exception):
    """The run could not be started or failed while running (exit code 1)."""
