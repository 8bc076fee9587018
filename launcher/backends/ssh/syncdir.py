"""A directory synced to a host over SFTP, exactly and no more (``cluster.sync_dir``, a
program's ``program.dir``): what ``launcher.spec.syncrules.walk`` lists is copied, what an
earlier sync wrote and the source no longer has is removed, and a manifest in the target
(``MANIFEST``) says what the syncs wrote, so nothing else there is ever touched; an unchanged
source makes no request at all (``unchanged``).
"""

from __future__ import annotations

import json
import os
import shutil
import stat

import paramiko

from launcher.backends.ssh.transfer import mkdirs, new_file
from launcher.spec import syncrules
from launcher.words import plural


MANIFEST = syncrules.MANIFEST  # in the target directory: what the syncs wrote there


class SyncRefused(Exception):
    """A sync would write where it must not (over a file it did not write, through a
    symlink, into its own source); nothing of that host was changed by the refused step."""


def _parse_manifest(raw: bytes) -> dict | None:
    """The manifest's ``files`` and ``dirs``; None where ``raw`` is not one."""
    try:
        manifest = json.loads(raw.decode("utf-8"))
        return {"files": dict(manifest.get("files", {})), "dirs": dict(manifest.get("dirs", {}))}
    except (ValueError, AttributeError, TypeError):
        return None


def _read_manifest(sftp: paramiko.SFTPClient, remote_dir: str) -> tuple:
    """(the manifest's ``files`` and ``dirs``, its bytes); (None, None) where there is none
    (or it is unreadable)."""
    try:
        with sftp.open(f"{remote_dir}/{MANIFEST}", "rb") as f:
            raw = f.read()
    except OSError:
        return None, None
    manifest = _parse_manifest(raw)
    return (manifest, raw) if manifest is not None else (None, None)


def _source_and_above(local_dir: str):
    """The source directory (its real path), then each directory above it up to ``/``: the
    directories a target on a shared filesystem must not be."""
    here = os.path.realpath(local_dir)
    while True:
        yield here
        if here == os.path.dirname(here):
            return
        here = os.path.dirname(here)


def _may_be_here(raw: bytes, local_dir: str) -> bool:
    """Whether the manifest read on the host (``raw``) could be the very file of the source
    or of a directory above it, seen through a shared filesystem: one of those holds a
    manifest with the same bytes (read here, no request)."""
    for here in _source_and_above(local_dir):
        try:
            with open(os.path.join(here, MANIFEST), "rb") as f:
                if f.read(len(raw) + 1) == raw:
                    return True
        except OSError:
            pass
    return False


def _write_manifest(sftp: paramiko.SFTPClient, remote_dir: str, manifest: dict, writer: str) -> None:
    mkdirs(sftp, f"{remote_dir}/{os.path.dirname(MANIFEST)}")
    temporary = f"{remote_dir}/{MANIFEST}.{writer}.tmp"
    with new_file(sftp, temporary) as f:
        f.chmod(0o600)
        f.write(json.dumps(manifest, sort_keys=True).encode("utf-8"))
    sftp.posix_rename(temporary, f"{remote_dir}/{MANIFEST}")


def _lstat(sftp: paramiko.SFTPClient, path: str):
    try:
        return sftp.lstat(path)
    except OSError:
        return None


def _refuse_own_source(sftp: paramiko.SFTPClient, local_dir: str, remote_dir: str, writer: str) -> None:
    """Refuse a target that is the source itself or contains it (a filesystem shared with
    the host, e.g. an NFS home with ``workdir: ~``): a probe file made in the target must
    not appear in the source or in a directory above it."""
    name = f".podlaunch-sync-probe-{writer}"
    probe = f"{remote_dir}/{name}"
    with sftp.open(probe, "wb") as f:
        f.write(b"")
    try:
        for here in _source_and_above(local_dir):
            if os.path.exists(os.path.join(here, name)):
                raise SyncRefused(f"{remote_dir} on the host is {here} here (a shared "
                                  f"filesystem), which is or contains the source {local_dir}: "
                                  "the sync would write over its own source; give the host a "
                                  "workdir outside it")
    finally:
        try:
            sftp.remove(probe)
        except OSError:
            pass


