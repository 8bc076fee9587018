"""The POSIX sh scripts the launcher feeds a host's shell on stdin (never as a command line:
values, secrets included, never show in the host's process list): entering the workdir,
writing files whole, the cluster's setup, the environment, then the command. Pure text,
every value ``shlex.quote``d; ``connection.run_script`` runs one.
"""

from __future__ import annotations

import os
import secrets
import shlex


def shell_script(workdir: str, setup: tuple, env: dict, argv: list, files: tuple = (),
                 written_mark: str | None = None, first: tuple = (),
                 setup_mark: str | None = None) -> str:
    """A POSIX sh script: enter ``workdir`` (created), write ``files`` (``(path, text,
    writer)``: ``file_lines``) and print the line ``written_mark`` once they are written,
    run ``setup`` (then print the line ``setup_mark``, if given: a failure after it is not the
    setup's), export ``env``, run each argv of ``first`` (the script ends with the exit status
    of one that fails), exec ``argv``.

    Fed to ``sh -s`` on stdin rather than as the SSH command line, so env
    values (secrets included) never show in the host's process list, and it
    works whatever the login shell is. Every value is ``shlex.quote``d;
    ``setup`` lines are shell by design and go in as written, with stdin from
    /dev/null: the script itself comes on stdin (and, for a worker, the channel stays
    open), so a setup command that reads stdin would otherwise eat the rest of the
    script, or wait for input that never comes. A ``workdir`` of
    ``~`` or ``~/...`` is the login home, as OpenSSH and scp read it
    (``remote_path``); preflight then reports the absolute path.
    """
    where = remote_path(workdir)
    lines = ["set -e", f"mkdir -p -- {where}", f"cd -- {where}"]
    for path, text, writer in files:
        lines += file_lines(path, text, writer)
    if written_mark is not None:  # on a line of its own, whatever came before it
        lines.append(f"printf '\\n%s\\n' {shlex.quote(written_mark)}")
    if setup:  # in this shell (what it exports stays), but never reading the script on stdin
        lines += ["{"] + list(setup) + ["} </dev/null"]
    if setup_mark is not None:
        lines.append(f"printf '\\n%s\\n' {shlex.quote(setup_mark)}")
    lines += [f"export {name}={shlex.quote(value)}" for name, value in env.items()]
    lines += [" ".join(shlex.quote(a) for a in command) for command in first]
    lines.append("exec " + " ".join(shlex.quote(a) for a in argv))
    return "\n".join(lines) + "\n"


def file_lines(path: str, text: str, writer: str) -> list:
    """Script lines that put ``text`` in the file ``path`` on the host, owner-only.

    Its directory is made (``mkdir -p`` under ``umask 077``: every directory made is
    0700), the text goes to ``<path>.<writer>.tmp`` (0600: a job file may hold the
    task's secrets), then is renamed over ``path``: a reader never sees half of it, and
    hosts that share the directory (an NFS home) never rename each other's temporary
    (``writer`` differs). The text travels in a quoted here-document of the script,
    which is fed on stdin: never in a command line, nothing in it expanded (bash, as
    ``sh``, keeps a here-document larger than a pipe's buffer in an owner-only temporary
    file of its own, removed at once). A file that already has these bytes is left as it
    is (hosts that share the directory, a restart: its readers keep their file); a path
    that is a directory is refused (``mv`` would put the file inside it). What a start
    writes on each host this way costs no SFTP round trip (docs/ssh.md, "The launcher's
    own cost per host").

    Raises:
      ValueError: ``text`` does not end with a newline (a here-document's last line does).
    """
    if not text.endswith("\n"):
        raise ValueError(f"{path}: the text must end with a newline")
    delimiter = "PODLAUNCH_EOF_" + secrets.token_hex(8)
    while delimiter in text.split("\n"):  # never, in practice: 64 random bits
        delimiter = "PODLAUNCH_EOF_" + secrets.token_hex(8)
    temporary = remote_path(f"{path}.{writer}.tmp")
    target = remote_path(path)
    return ["(umask 077", f"mkdir -p -- {remote_path(os.path.dirname(path) or '.')}",
            f"rm -f -- {temporary}",  # a leftover would keep its mode; a link is removed
            "set -C",  # noclobber: '>' makes the file (O_EXCL), never writes through a link
            f"cat > {temporary} <<'{delimiter}'", text + delimiter, ")",
            f"if [ -d {target} ]; then rm -f -- {temporary}; echo {target}: is a directory >&2; "
            "exit 1; fi",
            f"if cmp -s -- {temporary} {target}; then rm -f -- {temporary}; "
            f"else mv -f -- {temporary} {target}; fi"]


def remote_path(path: str) -> str:
    """``path`` quoted for the remote shell, a leading ``~`` or ``~/`` meaning ``$HOME``.

    Quoting ``~/x`` whole would name a directory literally called ``~``.
    """
    if path == "~" or path.startswith("~/"):
        rest = path[2:]
        return '"$HOME"' + (f"/{shlex.quote(rest)}" if rest else "")
    return shlex.quote(path)


def command_line(argv: list) -> str:
    """``argv`` as one quoted shell line (a script of one command)."""
    return " ".join(shlex.quote(a) for a in argv) + "\n"
