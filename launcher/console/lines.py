"""What a worker's output line is, for the console: library noise, routine, or worth showing.

Every line a worker prints goes to its log file; this module only decides
what reaches the console (``launcher.console``). Three kinds:

* **noise** (``NOISE``, the one list of it): start-up chatter of JAX, XLA
  and gloo that says nothing a user can act on, e.g. ``[Gloo] Rank 1 is
  connected to 3 peer ranks ...``. Logs only, whatever ``--show`` says.
* **notable** (``Attention``): warnings, errors, tracebacks, a worker's own
  failure report: shown from every process, even one ``--show`` leaves out.
* everything else is **routine** (progress, "joined", "done"): shown only
  for the processes ``--show`` names (process 0 by default).

Threads of one worker that write without a newline between them glue their
lines together (``[Gloo] Rank 1[Gloo] Rank 0 is connected ...`` and then
`` is connected ...``). ``split_glued`` splits such lines back at the places
where a known noise line starts, and cuts out whole noise lines found
inside another, so no piece is shown under another line's prefix. It runs
before the launcher parses a line, so a progress line glued behind noise
still counts.

A line may be of any length: ``LineSplitter`` splits bytes into lines in
linear time, holding at most ``MAX_HELD_BYTES`` of one (the rest goes on as
``Piece``s), and ``Shortened`` gives the console at most ``MAX_SHOWN_CHARS``
of it; the log file keeps all of it.

Stdlib only (``re``, ``codecs``): the launcher imports this before anything heavy.
"""

from __future__ import annotations

import codecs
import re
from typing import Iterator, NamedTuple


class Noise(NamedTuple):
    """One kind of library chatter.

    Attributes:
      name: what it is, for people.
      pattern: the line, or a piece of it, as it appears (matched anywhere in a line).
      needle: a plain text every match of ``pattern`` holds: a line without any kind's
        needle is no noise, found without a regular expression (every worker line is
        asked; most hold none).
      starts: the text such a line starts with, where a glued line is split.
    """

    name: str
    pattern: str
    needle: str
    starts: str | None = None


# The one list of library noise: add a kind here (and a case to tests/console/test_console.py).
NOISE = (
    # gloo (JAX's CPU collectives) as every process joins the first collective
    Noise("gloo connected", r"\[Gloo\] Rank \d+ is connected to \d+ peer ranks?\. "
                            r"Expected number of connected peer ranks is : \d+", "[Gloo] Rank ",
          "[Gloo] "),
    # the pieces two threads leave when they write that line at once
    Noise("gloo piece", r"\[Gloo\] Rank \d+\s*$", "[Gloo] Rank ", "[Gloo] "),
    Noise("gloo piece", r"^\s*is connected to \d+ peer ranks?\. "
                        r"Expected number of connected peer ranks is : \d+", "is connected to "),
    # absl's note before its logging is set up (XLA, the coordination service)
    Noise("absl preamble", r"WARNING: All log messages before absl::InitializeLog\(\) is called "
                           r"are written to STDERR", "absl::InitializeLog"),
    # XLA/TSL C++ INFO lines (glog format: I0000 00:00:1712345678.901234  1234 file.cc:12] ...);
    # their W and E lines are not noise
    Noise("xla info", r"^I\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [\w.\-/]+:\d+\] .*", "] "),
    # XLA:CPU refusing a compilation cache entry made on another CPU (it compiles anew): each
    # host has a folder of its own (worker.runtime.compilecache.machine); a cache the user
    # shares otherwise still costs no console line per process
    Noise("xla cpu cache entry of another machine",
          r"^E\d{4} .*cpu_aot_loader\.cc:\d+\] Loading XLA:CPU AOT result\. Target machine "
          r"feature \S+ is not supported on the host machine.*", "cpu_aot_loader"),
)
_NEEDLES = tuple(n.needle for n in NOISE)


def _may_be_noise(line: str) -> bool:
    """Whether ``line`` holds some kind's needle (else no noise pattern can match it)."""
    for needle in _NEEDLES:  # a loop: any() over a generator costs twice as much here
        if needle in line:
            return True
    return False

_NOISE_RE = re.compile("|".join(f"(?:{n.pattern})" for n in NOISE))
# Two threads writing gloo's line at once can also interleave it word by word, e.g. "[Gloo]
# Rank 1 is connected to 03 is connected to  peer ranks. 3Expected number of ...": a line made
# of nothing but that line's words and numbers is noise too (not split: it has no whole piece).
_GLOO_INTERLEAVED = re.compile(r"(?=.*(?:\[Gloo\]|peer ranks))(?:\[Gloo\]|Rank|is|connected|to|"
                               r"peer|ranks?|Expected|number|of|[.:]|\d+|\s)+")
_STARTS = tuple(sorted({n.starts for n in NOISE if n.starts}))
_SPLIT_RE = re.compile("(?=" + "|".join(re.escape(s) for s in _STARTS) + ")") if _STARTS else None