def unchanged(seen: dict | None, local_dir: str, rules: syncrules.Rules = syncrules.Rules(),
              tree: tuple | None = None) -> bool:
    """Whether ``sync_dir`` of ``local_dir`` would change nothing on the host and write
    nothing, judged from what preflight read there (no SFTP request: a relaunch's sync of an
    unchanged directory then costs a host no SFTP session; docs/ssh.md).

    Args:
      seen: ``launcher.remote.preflight``'s ``synced`` answer (the host's manifest text and
        the lstat of each path it lists), or None.
      tree: ``syncrules.walk``'s ``(files, dirs)`` of ``local_dir`` (``walked``); None: walked here.

    Returns:
      True only where every local directory stands there as a directory, every local file
      is listed as this source's with its size and mtime and stands there with them, nothing
      this source wrote is gone here, and the manifest is not one the source or a directory
      above it holds (the own-source check must run: ``sync_dir``). Anything else, or any
      doubt: False, and ``sync_dir`` does the work.
    """
    if not seen or not isinstance(seen.get("manifest"), str):
        return False
    raw = seen["manifest"].encode("utf-8")
    manifest = _parse_manifest(raw)
    if manifest is None or _may_be_here(raw, local_dir):
        return False
    owned_files, owned_dirs = manifest["files"], manifest["dirs"]
    files, dirs = tree or syncrules.walk(local_dir, rules)[:2]
    source = os.path.realpath(local_dir)
    there = seen.get("lstat", {})
    if any(isinstance(e, dict) and e.get("source") == source and rel not in files
           for rel, e in owned_files.items()):
        return False
    if any(s == source and rel not in dirs for rel, s in owned_dirs.items()):
        return False
    if any(there.get(rel, [None])[0] != "d" for rel in dirs):
        return False
    return all(owned_files.get(rel) == {"source": source, "size": e.size, "mtime": e.mtime}
               and there.get(rel) == ["f", e.size, e.mtime] for rel, e in files.items())


