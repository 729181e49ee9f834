"""The zip container of a model file: written whole, read back within bounds.

Reading trusts nothing the archive says: it must start at the file's first
byte and end at its last, hold exactly the known members, and each member
is read no further than the size it may have.
"""

import json
import os
import stat
import struct
import zipfile
import zlib
from typing import NamedTuple

from ._atomic import write_atomically
from ._format import (
    LEGACY_WEIGHTS_MEMBER,
    METADATA_MEMBER,
    TRAINING_STATE_MEMBER,
    WEIGHTS_MEMBER,
    InvalidModelFile,
)
from ._limits import MAX_METADATA_BYTES, MAX_METADATA_RATIO

__all__ = ["Archive", "write_archive", "read_archive"]

# End of central directory record of a zip without comment: 22 bytes.
_END_RECORD = struct.Struct("<4s4H2LH")


class Archive(NamedTuple):
    """The members of a model file, as :func:`read_archive` reads them.

    Attributes
    ----------
    metadata : dict
        ``metadata.json``, parsed (not yet checked).
    weights_member : str
        The name of the weights member (format 3's, or the legacy one).
    weights : bytes
    training_state : bytes or None
        ``training_state.safetensors``, None without it.
    """

    metadata: dict
    weights_member: str
    weights: bytes
    training_state: bytes | None = None


def write_archive(path, metadata, weights, training_state=None):
    """Write a model file of ``metadata`` and ``weights`` (bytes) atomically.

    Parameters
    ----------
    path : str
        Where to write it; see :func:`~skassoc._io._atomic.write_atomically`.
    metadata : bytes
        The content of ``metadata.json``.
    weights : bytes
        The content of ``weights.safetensors``.
    training_state : bytes, optional
        The content of ``training_state.safetensors``; without it, the file
        has no such member.

    Raises
    ------
    ValueError
        If ``metadata`` is beyond what :func:`read_archive` reads back;
        nothing is written then.
    """
    compressed = _deflate(metadata)
    if len(metadata) > _metadata_limit(len(compressed)):
        raise ValueError(
            f"Cannot save: its {METADATA_MEMBER} would take {len(metadata)} bytes "
            f"({len(compressed)} deflated), beyond what load reads back "
            f"({MAX_METADATA_BYTES} bytes at most, {MAX_METADATA_RATIO} times "
            "its deflated size beyond 64 KiB). Pickle the estimator instead "
            "(trusted files only)."
        )

    def write(handle):
        with zipfile.ZipFile(handle, "w") as archive:
            archive.writestr(
                METADATA_MEMBER, metadata, compress_type=zipfile.ZIP_DEFLATED
            )
            # Stored, not deflated: float weights barely compress, stored
            # members read back at disk speed, and load can require it (no
            # decompression bomb can hide there).
            archive.writestr(WEIGHTS_MEMBER, weights, compress_type=zipfile.ZIP_STORED)
            if training_state is not None:
                archive.writestr(
                    TRAINING_STATE_MEMBER,
                    training_state,
                    compress_type=zipfile.ZIP_STORED,
                )

    write_atomically(path, write, "model files")


def _metadata_limit(compressed_size):
    """The most bytes a metadata member of ``compressed_size`` may inflate to."""
    return min(MAX_METADATA_BYTES, MAX_METADATA_RATIO * compressed_size + 2**16)


def _deflate(data):
    """``data`` deflated as zipfile's ZIP_DEFLATED writes it."""
    compressor = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush()


