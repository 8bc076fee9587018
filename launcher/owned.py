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
from worker.contract import runfiles

KEY_BYTES = 32
SECRET_VAR = "PODLAUNCH_RUN_SECRET"  # a detached run's processes' proof of the run
RUN_DIR_VAR = "PODLAUNCH_RUN_DIR"  # worker.contract.RUN_DIR (kept here: no worker import)
ARGV_VAR = "PODLAUNCH_SUPERVISOR_ARGV"  # a detached supervisor's arguments, never its argv
PROOF_FILE = "secret.sha256"  # a detached run's secret's digest: proves its processes keyless


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


def real_path(path: str) -> str:
    """``path`` as the run is known everywhere: absolute, every link above it resolved (a run
    reached through a linked folder is the same run), the last name kept as it is (a link
    there is refused by ``check_dir``, not followed)."""
    path = os.path.abspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


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


def state_folder(create: bool = False, flag: str = "--detach", folder: str | None = None,
                 holds: str = "your key and index of runs") -> str | None:
    """The user's podlaunch folder (``state_dir``, or ``folder``: another of podlaunch's own
    that ``holds`` what is said), checked as a run directory is: a real directory (no link),
    the user's own, open to nobody else. Made 0700 when ``create`` and missing; None when
    missing and not made, or when it cannot be made (a read-only home).

    Raises:
      SpecError: it is a link, not a directory, another user's or open to others (one
        sentence: what was found, and what to do; said under ``flag``).
    """
    folder = folder or state_dir()
    try:
        if create:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        found = os.lstat(folder)
    except OSError:
        return None
    mode = stat.S_IMODE(found.st_mode)
    what = (f"is a link (to {os.path.realpath(folder)})" if stat.S_ISLNK(found.st_mode)
            else "is not a directory" if not stat.S_ISDIR(found.st_mode)
            else not_own(found) or (f"is open to others (mode {mode:04o})" if mode & 0o077 else None))
    if what is not None:
        raise SpecError([Problem(flag, None, "", (
            f"your podlaunch folder {folder} ({holds}) {what}; podlaunch keeps them only in a "
            f"folder of your own that nobody else can open: remove it if it is a link or not "
            f"yours, `chmod 700 {folder}` if it is, or set XDG_STATE_HOME to a folder of your "
            "own"))])
    return folder


def open_state_file(path: str, flags: int, flag: str = "--detach") -> int:
    """A file of the user's podlaunch folder, opened as a run directory's are: never through a
    link, never a FIFO or a device (opened without waiting, then refused), only the user's own
    and writable by nobody else; made 0600.

    Raises:
      SpecError: it is any of those (one sentence, said under ``flag``).
      OSError: it cannot be opened otherwise (FileNotFoundError: it is not there).
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
        found = os.fstat(fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENXIO):  # ENXIO: a FIFO nobody reads
            raise
        fd, found = None, os.lstat(path)
    why = ("is a symbolic link" if stat.S_ISLNK(found.st_mode)
           else "is not a regular file (a FIFO or a device)" if not stat.S_ISREG(found.st_mode)
           else not_own(found))
    if why is None:
        os.set_blocking(fd, True)
        return fd
    if fd is not None:
        os.close(fd)
    raise SpecError([Problem(flag, None, "", (
        f"{path}, in your podlaunch folder, {why}; podlaunch reads and writes only regular files of your own there: remove it "
        "(it is made again)"))])


def key(create: bool = False) -> bytes | None:
    """The user's own key (``KEY_BYTES`` random bytes) that seals records and derives run
    secrets: ``$XDG_STATE_HOME/podlaunch/key``. Made (0600, its folder 0700: ``state_folder``)
    when ``create`` and missing; None when missing and not made.

    Raises:
      SpecError: it (or its folder) is a link, another user's, open to others, not a regular
        file; or it cannot be made or read.
    """
    folder = state_folder(create)
    path = os.path.join(state_dir(), "key")

    def refuse(why: str) -> SpecError:
        return SpecError([Problem("--detach", None, "", (
            f"the key that proves your detached runs ({path}) {why}"))])

    if folder is None:
        if create:
            raise refuse(f"cannot be kept: {state_dir()} cannot be made; set XDG_STATE_HOME to "
                         "a folder of your own")
        return None
    try:
        fd = open_state_file(path, os.O_RDONLY)
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
        raise refuse(f"cannot be read ({exc.strerror}): remove it (a new one is made)") from None
    with os.fdopen(fd, "rb") as f:
        found = os.fstat(f.fileno())
        data = f.read(KEY_BYTES + 1)
    if found.st_mode & 0o077 or len(data) != KEY_BYTES:
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
    try:  # what proves the run's processes without the key (``proven``): its digest alone
        runfiles.write_whole(os.path.join(run_dir, PROOF_FILE), _digest(os.environ[SECRET_VAR]) + "\n")
    except OSError:
        pass  # then a stop without the key finds none proven, and says so
    return secret, nonce


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()


def proven(run_dir: str) -> tuple:
    """``(proven, unproven)``: this user's live processes that name ``run_dir`` as their run
    directory (``processes_of``) and show the run's secret, with the wrappers above them that
    show it too; and those that name it without showing it. The secret is checked against its
    SHA-256 digest kept in the run directory (``PROOF_FILE``, the user's own file in the user's
    own directory): no key and no spec needed, nothing of the secret on disk. A copy of the
    run directory names other processes: it proves none. Nothing is signalled."""
    try:
        digest = runfiles.read_regular(os.path.join(run_dir, PROOF_FILE), 128).strip()
    except OSError:
        digest = ""
    prefix = f"{SECRET_VAR}=".encode()
    showing = set()
    for pid in proctl.pids() if len(digest) == 64 else ():
        shown = [item[len(prefix):] for item in proctl.environ(pid) if item.startswith(prefix)]
        if any(hmac.compare_digest(_digest(os.fsdecode(v)), digest) for v in shown) \
                and pid != os.getpid() and proctl.state(pid) not in (None, "Z"):
            showing.add(pid)  # environ is readable by its owner alone: the user's own
    named = processes_of(run_dir)
    found = [p for p in named if p in showing]
    above = {(proctl.stat_fields(p) or (b"", 0, 0))[1] for p in found}
    return found + sorted(showing & above - set(found)), [p for p in named if p not in showing]


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
    directory by any path (its real path the same: a run started through a linked folder,
    asked for by its real path), whatever else they show: a run's workers and wrappers that
    outlived their supervisor. Nothing is signalled."""
    real = os.path.realpath(run_dir)
    prefix = f"{RUN_DIR_VAR}=".encode()
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
        named = [item[len(prefix):] for item in proctl.environ(pid) if item.startswith(prefix)]
        if any(os.path.realpath(os.fsdecode(d)) == real for d in named):
            found.append(pid)
    return found
