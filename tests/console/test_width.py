"""The launcher's sentences fit the terminal (issue 62: lines of about 90 characters wrapped
wherever the 80th column fell, in the middle of a word or a path): on a terminal each is
wrapped at spaces to its width, what must stay whole (a command, a path) whole; elsewhere
(a pipe, a file, launcher.log) one line a sentence."""

from __future__ import annotations

import io
import re

from launcher.console import Console, width

GOODPUT = ("podlaunch: goodput 0.11: 0.3 s of the run's 2.7 s went into training steps that "
           "count; largest loss of time (badput): process start and join 0.9 s, paid once "
           "however long the run (docs/glossary.md) (ledger: "
           "/tmp/r/runs/linear/20261207-031920-373/ledger.json)")
NEXT = ("podlaunch:   .venv/bin/launch jobs/linear.yaml --cluster jobs/clusters/ssh-example.yaml"
        "   on your own SSH hosts (docs/ssh.md; TPU: docs/tpu.md, Slurm: docs/slurm.md)")
VIEW = ("podlaunch: view: .venv/bin/launch tensorboard /tmp/r/runs/linear/20261207-031920-373  "
        "(TensorBoard first: /tmp/r/.venv/bin/python3 -m pip install tensorboard)")
QUOTED = ("podlaunch: the run stopped: run `launch JOB.yaml --resume runs/linear/20261207-0319 "
          "--set a=b` to go on from its last checkpoint")
TABLE = ("process  host       state      exit         steps  step ms  first s  cache\n"
         "p0       host-with-a-rather-long-name  failed (first)  killed by SIGKILL    100    "
         "7.121    0.332    0/9")
WORKER = "[p0] step 100/100 loss 0.00886711 | 448.3 steps/s | step_time_s 0.00223043 (own 9.2e-05)"


def words(text: str) -> list:
    return text.split()


def test_a_sentence_wraps_at_spaces_under_its_text_and_keeps_every_word():
    lines = width.fitted(GOODPUT, 80).split("\n")
    assert len(lines) == 4 and all(len(line) <= 80 for line in lines), lines
    assert all(line.startswith(" " * len("podlaunch: ")) for line in lines[1:]), lines
    assert words("\n".join(lines)) == words(GOODPUT)
    assert width.fitted(GOODPUT, 300) == GOODPUT  # it fits: as it was


def test_commands_and_paths_stay_whole():
    lines = width.fitted(NEXT, 80).split("\n")
    # the next step's command on its line (longer than the terminal: never cut), what it does after
    assert lines[0] == "podlaunch:   .venv/bin/launch jobs/linear.yaml --cluster " \
                       "jobs/clusters/ssh-example.yaml", lines
    assert all(len(line) <= 80 for line in lines[1:]) and words("\n".join(lines)) == words(NEXT)
    view = width.fitted(VIEW, 80).split("\n")
    assert any(line.strip() == ".venv/bin/launch tensorboard /tmp/r/runs/linear/20261207-031920-373"
               for line in view), view
    assert any(line.strip().startswith("/tmp/r/.venv/bin/python3 -m pip install tensorboard")
               for line in view), view
    quoted = width.fitted(QUOTED, 80).split("\n")
    assert any("`launch JOB.yaml --resume runs/linear/20261207-0319 --set a=b`" in line
               for line in quoted), quoted
    assert all(len(line) <= 80 for line in quoted)
    # a path longer than the line: on a line of its own, whole
    path = "podlaunch: logs: /" + "x" * 90
    assert width.fitted(path, 80).split("\n") == ["podlaunch: logs:", " " * 11 + path[17:]]


def test_tables_worker_lines_and_narrow_terminals_are_left_as_they_are():
    assert width.fitted(TABLE, 80) == TABLE
    assert width.fitted(WORKER, 80) == WORKER
    assert width.fitted("  | " + "x " * 60, 80) == "  | " + "x " * 60  # a log's tail
    assert width.fitted(GOODPUT, 30) == GOODPUT  # too narrow to help


def test_the_console_wraps_on_a_terminal_only_and_launcher_log_keeps_one_line(tmp_path,
                                                                               monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    sentence = GOODPUT[len("podlaunch: "):]
    for tty in (True, False):
        out = io.StringIO()
        console = Console(stream=out, tty=tty, status_every_s=0)
        console.log_to(str(tmp_path / f"launcher-{tty}.log"))
        console.say(sentence)
        console.block(TABLE + "\n" + "compilation: first step up to 0.339 s (p1); cache 0 "
                      "hits, 18 misses over 2 processes and then some more words")
        console.close()
        shown = out.getvalue().splitlines()
        if tty:
            assert max(len(line) for line in shown if not re.match(r"^p0 +host", line)) <= 80
            assert len(shown) == 4 + 2 + 2, shown
        else:
            assert len(shown) == 1 + 3, shown
        logged = (tmp_path / f"launcher-{tty}.log").read_text().splitlines()
        assert len(logged) == 4 and logged[0].endswith(GOODPUT), logged  # one line a sentence


def test_a_workers_line_wraps_under_its_text_and_its_tables_do_not():
    lines = width.worker_line(WORKER, 80).split("\n")
    assert len(lines) == 2 and lines[1].startswith(" " * 5) and len(lines[0]) <= 80, lines
    assert words("\n".join(lines)) == words(WORKER)
    row = "[p1 n2] name     shape        dtype    mean      std       notes and more notes here"
    assert width.worker_line(row, 80) == row
    assert width.worker_line(WORKER, 200) == WORKER


def test_a_command_on_its_own_line_is_never_wrapped_so_that_it_pastes_whole():
    """Issue 70, item 1: the continue command was wrapped with a hanging indent, and a terminal
    selection ran `launch jobs/linear.yaml --set` and `train.num_steps=20000 --resume ...` as
    two broken commands. Its sentence wraps; the command under it stays one line, however
    narrow the terminal."""
    sentence = ("podlaunch: continue this stopped run from its checkpoint of step 4210 (its job "
                "and settings; add --set KEY=VALUE to change one):")
    command = ("podlaunch:   /home/someone/src/podlaunch/.venv/bin/launch resume "
               "/home/someone/src/podlaunch/runs/linear/20261207-031920-373")
    lines = width.fitted(sentence + "\n" + command, 80).split("\n")
    assert lines[-1] == command and len(lines) == 3, lines
    assert width.fitted("podlaunch:   launch resume /a/b --set x=1", 40) == \
        "podlaunch:   launch resume /a/b --set x=1"
