"""Model files of formats 1 and 2: read without unpickling, converted once.

Those files stored the network's weights with :func:`torch.save`: a zip
archive whose ``data.pkl`` is a pickle of a dict of tensors, the tensors'
bytes in members ``data/<key>``. Unpickling runs whatever the pickle names,
so this reader never unpickles: it walks the opcodes with
:func:`pickletools.genops`, which decodes them and executes nothing, and
follows only the few opcodes and the four globals that ``torch.save``
writes for a plain dict of contiguous float32 and int64 tensors. Anything
else (another global, a view with an offset or strides, a storage shared by
two tensors, a member that is compressed or of the wrong size) is refused.
Each tensor's shape must be one of the network's before anything is
computed from it (a shape of many huge numbers would make even its product
slow); :func:`read_records` returns what each tensor claims to be, so that
the caller can match it against the network before :func:`read_tensors`
reads a byte of its data; :func:`convert_model_file` does so, and writes
the file again in today's format.
"""

import hashlib
import io
import math
import pickletools
import zipfile
from dataclasses import dataclass

import safetensors.torch
import torch

from .._params import NEVER_FROM_FILE
from .._prior import uniform_prior
from .._utils import is_integer
from .._version import __version__
from ._archive import read_archive, write_archive
from ._format import FORMAT_VERSION, LEGACY_WEIGHTS_MEMBER, InvalidModelFile
from ._limits import MAX_FEATURES
from ._metadata import (
    check_checksum,
    check_format,
    decode_classes,
    decode_spec,
    field,
    metadata_bytes,
)
from ._model_file import as_path, decode_file
from ._weights import check_weights_fit, expected_weights, shortened

__all__ = [
    "convert_model_file",
    "LegacyWeightsError",
    "TensorRecord",
    "read_records",
    "read_tensors",
]

#: Bounds the pickle of a state dict, which lists each tensor's storage
#: key and shape; a built-in network's fits well within it.
MAX_PICKLE_BYTES = 2**20
MAX_MEMBERS = 4096
# Built-in networks' tensors have at most 4 dimensions (convolution
# kernels), none longer than the widest input (n_features).
MAX_DIMENSIONS = 8
MAX_DIMENSION_SIZE = MAX_FEATURES
# What torch.save calls its globals, and the storage types it may name.
_DICT_CLASS = ("collections", "OrderedDict")
_REBUILD_TENSOR = ("torch._utils", "_rebuild_tensor_v2")
STORAGE_DTYPES = {
    ("torch", "FloatStorage"): torch.float32,
    ("torch", "LongStorage"): torch.int64,
}
# Members beside data.pkl and data/<key> that torch.save writes (by version).
_BOOKKEEPING = {
    "version",
    "byteorder",
    ".format_version",
    ".storage_alignment",
    ".data/version",
    ".data/serialization_id",
}
# Opcodes that only push a value decoded by genops, or store one in the memo.
_PUSH = {
    "BINUNICODE",
    "SHORT_BINUNICODE",
    "BININT",
    "BININT1",
    "BININT2",
    "LONG1",
}
_MEMO_PUT = {"BINPUT", "LONG_BINPUT"}
_MEMO_GET = {"BINGET", "LONG_BINGET"}


class LegacyWeightsError(Exception):
    """Why the weights of an old model file cannot be read safely."""


@dataclass(frozen=True)
class TensorRecord:
    """One tensor of the pickle: where its bytes are and what they must hold."""

    member: str
    dtype: torch.dtype
    shape: tuple


@dataclass(frozen=True)
class _Storage:
    key: str
    dtype: torch.dtype
    numel: int


@dataclass(frozen=True)
class _Global:
    name: tuple


_EMPTY_HOOKS = object()  # torch.save's empty OrderedDict of backward hooks


# ------------------------------------------------------------- converting


