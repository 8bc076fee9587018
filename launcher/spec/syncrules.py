"""What a directory sync (``program.dir``, ``cluster.sync_dir``) may copy to the hosts.

Stdlib only: the launcher checks a sync's source before anything starts, and
``launcher.backends.ssh.syncdir.sync_dir`` copies exactly what ``walk`` lists.

* **Never copied** (``SKIP``): version control, caches, virtual environments, build
  output and podlaunch's own state (``.git``, ``__pycache__``, ``.venv``, ``runs``, ...),
  and whatever ``exclude`` names.
* **Refused before launch** (``check_source``): a source that is a home directory
  (``~``, any account's home, ``/``), or one holding files that look like secrets
  (``SECRET_NAMES``, ``SECRET_SUFFIXES``: ``.ssh/``, ``id_ed25519``, ``.aws/``,
  ``*.pem``, ...) that neither ``exclude`` nor ``include`` names. A secret is copied
  only when ``include`` names it explicitly.
* ``include`` also brings back what ``SKIP`` leaves out (``build``, say).
* **Never copied, whatever ``include`` says**: a directory that is a sync's target
  (it holds ``MANIFEST``: a host's workdir seen through a shared filesystem, when the
  workdirs lie inside ``program.dir``), a run directory of any launch (it holds
  ``launcher.rundir.runlock.LOCK_FILE``: an earlier run's job, lock, logs and checkpoints,
  wherever ``--run-dir`` put it) and the directories the launch names in ``avoid`` (its
  local run directory, before its lock is written): copied, each launch would carry every
  earlier run, or nest every host's copy one level deeper, in every host.

Patterns are ``fnmatch`` globs matched against a path relative to the source
(``data/*.csv``) and against each of its names (``*.log`` anywhere).
"""

from __future__ import annotations

import fnmatch
import os
import pwd
import stat
from typing import NamedTuple

from launcher.rundir.runlock import LOCK_FILE

SKIP = (".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "runs", ".podlaunch",
        ".pytest_cache", ".mypy_cache", ".ruff_cache", ".tox", ".nox", "node_modules", "build",
        "*.egg-info")
# Names (files or directories, at any depth) that hold keys or credentials.
SECRET_NAMES = (".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".netrc", ".pgpass",
                ".git-credentials", ".pypirc", ".npmrc", ".boto", "gcloud",
                "application_default_credentials.json", "id_rsa", "id_dsa", "id_ecdsa",
                "id_ed25519", "id_ecdsa_sk", "id_ed25519_sk", "credentials", "credentials.json", ".bash_history", ".python_history")
SECRET_SUFFIXES = (".pem", ".key", ".p12", ".pfx", ".jks", ".keystore", ".ppk", ".gpg",
                   ".asc", ".kdbx")


MANIFEST = ".podlaunch/synced.json"  # in a sync's target directory: what the syncs wrote there


class Rules(NamedTuple):
    """A sync's patterns: ``include`` (copied even if skipped or secret), ``exclude``."""

    include: tuple = ()
    exclude: tuple = ()


class Entry(NamedTuple):
    """One local file to copy: its path here, size (bytes), whole-second mtime, mode."""

    path: str
    size: int
    mtime: int
    mode: int


def _matches(patterns, rel: str) -> bool:
    names = rel.split("/")
    return any(fnmatch.fnmatchcase(rel, p) or any(fnmatch.fnmatchcase(n, p) for n in names)
               for p in patterns)


def _named(patterns, rel: str) -> bool:
    """Whether a pattern names ``rel`` or a directory above it (not just ``*``)."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(p not in ("*", "**", "*/*") and any(fnmatch.fnmatchcase(x, p) for x in prefixes)
               for p in patterns)


def is_secret_name(name: str) -> bool:
    """Whether a file or directory called ``name`` looks like it holds keys or credentials."""
    return name in SECRET_NAMES or name.endswith(SECRET_SUFFIXES)


def homes() -> set:
    """Every account's home directory here, this user's ``~`` and ``/``, as real paths."""
    found = {os.path.realpath(os.path.expanduser("~")), "/"}
    try:
        found |= {os.path.realpath(p.pw_dir) for p in pwd.getpwall() if p.pw_dir not in ("", "/")}
    except OSError:
        pass
    return found


def walk(source: str, rules: Rules, avoid: tuple = ()) -> tuple[dict, set, list]:
    """What a sync of ``source`` copies.

    Args:
      source: the directory synced.
      rules: its include and exclude patterns.
      avoid: directories never copied (the local run directory), wherever they lie.

    Returns:
      ``(files, dirs, secrets)``: ``files`` maps a relative path (``/``-separated) to its
      ``Entry``; ``dirs`` the relative directories made for them; ``secrets`` the relative
      paths that look like secrets and are left out (neither included nor excluded:
      ``check_source`` refuses the sync while there are any). Symlinks are never followed
      or copied.
    """
    files: dict = {}
    dirs: set = set()
    secrets: list = []
    avoided = set()
    for path in avoid:
        try:
            st = os.stat(path)
            avoided.add((st.st_dev, st.st_ino))
        except OSError:
            pass

    def is_output(entry: os.DirEntry) -> bool:
        """A sync's target, a run directory or a directory to avoid: a launch's output, never
        its input."""
        if any(os.path.lexists(os.path.join(entry.path, marker)) for marker in (MANIFEST, LOCK_FILE)):
            return True
        st = entry.stat(follow_symlinks=False)
        return (st.st_dev, st.st_ino) in avoided

    def visit(path: str, rel: str) -> None:
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            sub = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_symlink():
                continue
            included = _named(rules.include, sub)
            if _matches(rules.exclude, sub) and not included:
                continue
            if is_secret_name(entry.name) and not included:
                secrets.append(sub + ("/" if entry.is_dir(follow_symlinks=False) else ""))
                continue
            if _matches(SKIP, sub) and not included:
                continue
            if entry.is_dir(follow_symlinks=False):
                if is_output(entry):
                    continue
                dirs.add(sub)
                visit(entry.path, sub)
            elif entry.is_file(follow_symlinks=False):
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:  # gone since the listing (an editor's temporary file)
                    continue
                files[sub] = Entry(entry.path, st.st_size, int(st.st_mtime), stat.S_IMODE(st.st_mode))

    visit(source, "")
    return files, dirs, secrets


def check_source(source: str, rules: Rules) -> str | None:
    """Why a sync of ``source`` must not start (one sentence with what to do), or None.

    A home directory is never synced (it holds keys, shell start-up files and
    credentials that the hosts must not get, and ``workdir: ~`` would overwrite the
    hosts' own); secrets inside the source are refused unless ``exclude`` or
    ``include`` names them.
    """
    real = os.path.realpath(source)
    if real in homes():
        return (f"{source} is a home directory: syncing it would copy its keys, credentials "
                "and shell files to every host; put the program in a directory of its own")
    _, _, secrets = walk(source, rules)
    if secrets:
        shown = ", ".join(secrets[:5]) + (f" and {len(secrets) - 5} more" if len(secrets) > 5 else "")
        return (f"{source} holds what looks like keys or credentials ({shown}), which the sync "
                "would copy to every host; move them out, list them under exclude, or name "
                "them under include to copy them on purpose")
    return None
