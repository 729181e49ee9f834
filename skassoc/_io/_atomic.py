"""Write a file whole or not at all: a temporary beside the target, renamed.

A reader of the target sees the old file or the complete new one, never part
of one; a crash leaves the old file as it was, and its temporary file is
removed by the next write of the same target. A regular file that is
replaced keeps its permission bits (a private file stays private); a new
file gets the default ones of the process (its umask). A symbolic link at
the target is replaced (its target is left alone); anything else that is not
a regular file is refused.
"""

import contextlib
import hashlib
import os
import re
import secrets
import stat

try:  # POSIX: lets a writer tell a crashed writer's temporary file from a live one.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

__all__ = ["TEMPORARY_SUFFIX", "check_target", "write_atomically"]

TEMPORARY_SUFFIX = ".skassoc-tmp"
# The temporary files of a target whose name is too long to take the
# suffixes: named after a hash of that name, with their own suffix so that
# no other target's temporary file can have their name.
HASHED_TEMPORARY_SUFFIX = ".skassoc-tmp-h"
# The random part of a temporary name: 6 bytes, as 12 hexadecimal digits.
_TOKEN_BYTES = 6
# How often a writer tries a new temporary name after another writer's
# clean-up took its file (see _locked_temporary).
_TEMPORARY_TRIES = 100
# Most file systems' limit on one name, where os.pathconf cannot tell.
_DEFAULT_NAME_MAX = 255


def check_target(path, what):
    """Refuse a target that cannot be replaced by a regular file.

    Parameters
    ----------
    path : str
        The file to write.
    what : str
        What is written, for the messages (``"model files"``).

    Raises
    ------
    FileNotFoundError
        If the folder of ``path`` does not exist.
    ValueError
        If ``path`` is empty or ends with a path separator (it names no
        file), or exists and is neither a regular file nor a symbolic
        link (a directory, a FIFO, a device), which is never opened.
    """
    if not path:
        raise ValueError("The path is empty; give the name of the file to write.")
    if path.endswith(tuple(sep for sep in (os.sep, os.altsep) if sep)):
        raise ValueError(
            f"{path!r} ends with a path separator, so it names a folder; {what} "
            "are written to a file: give a file name."
        )
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(
            f"Cannot write {path!r}: its folder {folder!r} does not exist."
        )
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise ValueError(
            f"{path!r} exists and is not a regular file (a directory, FIFO or "
            f"device); {what} are written only over regular files. Choose "
            "another path."
        )


def write_atomically(path, write, what):
    """Write a file through ``write``, then rename it over ``path``.

    Parameters
    ----------
    path : str
        The file to write.
    write : callable
        Called with the temporary file, open for writing in binary mode.
    what : str
        What is written, for the messages (``"model files"``).

    Raises
    ------
    FileNotFoundError, ValueError
        As :func:`check_target`; nothing is written then.
    """
    check_target(path, what)
    _remove_stale_temporaries(path)
    handle, tmp_path = _locked_temporary(path, what)
    try:
        with handle:
            # Before a byte is written: the data of a private file is never
            # in a file that others may read.
            _keep_permissions(path, handle)
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
            # Renamed while still locked: no clean-up can take it before.
            os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_path)
        raise


def _keep_permissions(path, handle):
    """Give the new file the permission bits of the regular file it replaces.

    Without this the replacement has the process's default bits, and a file
    its owner had made private (0600) would become readable by others.
    """
    try:
        replaced = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(replaced.st_mode):
        # Set-user-ID and the like are not for a file this process wrote.
        mode = stat.S_IMODE(replaced.st_mode) & 0o777
        if hasattr(os, "fchmod"):
            os.fchmod(handle.fileno(), mode)
        else:  # pragma: no cover - Windows
            os.chmod(handle.name, mode)


def _temporary_naming(path):
    """The folder, stem and suffix of ``path``'s temporary files.

    A temporary file is named ``<stem>.<12 hexadecimal digits><suffix>``
    beside the target. The stem is the target's own name, unless that name
    with the 25 characters added would be longer than the file system
    allows: the stem is then a hash of the name, with its own suffix.
    """
    folder, name = os.path.split(path)
    added = 1 + 2 * _TOKEN_BYTES + len(TEMPORARY_SUFFIX)
    try:
        name_max = os.pathconf(folder or os.curdir, "PC_NAME_MAX")
    except (AttributeError, OSError, ValueError):  # Windows, or no limit known
        name_max = _DEFAULT_NAME_MAX
    if len(os.fsencode(name)) + added <= name_max:
        return folder, name, TEMPORARY_SUFFIX
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:32]
    return folder, digest, HASHED_TEMPORARY_SUFFIX


def _locked_temporary(path, what):
    """A new temporary file beside ``path``, open for writing and locked.

    A fresh name beside the target: os.replace is atomic only within one file
    system, and "x" mode never clobbers another writer's file. The lock is
    held until the file is renamed, so a writer that finds it free knows its
    owner has died. Between creating the file and locking it, another
    writer's clean-up may take it for such a file and delete it: the name
    then no longer leads to the locked file, and a new name is tried.
    """
    folder, stem, suffix = _temporary_naming(path)
    for _ in range(_TEMPORARY_TRIES):
        token = secrets.token_hex(_TOKEN_BYTES)
        tmp_path = os.path.join(folder, f"{stem}.{token}{suffix}")
        handle = open(tmp_path, "xb")
        if fcntl is None:
            return handle, tmp_path
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            named = _names_file(tmp_path, handle)
        except BaseException:
            # No lock (NFS without one, say): leave no temporary file behind.
            handle.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_path)
            raise
        if named:
            return handle, tmp_path
        handle.close()
    raise OSError(
        f"Could not keep a temporary file beside {path!r}: other writers of "
        f"{what} kept deleting it."
    )


def _names_file(path, handle):
    """Whether ``path`` is still a name of the open file ``handle``."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(handle.fileno())
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _remove_stale_temporaries(path):
    """Delete the temporary files of earlier writes of ``path`` that crashed.

    Only names of exactly the form that :func:`_locked_temporary` gives
    ``path``'s temporary files are considered: another target's (``m.x``'s
    for target ``m``) or a user's file of a similar name is never touched.
    A live writer holds a lock on its temporary file until it renames it,
    so a temporary file whose lock can be taken, and that its name still
    leads to, belongs to a dead process. Without ``fcntl`` (Windows) they
    are left for the user to delete.
    """
    if fcntl is None:
        return
    folder, stem, suffix = _temporary_naming(path)
    pattern = re.compile(
        re.escape(stem) + rf"\.[0-9a-f]{{{2 * _TOKEN_BYTES}}}" + re.escape(suffix)
    )
    try:
        names = os.listdir(folder or os.curdir)
    except OSError:
        return
    for name in names:
        if pattern.fullmatch(name):
            with contextlib.suppress(OSError):
                _remove_if_unlocked(os.path.join(folder, name))


def _remove_if_unlocked(stale):
    """Delete the regular file ``stale`` unless a live writer holds its lock."""
    if not stat.S_ISREG(os.lstat(stale).st_mode):
        return  # a FIFO of that name would block the open below
    # Not following a link, nor waiting for a FIFO put there meanwhile.
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    with open(os.open(stale, flags), "rb") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if _names_file(stale, handle):
            os.unlink(stale)