def is_noise(line: str) -> bool:
    """Whether ``line`` (already unglued) is library noise: for the logs only."""
    if not _may_be_noise(line) and "peer rank" not in line and "[Gloo]" not in line:
        return False  # _GLOO_INTERLEAVED needs one of those two too
    if _GLOO_INTERLEAVED.fullmatch(line):
        return True
    match = _NOISE_RE.search(line)
    return match is not None and not (line[:match.start()] + line[match.end():]).strip()


# A C++ library's own log line (glog/absl format: F1206 05:04:52.109590  12747 client.h:80] ...;
# any severity) and the RPC line JAX's coordination client prints after its fatal one
_LIBRARY_LOG_RE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+(?:\s+\d+)?\s+[\w.\-/]+:\d+\] "
                             r"|^RPC: /tensorflow\.")


def is_library_log(line: str) -> bool:
    """Whether ``line`` is a C++ library's own log line (XLA, TSL, JAX's coordination
    client): what a summary leaves in the log where the launcher says the cause itself."""
    return _LIBRARY_LOG_RE.match(line) is not None


_CONSEQUENCE_WORDS = ("coordination service", "CoordinationService", "preemption",
                      "Socket closed", "another task died", "Polled an error")
_GRPC_CONTINUATION = ("Additional GRPC error information", ":UNKNOWN:Error received from peer")


def is_consequence_chatter(line: str) -> bool:
    """Whether ``line`` is JAX's coordination client saying, in its own log format, that a
    peer or the coordination service went away (the glog line and the gRPC lines after it):
    what every other process prints when one fails. The console shows it only for the
    processes ``--show`` names (the log keeps it; a process that fails of it is summarised
    as a consequence: ``launcher.console.explain``)."""
    if line.startswith(_GRPC_CONTINUATION):
        return True
    return is_library_log(line) and any(word in line for word in _CONSEQUENCE_WORDS)


def split_glued(line: str) -> list:
    """``line`` split back into the lines two threads wrote into it (usually ``[line]``).

    Whole noise lines found inside it are cut out as lines of their own, and
    the rest is split where a noise line starts; empty pieces are dropped
    (a line that was empty stays ``[""]``).
    """
    if not line or not _may_be_noise(line) or (
            _NOISE_RE.search(line) is None and not any(s in line[1:] for s in _STARTS)):
        return [line]
    pieces: list = []
    at = 0
    for match in _NOISE_RE.finditer(line):
        if match.start() == match.end():
            continue
        pieces.append(line[at:match.start()])
        pieces.append(line[match.start():match.end()])
        at = match.end()
    pieces.append(line[at:])
    out: list = []
    for piece in pieces:
        parts = _SPLIT_RE.split(piece) if _SPLIT_RE is not None and not is_noise(piece) else [piece]
        out += [p for p in parts if p.strip()]
    return out or [line]


_NOTABLE_RE = re.compile(
    r"warn|error|exception|traceback|fatal|fail|abort|panic|killed|segmentation fault"
    r"|out of memory|\boom\b|check failed|\bnan\b|\binf\b", re.IGNORECASE)
# The same search, fast: _NOTABLE_RE's IGNORECASE alternation costs about 85 us on a
# 100-character line here (every worker line is asked); its plain words on the lowered line
# cost 2 us, and the three words that need a word boundary go to _NOTABLE_RE only when
# their letters are there (bench/bench_lines.py).
_NOTABLE_LOW_RE = re.compile("warn|error|exception|traceback|fatal|fail|abort|panic|killed"
                             "|segmentation fault|out of memory")


def _is_notable_text(line: str) -> bool:
    """``_NOTABLE_RE.search(line)``, found the fast way."""
    low = line.lower()
    if _NOTABLE_LOW_RE.search(low):
        return True
    return ("oom" in low or "nan" in low or "inf" in low) and _NOTABLE_RE.search(line) is not None
_GLOG_PROBLEM_RE = re.compile(r"^[WEF]\d{4} \d\d:\d\d:\d\d")  # glog WARNING, ERROR, FATAL
_WORKER_REPORT = ("worker: ",)  # the worker's own report of a problem (worker/trainer/main.py)


class Attention:
    """Decides, line by line for one process, which lines are notable.

    Stateful for tracebacks: after ``Traceback (most recent call last):``
    every indented line is notable, up to and including the exception line.
    """

    def __init__(self):
        self.in_traceback = False

    def __call__(self, line: str) -> bool:
        if line.startswith("Traceback (most recent call last)"):
            self.in_traceback = True
            return True
        if self.in_traceback:
            if line[:1].isspace():
                return True
            self.in_traceback = False  # the exception line ends it
            return True
        return bool(_is_notable_text(line) or _GLOG_PROBLEM_RE.match(line)
                    or line.startswith(_WORKER_REPORT))