def convert_model_file(source, destination):
    """Convert a model file of format 1 or 2 to today's format, without pickle.

    Files of formats 1 and 2, written by earlier versions of skassoc,
    stored the network's weights with :func:`torch.save`, whose reader
    unpickles; :meth:`~skassoc.SemiSupervisedAssociationClassifier.load`
    refuses them. This reads their weights without unpickling: the pickle's
    opcodes are decoded, never executed, and only a plain dict of
    contiguous float32 and int64 tensors is accepted, each tensor matched
    against the network the file describes before its bytes are read. The
    converted file is checked as ``load`` checks it before it is written;
    ``compile`` and ``device``, which ``load`` never takes from a file, are
    left out of it.

    Parameters
    ----------
    source : str, bytes or os.PathLike
        A model file of format 1 or 2.
    destination : str, bytes or os.PathLike
        Where to write the converted file (``source`` itself replaces it).

    Raises
    ------
    ValueError
        If ``source`` is not a valid model file of format 1 or 2 (already
        converted, tampered with), or its parameters are beyond today's
        limits of model files.

    See Also
    --------
    SemiSupervisedAssociationClassifier.load : Load the converted file.

    Notes
    -----
    Read more in the :ref:`User Guide <user_guide_persistence>`.
    """
    source, destination = as_path(source), as_path(destination)
    try:
        archive = read_archive(source)
        metadata, legacy = archive.metadata, archive.weights
        version = check_format(
            metadata,
            source,
            archive.weights_member,
            has_training_state=archive.training_state is not None,
        )
        if version == FORMAT_VERSION:
            raise ValueError(
                f"{source!r} is already of format {FORMAT_VERSION}: there is "
                "nothing to convert; load it."
            )
        metadata, weights = _converted(metadata, legacy, version)
        decode_file(metadata, weights, torch.device("cpu"))
    except InvalidModelFile as exc:
        raise ValueError(
            f"{source!r} is not a valid skassoc model file: {exc}"
        ) from None
    write_archive(destination, metadata_bytes(metadata), weights)


def _converted(metadata, legacy, version):
    """The metadata and safetensors weights of format 3 for an older file."""
    check_checksum(metadata, legacy, LEGACY_WEIGHTS_MEMBER)
    metadata["classes"] = _little_endian(field(metadata, "classes", dict))
    classes = decode_classes(metadata["classes"])
    spec = decode_spec(field(metadata, "network", dict), len(classes))
    expected = expected_weights(spec)
    try:
        records = read_records(legacy, expected)
        present = {key: (record.shape, record.dtype) for key, record in records.items()}
        check_weights_fit(expected, present)
        weights = safetensors.torch.save(read_tensors(legacy, records))
    except LegacyWeightsError as exc:
        raise InvalidModelFile(f"{LEGACY_WEIGHTS_MEMBER}: {exc}") from None
    params = {
        name: value
        for name, value in field(metadata, "params", dict).items()
        if name not in NEVER_FROM_FILE
    }
    if version == 1:
        # Written before class_prior existed: it predicted with equal ones.
        params.setdefault("class_prior", "uniform")
        metadata["class_prior"] = uniform_prior(len(classes)).tolist()
    metadata.update(
        format_version=FORMAT_VERSION,
        skassoc_version=__version__,
        torch_version=str(torch.__version__),
        params=params,
        output_config={},
        weights_sha256=hashlib.sha256(weights).hexdigest(),
    )
    return metadata, weights


def _little_endian(classes):
    """The ``classes`` entry with the byte order that save writes today.

    Earlier skassoc wrote the labels' dtype as fit gave it, big-endian
    where the labels were; the values are the same in either order.
    """
    name = classes.get("dtype")
    if isinstance(name, str) and name.startswith(">"):
        return {**classes, "dtype": "<" + name[1:]}
    return classes


# ------------------------------------------------------- reading the pickle


def read_records(data, expected):
    """What each tensor of the torch.save archive ``data`` claims to be.

    Parameters
    ----------
    data : bytes
        The weights member of a model file of format 1 or 2.
    expected : dict of str to (tuple, torch.dtype)
        The network's tensors (see
        :func:`~skassoc._io._weights.expected_weights`): a tensor of
        another shape than theirs is refused as soon as its shape is read.

    Returns
    -------
    records : dict of str to TensorRecord

    Raises
    ------
    LegacyWeightsError
        If the archive is not a plain dict of contiguous float32 and int64
        tensors of the network's shapes, as ``torch.save`` writes it.
    """
    archive, prefix = _open(data)
    with archive:
        pickle = _member(archive, prefix + "data.pkl", MAX_PICKLE_BYTES)
        if _has(archive, prefix + "byteorder"):
            if _member(archive, prefix + "byteorder", 16) != b"little":
                raise LegacyWeightsError("the weights are stored big-endian.")
        shapes = {shape for shape, _ in expected.values()}
        tensors = _Reader(shapes).run(pickle)
        records = {}
        for name, tensor in tensors.items():
            storage, shape = tensor.storage, tensor.shape
            member = f"{prefix}data/{storage.key}"
            info = _info(archive, member)
            itemsize = torch.empty((), dtype=storage.dtype).element_size()
            if info.file_size != storage.numel * itemsize:
                raise LegacyWeightsError(f"{member} does not hold {name!r}.")
            records[name] = TensorRecord(member, storage.dtype, shape)
    return records


