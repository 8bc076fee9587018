"""What podlaunch trusts of a run directory: only what proves itself.

A run directory is shared ground: a ``--run-dir`` another user made, a run copied with
``cp -r``, a file left there by someone else. So, as OpenSSH's ``StrictModes`` refuses a key
file others could have written, podlaunch reads back and acts on a run directory only when
it is the user's own:

- ``check_dir``: the directory is a real directory (no link), owned by this user and not
  writable by group or others. A new one is made 0700; an empty one of the user's own that
  is looser is made 0700 (``make_private``). Every file of it is opened through
  ``worker.contract.runfiles.opener``, which refuses a link, a file of another owner and a
  group- or world-writable file the same way.
- ``seal`` / ``unseal``: a record that says what to run or which processes to signal (the
  detached supervisor's journal) carries an HMAC-SHA256 (RFC 2104) over its content and the
  run directory's real path, keyed by a key of the user's own outside any run directory
  (``key``: ``$XDG_STATE_HOME/podlaunch/key``, default ``~/.local/state/podlaunch/key``, 0600
  in a 0700 folder). A record another user wrote, or one copied with its run directory
  (``cp -r``: another real path), does not verify and is never acted on.
- ``run_secret``: a detached run's processes carry a secret of the run (derived from that
  key, the run directory's real path and a nonce of the run) in their environment, which
  ``/proc/PID/environ`` shows to their owner alone; a process is the run's only if it shows
  it (``shows_run``): a recycled pid, a process of the user's that a record names, or a
  copied run's processes reach nothing.

Standard library only.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import pwd
import secrets
import stat

from launcher import proctl
from launcher.errors import Problem, SpecError

KEY_BYTES = 32
SECRET_VAR = "PODLAUNCH_RUN_SECRET"  # a detached run's processes' proof of the run
RUN_DIR_VAR = "PODLAUNCH_RUN_DIR"  # worker.contract.RUN_DIR (kept here: no worker import)
ARGV_VAR = "PODLAUNCH_SUPERVISOR_ARGV"  # a detached supervisor's arguments, never its argv


def user_name(uid: int) -> str:
    """The name of the user ``uid`` (``uid N`` where it has none)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def not_own(found: os.stat_result) -> str | None:
    """Why a file or folder with status ``found`` is not trusted as the user's own (another
    owner; writable by group or others), or None when it is."""
    mode = stat.S_IMODE(found.st_mode)
    if found.st_uid != os.geteuid():
        return (f"belongs to user {user_name(found.st_uid)}, not to you "
                f"({user_name(os.geteuid())}), mode {mode:04o}")
    if mode & 0o022:
        return f"is writable by {'group and others' if mode & 0o022 == 0o022 else 'group' if mode & 0o020 else 'others'} (mode {mode:04o})"
    return None


def check_dir(run_dir: str, flag: str = "RUN") -> None:
    """Refuse ``run_dir`` unless it is the user's own: a directory (not a link), this user's,
    writable by nobody else.

    Raises:
      SpecError: it is not (one sentence: its owner and mode, and what to do); a missing
        directory passes (the caller says what is missing).
    """
    try:
        found = os.lstat(run_dir)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise SpecError([Problem(flag, None, "", f"cannot read {run_dir} ({exc.strerror})")]) \
            from None
    if stat.S_ISLNK(found.st_mode):
        raise SpecError([Problem(flag, None, "", (
            f"{run_dir} is a symbolic link; podlaunch takes a run directory only as itself "
            f"(anyone who can change the link could aim it elsewhere): give "
            f"{os.path.realpath(run_dir)}"))])
    why = not_own(found)
    if why is None:
        return
    if found.st_uid != os.geteuid():
        what = (f"podlaunch reads back and acts on your own runs only (whoever owns it "
                f"could steer what it runs and signals): ask {user_name(found.st_uid)}, or "
                "choose a directory of your own")
    else:
        what = (f"others could plant files in it that podlaunch would act on: `chmod go-w "
                f"{run_dir}`, then run again")
    raise SpecError([Problem(flag, None, "", f"{run_dir} {why}; {what}")])