# ---- long lines ----------------------------------------------------------------------------
# A worker may print a line of any length (a 100 MB array without a newline): the log file
# keeps every character, but the reader holds at most MAX_HELD_BYTES of a line at once
# (passing on the rest as ``Piece``s), and the console, the progress parser and the failure
# summary see at most MAX_SHOWN_CHARS of it, with a note of its full length.
MAX_HELD_BYTES = 64 * 1024
MAX_SHOWN_CHARS = 2000


class Piece(str):
    """A part of a line too long to hold at once: more of the same line follows.

    The line's last part arrives as a plain ``str``. Readers that split output
    with ``LineSplitter`` yield these; ``Shortened`` puts such a line back
    together for the console.
    """


class LineSplitter:
    """Bytes in, lines out, in time linear in the bytes: each byte is searched once.

    A partial line is held as a list of chunks (never re-joined or re-scanned
    as more arrives) and, past ``max_held_bytes``, passed on as a ``Piece``.
    UTF-8 is decoded incrementally, so a character split across chunks or
    pieces arrives whole; undecodable bytes become U+FFFD. A trailing ``\\r``
    (CRLF output) is dropped.

    Attributes:
      scanned: bytes searched for a newline so far (equals the bytes fed:
        tests/console/test_console.py checks it).
    """

    def __init__(self, max_held_bytes: int = MAX_HELD_BYTES):
        self.max_held_bytes = max_held_bytes
        self.scanned = 0
        self._chunks: list = []
        self._held = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, data: bytes) -> list:
        """The lines (``str``) and pieces (``Piece``) that ``data`` completes, in order."""
        out = []
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            self.scanned += end + 1 - start
            self._chunks.append(data[start:end])
            out.append(self._take(final=True))
            start = end + 1
        self.scanned += len(data) - start
        if start < len(data):
            self._chunks.append(data[start:])
            self._held += len(data) - start
            if self._held >= self.max_held_bytes:
                out.append(self._take(final=False))
        return out

    def end(self) -> list:
        """The last line, when the output ended without a newline (``[]`` when it did not)."""
        return [self._take(final=True)] if self._chunks else []

    def _take(self, final: bool) -> str:
        text = self._decoder.decode(b"".join(self._chunks), final=final)
        self._chunks, self._held = [], 0
        return text.removesuffix("\r") if final else Piece(text)


def stream_lines(stream) -> Iterator[str]:
    """Each line of the text ``stream`` (a pipe's), without its newline, in constant memory: a
    line longer than ``MAX_HELD_BYTES`` characters comes as ``Piece``s, then its last part
    (which may be empty), never held whole (one 64 MiB output line cost the launcher 268 MiB)."""
    in_line = False
    while True:
        text = stream.readline(MAX_HELD_BYTES)
        if not text:
            if in_line:  # a long line's end, without a newline
                yield ""
            return
        in_line = not text.endswith("\n") and len(text) >= MAX_HELD_BYTES
        yield Piece(text) if in_line else text.removesuffix("\n")


class Shortened:
    """Puts a line that arrived in ``Piece``s (or is simply long) back as one line to show.

    ``add`` takes each piece; ``end`` takes the line's last part and returns
    the line as shown: itself when short, else its first ``max_chars``
    characters and a note of its full length.
    """

    def __init__(self, max_chars: int = MAX_SHOWN_CHARS):
        self.max_chars = max_chars
        self._head = ""
        self._length = 0

    @property
    def pending(self) -> bool:
        """Whether pieces of a line have arrived and its end has not."""
        return self._length > 0

    def add(self, piece: str) -> None:
        if len(self._head) < self.max_chars:
            self._head += piece[:self.max_chars - len(self._head)]
        self._length += len(piece)

    def end(self, last: str) -> str:
        self.add(last)
        head, length = self._head, self._length
        self._head, self._length = "", 0
        if length <= self.max_chars:
            return head
        return f"{head} [... line cut: {length:,} characters in all, every one in the log file]"


# Characters a terminal acts on instead of showing: C0 controls but tab, DEL, C1 controls
# (U+0080-U+009F, 8-bit CSI among them), and the bidirectional overrides and isolates that
# reorder what follows them (the "Trojan Source" characters, CVE-2021-42574).
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_KEEP_NEWLINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: "re.Match") -> str:
    c = ord(match.group())
    return "\\x%02x" % c if c < 0x100 else "\\u%04x" % c


def printable(text: str, keep_newlines: bool = False) -> str:
    """``text`` with every character a terminal would act on shown as an escape.

    ESC (so every ANSI/OSC sequence: colours, a window title, clear screen, cursor
    moves), carriage return, backspace, bell, other C0/C1 controls and the bidi
    controls become ``\\x1b``, ``\\x0d``, ``\\u202e`` ...; tabs stay, and newlines
    with ``keep_newlines``. What a worker prints reaches the console through this;
    its log file keeps the bytes whole.
    """
    if text.isascii() and text.isprintable():  # most lines: nothing a terminal acts on
        return text
    pattern = _UNSAFE_KEEP_NEWLINES if keep_newlines else _UNSAFE
    return pattern.sub(_escaped, text) if pattern.search(text) else text