def read_tensors(data, records):
    """The tensors of ``records`` (from :func:`read_records`), read from ``data``."""
    archive, _ = _open(data)
    with archive:
        tensors = {}
        for name, record in records.items():
            size = _info(archive, record.member).file_size
            raw = bytearray(_member(archive, record.member, size))
            if not raw:
                tensors[name] = torch.empty(record.shape, dtype=record.dtype)
                continue
            tensors[name] = torch.frombuffer(raw, dtype=record.dtype).reshape(
                record.shape
            )
    return tensors


def _open(data):
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError) as exc:
        raise LegacyWeightsError(
            f"the weights are not a torch archive: {exc}"
        ) from None
    names = archive.namelist()
    pickles = [name for name in names if name.endswith("/data.pkl")]
    if len(pickles) != 1 or len(names) > MAX_MEMBERS or len(set(names)) != len(names):
        archive.close()
        raise LegacyWeightsError("the weights are not one torch.save archive.")
    prefix = pickles[0][: -len("data.pkl")]
    for name in names:
        rest = name[len(prefix) :] if name.startswith(prefix) else None
        known = rest is not None and (
            rest in _BOOKKEEPING
            or rest == "data.pkl"
            or (rest.startswith("data/") and _is_key(rest[5:]))
        )
        if not known:
            archive.close()
            raise LegacyWeightsError(f"unknown member {name[:60]!r} in the weights.")
    return archive, prefix


def _has(archive, name):
    return name in archive.NameToInfo


def _info(archive, name):
    if not _has(archive, name):
        raise LegacyWeightsError(f"the weights have no {name[:60]!r}.")
    info = archive.getinfo(name)
    if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
        raise LegacyWeightsError(f"{name[:60]!r} is compressed or encrypted.")
    return info


def _member(archive, name, limit):
    info = _info(archive, name)
    if info.file_size > limit:
        raise LegacyWeightsError(f"{name[:60]!r} is larger than {limit} bytes.")
    try:
        with archive.open(info) as stream:
            data = stream.read(limit + 1)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise LegacyWeightsError(f"cannot read {name[:60]!r}: {exc}") from None
    if len(data) != info.file_size:
        raise LegacyWeightsError(f"{name[:60]!r} is not of its declared size.")
    return data


class _Reader:
    """A pickle machine for the opcodes of a state dict, that calls nothing.

    ``shapes`` are those a tensor may have: the network's.
    """

    def __init__(self, shapes):
        self.shapes = shapes
        self.stack = []
        self.marks = []  # stack lengths at each MARK, as pickle's own
        self.memo = {}
        self.result = None

    def run(self, pickle):
        try:
            for opcode, arg, _ in pickletools.genops(pickle):
                self.step(opcode.name, arg)
                if self.result is not None:
                    return self.result
        except (ValueError, IndexError, KeyError, TypeError) as exc:
            # genops refuses torn opcodes; the stack and memo, bad references.
            raise LegacyWeightsError(f"malformed weights pickle: {exc}") from None
        raise LegacyWeightsError("the weights pickle does not end.")

    def step(self, name, arg):
        stack = self.stack
        if name in _PUSH:
            stack.append(arg)
        elif name in _MEMO_PUT:
            self.memo[arg] = stack[-1]
        elif name in _MEMO_GET:
            stack.append(self.memo[arg])
        elif name == "PROTO":
            if not 2 <= arg <= 5:
                raise LegacyWeightsError(f"pickle protocol {arg}.")
        elif name == "MARK":
            self.marks.append(len(stack))
        elif name in ("EMPTY_DICT", "EMPTY_TUPLE"):
            stack.append({} if name == "EMPTY_DICT" else ())
        elif name in ("NEWTRUE", "NEWFALSE"):
            stack.append(name == "NEWTRUE")
        elif name == "TUPLE":
            stack.append(tuple(self.pop_mark()))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            size = int(name[-1])
            if len(stack) < size:
                raise IndexError("stack underflow")
            items = tuple(stack[-size:])
            del stack[-size:]
            stack.append(items)
        elif name == "GLOBAL":
            stack.append(_global(arg))
        elif name == "BINPERSID":
            stack.append(_storage(stack.pop()))
        elif name == "REDUCE":
            args = stack.pop()
            stack.append(_reduce(stack.pop(), args, self.shapes))
        elif name in ("SETITEM", "SETITEMS"):
            if name == "SETITEM":
                items = stack[-2:]
                del stack[-2:]
            else:
                items = self.pop_mark()
            _set_items(stack[-1], items)
        elif name == "STOP":
            self.result = self.finish()
        else:
            raise LegacyWeightsError(f"the weights pickle uses opcode {name}.")

    def pop_mark(self):
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    def finish(self):
        if len(self.stack) != 1 or self.marks or not isinstance(self.stack[0], dict):
            raise LegacyWeightsError("the weights pickle is not one dict of tensors.")
        tensors = self.stack[0]
        keys = [tensor.storage.key for tensor in tensors.values()]
        # A memo reference can name one storage under several keys: each
        # would be read again, so a small file could fill much memory.
        if len(set(keys)) != len(keys):
            raise LegacyWeightsError("two tensors share one storage.")
        return tensors