def make_private(run_dir: str, flag: str = "--run-dir") -> None:
    """An existing, empty ``run_dir`` to run in: refused unless the user's own
    (``check_dir``, group/other write aside), then made 0700 as a new one is.

    Raises:
      SpecError: it belongs to another user, or is a link.
    """
    try:
        found = os.lstat(run_dir)
    except OSError:  # missing, or under a file: the caller says what is wrong with the path
        return
    if not stat.S_ISLNK(found.st_mode) and found.st_uid == os.geteuid():
        os.chmod(run_dir, 0o700)
        return
    check_dir(run_dir, flag)


def state_dir() -> str:
    """The user's own podlaunch folder outside any run directory: ``$XDG_STATE_HOME/podlaunch``
    (default ``~/.local/state/podlaunch``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"),
                                                            ".local", "state")
    return os.path.join(base, "podlaunch")


def key(create: bool = False) -> bytes | None:
    """The user's own key (``KEY_BYTES`` random bytes) that seals records and derives run
    secrets: ``$XDG_STATE_HOME/podlaunch/key``. Made (0600, its folder 0700) when ``create``
    and missing; None when missing and not made.

    Raises:
      SpecError: it (or its folder) is a link, another user's, or open to others; or it cannot
        be made or read.
    """
    folder = state_dir()
    path = os.path.join(folder, "key")

    def refuse(why: str) -> SpecError:
        return SpecError([Problem("--detach", None, "", (
            f"the key that proves your detached runs ({path}) {why}"))])

    try:
        if create:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        found = os.lstat(folder)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise refuse(f"cannot be kept: {folder}: {exc.strerror}; set XDG_STATE_HOME to a "
                     "folder of your own") from None
    if stat.S_ISLNK(found.st_mode) or found.st_uid != os.geteuid() or found.st_mode & 0o077:
        raise refuse(f"is in a folder that is a link, not yours or open to others ({folder}, "
                     f"mode {stat.S_IMODE(found.st_mode):04o}): `chmod 700 {folder}`")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        if not create:
            return None
        made = secrets.token_bytes(KEY_BYTES)
        temporary = f"{path}.{os.getpid()}.{secrets.token_hex(4)}"
        try:  # written whole, then linked in: a launch beside this one never reads half a key
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(made)
            os.link(temporary, path)
            return made
        except FileExistsError:  # another launch made it just now
            return key(create=False)
        except OSError as exc:
            raise refuse(f"cannot be made ({exc.strerror})") from None
        finally:
            try:
                os.unlink(temporary)
            except OSError:
                pass
    except OSError as exc:
        why = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot be read ({exc.strerror})"
        raise refuse(f"{why}: remove it (a new one is made)") from None
    with os.fdopen(fd, "rb") as f:
        found = os.fstat(f.fileno())
        data = f.read(KEY_BYTES + 1)
    if found.st_uid != os.geteuid() or found.st_mode & 0o077 or len(data) != KEY_BYTES:
        raise refuse(f"is not yours alone or not a key (mode {stat.S_IMODE(found.st_mode):04o}, "
                     f"{len(data)} B): remove it (a new one is made; runs detached with "
                     "the old one can then not be taken back)")
    return data


def _mac(secret: bytes, run_dir: str, content: dict) -> str:
    body = json.dumps([os.path.realpath(run_dir), content], sort_keys=True)
    return hmac.new(secret, body.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()


def seal(run_dir: str, content: dict, secret: bytes) -> dict:
    """``content`` with ``"mac"``: HMAC-SHA256 (RFC 2104) keyed by ``secret`` (``key``) over the
    run directory's real path and the content (JSON, keys sorted)."""
    return {**{k: v for k, v in content.items() if k != "mac"},
            "mac": _mac(secret, run_dir, {k: v for k, v in content.items() if k != "mac"})}