def sync_dir(sftp: paramiko.SFTPClient, local_dir: str, remote_dir: str,
             rules: syncrules.Rules = syncrules.Rules(), writer: str = "sync",
             tree: tuple | None = None) -> int:
    """Mirror ``local_dir`` into ``remote_dir`` exactly, writing only what the sync owns.

    What is copied is ``syncrules.walk``'s list (skipped names, secrets and symlinks
    never). Files whose size or mtime differ are copied (to a temporary, then renamed,
    so a host sharing the directory never reads half a file), owner-only (mode &
    0700); files and directories an earlier sync of this source wrote and that are
    gone here, or changed in kind (a package ``helper/`` that became ``helper.py``),
    are removed. ``remote_dir/.podlaunch/synced.json`` (``MANIFEST``) records what
    the syncs wrote (rewritten only when this sync changed what it records); a remote
    file that it does not list is never overwritten (unless it already has the local
    size and mtime, then it is adopted as is), and nothing is written through a symlink.

    ``tree``: ``syncrules.walk``'s ``(files, dirs)`` of ``local_dir`` (``walked``); None:
    walked here.

    Returns:
      The number of files copied or removed (0 when nothing changed).

    Raises:
      SyncRefused: the target is the source (or inside it), checked before the first
        write, or at once where the host's manifest has the bytes of one in the source or
        a directory above it (a sync that would change nothing does not look otherwise), or
        a file or symlink that the sync did not write stands where it would write.
      OSError, paramiko.SSHException: SFTP failed.
    """
    files, dirs = tree or syncrules.walk(local_dir, rules)[:2]
    source = os.path.realpath(local_dir)
    probe = "not yet"  # then "passed", or "refused" (or failed): nothing more is written

    def before_writing() -> None:
        # the own-source check (3 requests and a walk here) runs before the first change, so
        # a relaunch that changes nothing costs 4 requests less; nothing is written unchecked
        nonlocal probe
        if probe == "not yet":
            probe = "refused"
            _refuse_own_source(sftp, local_dir, remote_dir, writer)
            probe = "passed"

    manifest, raw = _read_manifest(sftp, remote_dir)  # where it reads, remote_dir is a directory
    if manifest is None:
        mkdirs(sftp, remote_dir)
        before_writing()
        manifest = {"files": {}, "dirs": {}}
    elif _may_be_here(raw, local_dir):
        before_writing()  # the target may be the source: refused even if nothing would change
    as_read = json.loads(json.dumps(manifest))  # written back only if this sync changes it
    owned_files, owned_dirs = manifest["files"], manifest["dirs"]
    changed = 0
    # 1. what an earlier sync of this source wrote and the source no longer has (or has
    #    in another kind): files first, then directories deepest first
    for rel in sorted(owned_files):
        if owned_files[rel].get("source") == source and rel not in files:
            have = _lstat(sftp, f"{remote_dir}/{rel}")
            if have is not None and stat.S_ISREG(have.st_mode):
                before_writing()
                sftp.remove(f"{remote_dir}/{rel}")
                changed += 1
            del owned_files[rel]
    for rel in sorted(owned_dirs, key=lambda r: -r.count("/")):
        if owned_dirs[rel] == source and rel not in dirs:
            before_writing()
            cache = f"{remote_dir}/{rel}/__pycache__"  # Python's, made from the files we wrote
            try:
                for name in sftp.listdir(cache):
                    sftp.remove(f"{cache}/{name}")
                sftp.rmdir(cache)
            except OSError:
                pass
            try:
                sftp.rmdir(f"{remote_dir}/{rel}")  # only once empty: never what others put there
            except OSError:
                pass
            del owned_dirs[rel]
    # 2. directories, parents first
    for rel in sorted(dirs, key=lambda r: (r.count("/"), r)):
        target = f"{remote_dir}/{rel}"
        have = _lstat(sftp, target)
        if have is None:
            before_writing()
            sftp.mkdir(target, 0o700)
            owned_dirs[rel] = source
        elif not stat.S_ISDIR(have.st_mode):
            raise SyncRefused(f"{target} exists and is not a directory (podlaunch did not write "
                              "it); move it away or choose another workdir")
    # 3. files
    try:
        for rel, entry in sorted(files.items()):
            target = f"{remote_dir}/{rel}"
            have = _lstat(sftp, target)
            same = (have is not None and stat.S_ISREG(have.st_mode) and have.st_size == entry.size
                    and have.st_mtime == entry.mtime)
            if have is not None and not stat.S_ISREG(have.st_mode):
                raise SyncRefused(f"{target} exists and is not a regular file (a symlink or a "
                                  "directory podlaunch did not write); the sync never writes "
                                  "through it: move it away or choose another workdir")
            if have is not None and not same and rel not in owned_files:
                raise SyncRefused(f"{target} exists and podlaunch did not write it; the sync "
                                  f"never overwrites such a file: move it away, exclude {rel}, "
                                  "or choose another workdir")
            if same:
                owned_files[rel] = {"source": source, "size": entry.size, "mtime": entry.mtime}
                continue
            try:
                source_file = open(entry.path, "rb")
            except FileNotFoundError:  # gone since the listing (an editor's temporary file,
                continue               # another run's): nothing to copy, nothing owned anew
            owned_files[rel] = {"source": source, "size": entry.size, "mtime": entry.mtime}
            before_writing()
            temporary = f"{target}.{writer}.tmp"
            with source_file, new_file(sftp, temporary) as f:
                f.set_pipelined(True)
                shutil.copyfileobj(source_file, f, 32768)
            sftp.chmod(temporary, entry.mode & 0o700)
            sftp.utime(temporary, (entry.mtime, entry.mtime))
            sftp.posix_rename(temporary, target)
            changed += 1
    finally:
        # a relaunch that changed nothing costs no 6 more requests; a refused one writes none
        if manifest != as_read and probe != "refused":
            before_writing()
            _write_manifest(sftp, remote_dir, manifest, writer)
    return changed


def walked(syncs: list, avoid: tuple = ()) -> list:
    """Each ``(local_dir, its name as written, rules)`` of ``syncs`` with its ``tree``
    (``syncrules.walk``'s files and dirs): a start walks each directory once for all hosts.
    ``avoid``: the local run directory, never copied even where it lies inside a source
    (as the hosts' workdirs are not: ``syncrules``)."""
    return [(local, said, rules, syncrules.walk(local, rules, avoid)[:2])
            for local, said, rules in syncs]


def sync_all(host, syncs: list, writer: str, say) -> None:
    """Each of ``syncs`` (``walked``'s) into the host's workdir, in order, each said
    (``say``): where ``unchanged`` finds that what the host's preflight read
    (``host.synced``, used once: a later attempt's preflight reads again) needs no change,
    no SFTP session is opened; else ``sync_dir`` over the host's SFTP.

    Raises:
      What ``sync_dir`` raises.
    """
    seen, host.synced = host.synced, None
    for local, said, rules, tree in syncs:
        if unchanged(seen, local, rules, tree):
            copied = 0
        else:
            copied = sync_dir(host.connection.sftp(), local, host.workdir, rules, writer, tree)
            seen = None  # it may have written the manifest: the next sync reads it over SFTP
        say(f"{host.name}: synced {said} ({plural(copied, 'file')} changed)")