@dataclass(frozen=True)
class _Tensor:
    storage: _Storage
    shape: tuple


def _storage(pid):
    valid = (
        isinstance(pid, tuple)
        and len(pid) == 5
        and pid[0] == "storage"
        and isinstance(pid[1], _Global)
        and pid[1].name in STORAGE_DTYPES
        and _is_key(pid[2])
        and pid[3] == "cpu"
        and is_integer(pid[4])
        and pid[4] >= 0
    )
    if not valid:
        raise LegacyWeightsError("a tensor's storage is not a CPU float or long one.")
    return _Storage(pid[2], STORAGE_DTYPES[pid[1].name], pid[4])


def _reduce(function, args, shapes):
    if not isinstance(function, _Global):
        raise LegacyWeightsError("the weights pickle calls a non-global.")
    if function.name == _DICT_CLASS and args == ():
        return _EMPTY_HOOKS
    if function.name != _REBUILD_TENSOR:
        raise LegacyWeightsError(f"the weights pickle calls {function.name}.")
    if not (isinstance(args, tuple) and len(args) == 6):
        raise LegacyWeightsError("a tensor is rebuilt with unusual arguments.")
    storage, offset, shape, stride, requires_grad, hooks = args
    _check_shape(shape, shapes)
    plain = (
        isinstance(storage, _Storage)
        and offset == 0
        and _is_contiguous(shape, stride)
        and math.prod(shape) == storage.numel
        and isinstance(requires_grad, bool)
        and hooks is _EMPTY_HOOKS
    )
    if not plain:
        raise LegacyWeightsError(
            "a tensor is a view (an offset, strides or a part of its storage), "
            "not a plain contiguous tensor."
        )
    return _Tensor(storage, shape)


def _check_shape(shape, shapes):
    """Refuse a shape that is not one of the network's ``shapes``.

    Its length and sizes are bounded before they are compared or multiplied:
    a pickle may hold thousands of sizes of hundreds of digits each.
    """
    if not isinstance(shape, tuple):
        raise LegacyWeightsError("a tensor's shape is not a tuple of sizes.")
    if len(shape) > MAX_DIMENSIONS or not all(
        is_integer(size) and 0 <= size <= MAX_DIMENSION_SIZE for size in shape
    ):
        raise LegacyWeightsError(
            f"a tensor's shape has {len(shape)} dimensions or sizes out of bounds "
            f"(at most {MAX_DIMENSIONS} dimensions of up to {MAX_DIMENSION_SIZE})."
        )
    if shape not in shapes:
        raise LegacyWeightsError(
            f"its weights do not fit the network it describes: a tensor of "
            f"shape {shortened(shape)} is none of the network's."
        )


def _set_items(target, items):
    if not isinstance(target, dict) or len(items) % 2:
        raise LegacyWeightsError("the weights pickle fills something not a dict.")
    for key, value in zip(items[::2], items[1::2], strict=True):
        if not isinstance(key, str) or not isinstance(value, _Tensor):
            raise LegacyWeightsError("the weights are not a dict of named tensors.")
        if key in target:
            raise LegacyWeightsError(f"tensor {key[:60]!r} appears twice.")
        target[key] = value


def _global(arg):
    module, _, name = arg.partition(" ")
    allowed = {_DICT_CLASS, _REBUILD_TENSOR, *STORAGE_DTYPES}
    if (module, name) not in allowed:
        raise LegacyWeightsError(f"the weights pickle names {arg[:80]!r}.")
    return _Global((module, name))


def _is_key(value):
    return isinstance(value, str) and value.isascii() and value.isdigit()


def _is_contiguous(shape, stride):
    """Whether ``stride`` lays ``shape`` (a bounded one) out in row-major order.

    As torch's own test, the stride of a dimension of size 1 is free (a
    contiguous copy of a channels-last tensor keeps it); the others must be
    those torch gives a contiguous tensor, empty ones included (a size of 0
    counts as 1).
    """
    if not (
        isinstance(stride, tuple)
        and len(shape) == len(stride)
        and all(is_integer(v) and v >= 0 for v in stride)
    ):
        return False
    step = 1
    for size, gap in zip(reversed(shape), reversed(stride), strict=True):
        if size != 1 and gap != step:
            return False
        step *= max(size, 1)
    return True