def _open_regular(path):
    """``path`` open for binary reading; InvalidModelFile if not a regular file.

    The type is checked on the open descriptor, not the name, so that nothing
    swapped in between the check and the open is read; the open does not
    block, for a FIFO's would wait for a writer. Symbolic links are followed.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except (FileNotFoundError, PermissionError):
        if os.path.isdir(path):  # Windows cannot open a folder
            raise InvalidModelFile("it is not a regular file.") from None
        raise
    except OSError as exc:
        raise InvalidModelFile(f"cannot read it: {exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidModelFile("it is not a regular file.")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_archive(path):
    """The members of the model file at ``path``, as an :class:`Archive`."""
    with _open_regular(path) as handle:
        try:
            _check_zip_bounds(handle)
        except (FileNotFoundError, PermissionError):
            raise
        except OSError as exc:
            # Files of /proc and the like say they are regular but cannot
            # seek from their end.
            raise InvalidModelFile(
                f"it cannot be read as a file of known size: {exc}"
            ) from None
        try:
            with zipfile.ZipFile(handle) as archive:
                weights_member = _weights_member(archive)
                raw_metadata = _read_member(archive, METADATA_MEMBER)
                weights = _read_member(archive, weights_member)
                training_state = None
                if TRAINING_STATE_MEMBER in archive.namelist():
                    training_state = _read_member(archive, TRAINING_STATE_MEMBER)
        except InvalidModelFile:
            raise
        except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError) as exc:
            raise InvalidModelFile(
                f"it is not a complete zip archive (truncated or corrupted): {exc}"
            ) from None
        except (NotImplementedError, RuntimeError, ValueError, OSError) as exc:
            # Unsupported compression or encrypted members: not written by us.
            raise InvalidModelFile(f"unreadable zip archive: {exc}") from None
    try:
        metadata = json.loads(raw_metadata.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError and UnicodeDecodeError; deep
        # nesting in a crafted file raises RecursionError.
        raise InvalidModelFile(f"{METADATA_MEMBER} is not valid JSON: {exc}") from None
    if not isinstance(metadata, dict):
        raise InvalidModelFile(f"{METADATA_MEMBER} is not a JSON object.")
    return Archive(metadata, weights_member, weights, training_state)


def _check_zip_bounds(handle):
    """The archive must start at the file's first byte and end at its last.

    A zip reader finds its directory from the end, so bytes before the
    archive (a pickle, say: a polyglot file) or after it would go unseen.
    """
    size = handle.seek(0, os.SEEK_END)
    handle.seek(0)
    head = handle.read(4)
    if head != b"PK\x03\x04":
        raise InvalidModelFile("it does not start with a zip archive.")
    if size < _END_RECORD.size:
        raise InvalidModelFile("it is too short to be a zip archive.")
    handle.seek(size - _END_RECORD.size)
    record = _END_RECORD.unpack(handle.read(_END_RECORD.size))
    signature, comment_length = record[0], record[-1]
    if signature != b"PK\x05\x06" or comment_length != 0:
        raise InvalidModelFile(
            "it does not end with the zip archive's directory (data appended, "
            "or an archive comment)."
        )
    handle.seek(0)


def _weights_member(archive):
    """The name of the weights member, after checks of the archive's members."""
    names = archive.namelist()
    allowed = {
        METADATA_MEMBER,
        WEIGHTS_MEMBER,
        LEGACY_WEIGHTS_MEMBER,
        TRAINING_STATE_MEMBER,
    }
    unknown = sorted(set(names) - allowed)
    if unknown:
        raise InvalidModelFile(f"the archive holds unknown members {unknown[:3]}.")
    for name in set(names):
        if names.count(name) > 1:
            raise InvalidModelFile(f"the archive holds {name} twice.")
    if METADATA_MEMBER not in names:
        raise InvalidModelFile(f"the archive has no {METADATA_MEMBER}.")
    weights = [
        name for name in names if name not in (METADATA_MEMBER, TRAINING_STATE_MEMBER)
    ]
    if len(weights) != 1:
        raise InvalidModelFile(
            f"the archive has no {WEIGHTS_MEMBER}"
            if not weights
            else f"the archive holds both {weights[0]} and {weights[1]}."
        )
    return weights[0]


def _read_member(archive, member):
    """One member's bytes, after checks of its place and sizes."""
    info = archive.getinfo(member)
    if info.header_offset < 0 or info.flag_bits & 0x1:
        raise InvalidModelFile(f"{member} is encrypted or misplaced.")
    if member != METADATA_MEMBER:
        if info.compress_type != zipfile.ZIP_STORED:
            raise InvalidModelFile(f"{member} is compressed; it is always stored.")
        limit = info.compress_size
    else:
        limit = _metadata_limit(info.compress_size)
    if info.file_size > limit:
        raise InvalidModelFile(
            f"{member} declares {info.file_size} bytes, more than the "
            f"{limit} it may hold."
        )
    # read() checks each member's CRC-32; the bound keeps a member that lies
    # about its size from inflating further.
    with archive.open(info) as stream:
        data = stream.read(limit + 1)
    if len(data) > limit:
        raise InvalidModelFile(f"{member} inflates beyond {limit} bytes.")
    return data
