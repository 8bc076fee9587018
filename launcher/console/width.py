"""The launcher's own sentences fitted to the terminal's width, word by word.

A terminal wraps a line wider than itself wherever the last column falls, in the middle of
a word or a path; at 80 columns most of the launcher's sentences did. On a terminal
(``Console`` with ``tty``) each line of the launcher's own text is wrapped at spaces to
the terminal's width, its continuation lines indented under its text. What must stay whole
does: a command (the part of an indented next-step line before its three-space gap, a
`backquoted` span, a labelled ``view: launch ...``, a ``pip install``, a command on an
indented line of its own, which is never wrapped), a path or a URL (a word is never broken). A worker's line (``[p0] ...``) is wrapped the same way under its
text (``worker_line``). Lines that are not sentences are left as they are: a log tail
(``  | ...``), a table (columns apart by two spaces or more). Where the output is not a terminal (a pipe,
a file, ``launcher.log``) nothing is wrapped: one line a sentence, for grep.
"""

from __future__ import annotations

import re
import shutil
import textwrap

HEAD = re.compile(r"^(podlaunch: )?( *)")  # what a continuation line is indented under
GAP = "   "  # a next-step line: "  COMMAND   what it does" (launcher.console.nextsteps)
KEEP = "\x00"  # a space inside something that must stay whole, while wrapping
# spans kept whole: a `backquoted` one, a labelled command (nextsteps' "view: launch
# tensorboard RUN"), a pip install (to the end of its parentheses' text)
WHOLE = re.compile(r"`[^`\n]*`|\S*python[0-9.]* -m pip install .*?(?=\)|  |$)")
LABELLED = re.compile(r"^([a-z]{2,12}: )((?:\S*/)?launch \S.*?)(?=  |$)")
TABLE = re.compile(r"\S {2,}\S.* {2,}\S")  # two gaps of two spaces or more: a table's row
# a command on a line of its own, indented under the sentence that says what it does
# (launcher.console.nextsteps): never wrapped, so that a terminal's selection pastes it whole
COMMAND = re.compile(r"^(?:'?\S*/)?launch'? \S")
MIN_COLUMNS = 40  # narrower than this, wrapping helps nobody: lines are left as they are


def columns() -> int:
    """The terminal's width in columns (``COLUMNS`` first, as ``shutil.get_terminal_size``;
    80 when unknown)."""
    return shutil.get_terminal_size((80, 24)).columns


def fitted(text: str, width: int) -> str:
    """``text`` (lines) with each sentence line wider than ``width`` wrapped at spaces.

    Args:
      text: one or more lines, without their final newline.
      width: the terminal's columns; under ``MIN_COLUMNS`` nothing is wrapped.

    Returns:
      The same words in the same order; only spaces between them became line breaks plus
      the continuation's indentation.
    """
    if width < MIN_COLUMNS:
        return text
    return "\n".join(_fitted_line(line, width) for line in text.split("\n"))


def _is_sentence(body: str) -> bool:
    """Whether a line's text (after ``podlaunch: `` and its indentation) is a sentence to wrap:
    not a worker's line, a log tail or a table's row."""
    if not body or body.startswith(("[", "|")):
        return False
    command, gap, rest = body.partition(GAP)
    if gap:  # a next step's command, then its words: those must not be a table's
        return "  " not in command and not TABLE.search(rest.strip(" "))
    return not TABLE.search(body)


def _fitted_line(line: str, width: int) -> str:
    if len(line) <= width:
        return line
    head = HEAD.match(line)
    lead, body = head.group(0), line[head.end():]
    if not _is_sentence(body) or (head.group(2) and GAP not in body and COMMAND.match(body)):
        return line
    indent = len(lead)
    if head.group(2) and GAP in body:  # a next step: its command whole, what it does after
        command = body.partition(GAP)[0]
        body = command.replace(" ", KEEP) + body[len(command):]  # its column's padding kept
        indent += 4
    body = LABELLED.sub(lambda m: m.group(1) + m.group(2).replace(" ", KEEP), body)
    body = WHOLE.sub(lambda m: m.group(0).replace(" ", KEEP), body)
    wrapper = textwrap.TextWrapper(width=width, initial_indent=lead,
                                   subsequent_indent=" " * min(indent, width // 2),
                                   break_long_words=False, break_on_hyphens=False)
    return "\n".join(wrapper.wrap(body)).replace(KEEP, " ")


LABEL = re.compile(r"^\[[^\]]*\] ")  # a worker line's "[p0] " or "[p1 n2] "


def worker_line(line: str, width: int) -> str:
    """A worker's line (``[p0] text``) wider than ``width`` wrapped at spaces under its text;
    a table's row (two gaps of two spaces or more) or a narrow terminal: as it is."""
    label = LABEL.match(line)
    if width < MIN_COLUMNS or len(line) <= width or label is None or TABLE.search(line):
        return line
    wrapper = textwrap.TextWrapper(width=width, subsequent_indent=" " * label.end(),
                                   break_long_words=False, break_on_hyphens=False)
    return "\n".join(wrapper.wrap(line))