def unseal(run_dir: str, data) -> str | None:
    """Why ``data`` (a record read from ``run_dir``) is not proven the user's own launcher's
    for this very directory, or None when its seal verifies."""
    if not isinstance(data, dict) or not isinstance(data.get("mac"), str):
        return "it carries no seal of your launcher"
    try:
        secret = key()
    except SpecError as exc:
        return str(exc.problems[0].message)
    if secret is None:
        return f"your key ({os.path.join(state_dir(), 'key')}) is not there to check it"
    content = {k: v for k, v in data.items() if k != "mac"}
    if not hmac.compare_digest(_mac(secret, run_dir, content), data["mac"]):
        return ("its seal does not verify: it was not written by your launcher for this "
                "directory (a copy of a run is another run; a file someone else wrote is "
                "nobody's)")
    return None


def run_secret(run_dir: str, nonce: str, secret: bytes) -> str:
    """The secret a run's processes carry (``SECRET_VAR``): HMAC-SHA256 of the run directory's
    real path and the run's ``nonce``, keyed by the user's ``secret``; hex."""
    return hmac.new(secret, f"run-secret\0{os.path.realpath(run_dir)}\0{nonce}".encode(
        "utf-8", "surrogateescape"), hashlib.sha256).hexdigest()


def shows_run(pid: int, run_secret_hex: str | None) -> bool:
    """Whether ``pid`` is this user's and its environment shows the run's secret
    (``SECRET_VAR``; derived from the run directory's real path, so it names the run too)."""
    if not run_secret_hex:
        return False
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.geteuid():
            return False
    except OSError:
        return False
    return f"{SECRET_VAR}={run_secret_hex}".encode() in proctl.environ(pid)


def carry_run_secret(run_dir: str, taken: dict | None) -> tuple:
    """A detached run's proof for its processes: the user's key (made if need be), the run's
    nonce (new, or ``taken``'s: the journal of the run taken back) and, in this supervisor's
    environment, which every process it starts inherits, the run's secret (``SECRET_VAR``).

    Returns:
      ``(key, nonce)``: what the run's journal is sealed with and keeps.

    Raises:
      SpecError: the user's key cannot be kept (``key``); nothing was started.
    """
    secret = key(create=True)
    nonce = str(taken.get("nonce") or "") if taken else secrets.token_hex(16)
    os.environ[SECRET_VAR] = run_secret(run_dir, nonce, secret)
    return secret, nonce


def refuse_live_processes(run_dir: str, name: str) -> None:
    """``--resume`` of a run whose processes still run on this machine (a detached run whose
    supervisor was killed) is refused, naming them: a second set of workers beside them would
    save the same checkpoints. Nothing is signalled.

    Raises:
      SpecError: some of this user's processes name ``run_dir`` as their run directory.
    """
    live = processes_of(run_dir)
    if live:
        named = "; ".join(f"pid {pid} ({proctl.cmdline(pid, 60)})" for pid in live[:4])
        raise SpecError([Problem("--resume", None, "", (
            f"the run's processes still run ({len(live)} of them: {named}), left by a "
            f"supervisor that was killed: `launch attach {name}` takes them back, or stop "
            f"them (kill {' '.join(map(str, live))}) and resume again"))])


def processes_of(run_dir: str) -> list:
    """The live processes of this user whose environment names ``run_dir`` as their run
    directory (its path or real path), whatever else they show: a run's workers and
    wrappers that outlived their supervisor. Nothing is signalled."""
    dirs = [f"{RUN_DIR_VAR}={d}".encode("utf-8", "surrogateescape")
            for d in {os.path.abspath(run_dir), os.path.realpath(run_dir)}]
    found = []
    for pid in proctl.pids():
        if pid == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != os.geteuid():
                continue
        except OSError:
            continue
        if proctl.state(pid) in (None, "Z"):
            continue
        items = proctl.environ(pid)
        if any(d in items for d in dirs):
            found.append(pid)
    return found
