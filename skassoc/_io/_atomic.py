"""Write a file whole or not at all: a temporary beside the target, renamed.

A reader of the target sees the old file or the complete new one, never part
of one; a crash leaves the old file as it was, and its temporary file is
removed by the next write of the same target. A symbolic link at the target
is replaced (its target is left alone); anything else that is not a regular
file is refused.
"""

import contextlib
import glob
import os
import secrets
import stat

try:  # POSIX: lets a writer tell a crashed writer's temporary file from a live one.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

__all__ = ["TEMPORARY_SUFFIX", "check_target", "write_atomically"]

TEMPORARY_SUFFIX = ".skassoc-tmp"
# How often a writer tries a new temporary name after another writer's
# clean-up took its file (see _locked_temporary).
_TEMPORARY_TRIES = 100


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
        If ``path`` exists and is neither a regular file nor a symbolic
        link (a directory, a FIFO, a device), which is never opened.
    """
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
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
            # Renamed while still locked: no clean-up can take it before.
            os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_path)
        raise


def _locked_temporary(path, what):
    """A new temporary file beside ``path``, open for writing and locked.

    A fresh name beside the target: os.replace is atomic only within one file
    system, and "x" mode never clobbers another writer's file. The lock is
    held until the file is renamed, so a writer that finds it free knows its
    owner has died. Between creating the file and locking it, another
    writer's clean-up may take it for such a file and delete it: the name
    then no longer leads to the locked file, and a new name is tried.
    """
    for _ in range(_TEMPORARY_TRIES):
        tmp_path = f"{path}.{secrets.token_hex(6)}{TEMPORARY_SUFFIX}"
        handle = open(tmp_path, "xb")
        if fcntl is None:
            return handle, tmp_path
        fcntl.flock(handle, fcntl.LOCK_EX)
        if _names_file(tmp_path, handle):
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

    A live writer holds a lock on its temporary file until it renames it
    (see :func:`_locked_temporary`), so a temporary file whose lock can be
    taken, and that its name still leads to, belongs to a dead process.
    Without ``fcntl`` (Windows) they are left for the user to delete.
    """
    if fcntl is None:
        return
    for stale in glob.glob(glob.escape(path) + ".*" + TEMPORARY_SUFFIX):
        with contextlib.suppress(OSError):
            with open(stale, "rb") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if _names_file(stale, handle):
                    os.unlink(stale)
