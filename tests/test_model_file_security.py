"""Model files from strangers: what a tampered file can and cannot do.

Each case starts from a valid file, alters it as an attacker would (the
checksum recomputed where the attacker can), and checks that loading either
refuses it with a ValueError naming the problem or keeps the change within
what a model file may set.
"""

import copy
import errno
import hashlib
import io
import json
import math
import os
import pickle
import re
import signal
import struct
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
import safetensors.torch
import torch
from sklearn.base import clone

import skassoc._classifier
import skassoc._engine._losses
import skassoc._io._archive
import skassoc._io._metadata
from skassoc import (
    SemiSupervisedAssociationClassifier,
    convert_model_file,
    recipe_params,
)
from skassoc._io._format import METADATA_MEMBER, WEIGHTS_MEMBER
from skassoc._io._limits import MAX_BATCH, MAX_HEADER_BYTES, MAX_STEPS
from skassoc._io._refit_cost import refit_cost_problem
from skassoc._nn._model import ModelSpec
from skassoc._settings import step_memory_bytes

try:  # POSIX: save's clean-up of crashed saves needs file locks.
    import fcntl
except ImportError:  # Windows
    fcntl = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def saved(tmp_path_factory, _digits):
    """A valid model file (MLP on digits), its metadata and weights."""
    X, y = _digits
    y_semi = np.where(np.arange(len(y)) % 5 == 0, y, -1)
    clf = SemiSupervisedAssociationClassifier(
        max_iter=5, device="cpu", random_state=0, hidden_layer_sizes=(32,)
    ).fit(X, y_semi)
    path = tmp_path_factory.mktemp("valid") / "model.skassoc"
    clf.save(path)
    with zipfile.ZipFile(path) as archive:
        metadata = json.loads(archive.read(METADATA_MEMBER))
        weights = archive.read(WEIGHTS_MEMBER)
    return clf, path, metadata, weights


def write_archive(
    path,
    metadata,
    weights,
    *,
    fix_checksum=True,
    metadata_bytes=None,
    metadata_compression=zipfile.ZIP_DEFLATED,
    weights_compression=zipfile.ZIP_STORED,
    extra=(),
):
    """A model file with ``metadata`` (or the raw ``metadata_bytes``) and
    ``weights`` (the checksum redone), then the ``extra`` members ``(name,
    data)``."""
    if fix_checksum:
        metadata = {**metadata, "weights_sha256": hashlib.sha256(weights).hexdigest()}
    if metadata_bytes is None:
        metadata_bytes = json.dumps(metadata).encode()
    members = [
        (METADATA_MEMBER, metadata_bytes, metadata_compression),
        (WEIGHTS_MEMBER, weights, weights_compression),
    ]
    members += [(name, data, zipfile.ZIP_STORED) for name, data in extra]
    with zipfile.ZipFile(path, "w") as archive:
        for name, data, compression in members:
            archive.writestr(name, data, compress_type=compression)
    return path


def tampered_weights(weights, change):
    state = safetensors.torch.load(weights)
    change(state)
    return safetensors.torch.save(state)


def safetensors_bytes(header, data=b""):
    """A safetensors buffer with the given header (a dict), by hand."""
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def with_params(metadata, **params):
    return {**metadata, "params": {**metadata["params"], **params}}


def with_network(metadata, **entries):
    return {**metadata, "network": {**metadata["network"], **entries}}


def refused(path, match):
    with pytest.raises(ValueError, match=match):
        SemiSupervisedAssociationClassifier.load(path, device="cpu")


# ------------------------------------------------ parameters from a file

SHELL = "touch /tmp/skassoc-pwned"


@pytest.mark.parametrize(
    "compile_value",
    [
        {"options": {"cpp.cxx": ["sh", "-c", SHELL]}},
        {"backend": "os.system"},
        True,
    ],
)
def test_compile_is_never_taken_from_a_file(saved, tmp_path, compile_value):
    _, _, metadata, weights = saved
    path = write_archive(
        tmp_path / "m.skassoc", with_params(metadata, compile=compile_value), weights
    )
    with pytest.warns(UserWarning, match="compile"):
        loaded = SemiSupervisedAssociationClassifier.load(path, device="cpu")
    assert loaded.compile is False
    # GridSearchCV clones: the clone must not carry it either.
    assert clone(loaded).compile is False


def test_device_is_never_taken_from_a_file(saved, tmp_path):
    _, _, metadata, weights = saved
    path = write_archive(
        tmp_path / "m.skassoc", with_params(metadata, device="cuda:7"), weights
    )
    with pytest.warns(UserWarning, match="device"):
        loaded = SemiSupervisedAssociationClassifier.load(path, device="cpu")
    assert loaded.device == "cpu"


@pytest.mark.parametrize(
    "name, value",
    [
        ("network", "os.system"),
        ("network", {"module": "os", "call": "system"}),
        ("max_iter", 10**12),
        ("max_iter", MAX_STEPS + 1),
        ("unlabeled_batch_size", 2**40),
        ("labeled_per_class", MAX_BATCH + 1),
        ("predict_batch_size", 10**12),
        ("embedding_dim", 10**9),
        ("hidden_layer_sizes", [10**9]),
        ("hidden_layer_sizes", [8] * 10_000),
        ("learning_rate", float("nan")),
        ("learning_rate", float("inf")),
        ("visit_weight", -1.0),
        ("random_state", -3),
        ("random_state", 2**64),
        ("augmentation", {"affine_std": 1e300}),
        ("augmentation", {"__import__": "os"}),
        ("augmentation", {"feature_noise": 1e300}),
        ("augmentation", {"feature_noise": "huge"}),
        ("augmentation", {"affine_std": "auto"}),
        ("augmentation", {"feature_noise": 0.5, "affine_std": 0.1}),
        ("augmentation", "noisy"),
        ("consistency_weight", "always"),
        ("verbose", 10**9),
        ("image_size", 10**6),
        ("input_shape", [1, 10**6, 10**6]),
        ("precision", "fp8"),
        ("warm_start", "yes"),
        ("ema_decay", 2.0),
        ("ema_decay", 1.0),  # fit's bound is open: the refit would fail
        # Two weights of one label (0 and 0.0 are one dict key): one would
        # silently be dropped.
        ("class_weight", [[0, 1.0], [0.0, 2.0]]),
        ("class_weight", [["a", 1.0], ["a", 1.0]]),
    ],
)
def test_parameters_outside_their_domain_are_refused(saved, tmp_path, name, value):
    _, _, metadata, weights = saved
    path = write_archive(
        tmp_path / "m.skassoc", with_params(metadata, **{name: value}), weights
    )
    refused(path, f"parameter {name} = .* outside the values")


def test_a_file_must_satisfy_fits_constraints_beyond_the_domains(
    saved, tmp_path, monkeypatch
):
    # A domain wider than fit's constraints must not let a file load that
    # its refit would refuse.
    _, _, metadata, weights = saved
    monkeypatch.setitem(skassoc._io._metadata.SAFE_PARAMS, "ema_decay", lambda v: True)
    path = write_archive(
        tmp_path / "m.skassoc", with_params(metadata, ema_decay=1.0), weights
    )
    refused(path, r"'ema_decay' parameter of the model file must be .*\[0.0, 1.0\)")


def test_save_names_a_subclass_parameter_that_files_cannot_hold(saved, tmp_path):
    class WithExtra(SemiSupervisedAssociationClassifier):
        extra = 1

        @classmethod
        def _get_param_names(cls):
            return sorted([*super()._get_param_names(), "extra"])

    clf = copy.deepcopy(saved[0])
    clf.__class__ = WithExtra
    with pytest.raises(ValueError, match="Cannot save parameter extra=1"):
        clf.save(tmp_path / "m.skassoc")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["__class__", "on_fit_begin", "_fit_context"])
def test_unknown_parameters_are_refused(saved, tmp_path, name):
    _, _, metadata, weights = saved
    path = write_archive(
        tmp_path / "m.skassoc", with_params(metadata, **{name: 1}), weights
    )
    refused(path, "unknown parameter")


def test_every_estimator_parameter_has_a_file_rule():
    from skassoc._params import NEVER_FROM_FILE, SAFE_PARAMS

    names = set(SemiSupervisedAssociationClassifier().get_params())
    assert names == set(SAFE_PARAMS) | set(NEVER_FROM_FILE)


def test_a_safe_parameter_change_is_all_a_file_can_do(saved, tmp_path, digits):
    # Within the safe list, a file sets hyperparameters of the next fit and
    # nothing else: the loaded model still predicts as saved.
    clf, _, metadata, weights = saved
    path = write_archive(
        tmp_path / "m.skassoc",
        with_params(metadata, visit_weight=0.5, max_iter=3),
        weights,
    )
    loaded = SemiSupervisedAssociationClassifier.load(path, device="cpu")
    assert (loaded.visit_weight, loaded.max_iter) == (0.5, 3)
    X, _ = digits
    np.testing.assert_array_equal(loaded.predict(X), clf.predict(X))


# ------------------------------------------------------- hostile sizes


@pytest.mark.parametrize(
    "entries, match",
    [
        ({"embedding_dim": 60_000}, "do not fit the network"),
        ({"hidden_layer_sizes": [60_000, 60_000]}, "do not fit the network"),
        ({"hidden_layer_sizes": [8] * 1000}, "bad network description"),
        ({"n_features": 10**12}, "out of bounds"),
        ({"name": "custom"}, "unknown network"),
        ({"name": "__import__"}, "unknown network"),
        ({"input_shape": [1, 8, 9]}, "does not hold"),
        ({"input_shape": [1, 10**5, 10**5]}, "bad input_shape"),
        ({"image_channels": 2}, "bad network description"),
        ({"image_size": [10**7, 10**7]}, "bad network description"),
    ],
)
def test_network_descriptions_are_checked_before_building(
    saved, tmp_path, entries, match
):
    _, _, metadata, weights = saved
    path = write_archive(
        tmp_path / "m.skassoc", with_network(metadata, **entries), weights
    )
    refused(path, match)


TEN = list(range(10))  # the saved model's classes


@pytest.mark.parametrize(
    "classes, match",
    [
        (
            {"dtype": "<U100000", "values": [str(i) for i in TEN]},
            "not 1 to 1024 characters wide",
        ),
        (
            {"dtype": "<U" + "9" * 5000, "values": [str(i) for i in TEN]},
            "not 1 to 1024 characters wide",
        ),
        ({"dtype": "<i8", "values": list(range(100_000))}, "100000 classes; a model"),
        ({"dtype": "<i8", "values": [1, 1, 2, 3, 4, 5, 6, 7, 8, 9]}, "distinct"),
        ({"dtype": "<U0", "values": [str(i) for i in TEN]}, "not 1 to 1024"),
        ({"dtype": "|O", "values": [1, *"abcdefghi"]}, "bad classes values"),
        ({"dtype": "V8", "values": TEN}, "unsupported classes dtype"),
        ({"dtype": "<i8", "values": list(range(11))}, "11 classes, a logit layer"),
        ({"dtype": "not a dtype", "values": TEN}, "unsupported classes dtype"),
        # What fit never makes: unsorted labels (a warm start would match
        # new labels against them wrongly), the unlabeled marker, NaN.
        ({"dtype": "<i8", "values": TEN[::-1]}, "not sorted"),
        ({"dtype": "<U1", "values": [*"bacdefghij"]}, "not sorted"),
        ({"dtype": "<i8", "values": list(range(-1, 9))}, "hold -1"),
        ({"dtype": "<f8", "values": [-1.0, *map(float, range(9))]}, "hold -1"),
        ({"dtype": "<U2", "values": ["-1", *"abcdefghi"]}, "hold -1"),
        ({"dtype": "|O", "values": ["-1", *"abcdefghi"]}, "hold -1"),
        ({"dtype": "<f8", "values": [*map(float, range(9)), math.nan]}, "bad"),
        ({"dtype": "<f8", "values": [*map(float, range(9)), math.inf]}, "bad"),
        ({"dtype": "<f8", "values": [-0.0, *map(float, range(9))]}, "distinct"),
        # Dtypes that save never writes.
        ({"dtype": ">i8", "values": TEN}, "unsupported classes dtype"),
        ({"dtype": "<f16", "values": [float(i) for i in TEN]}, "unsupported"),
        ({"dtype": "<U1[2]", "values": [*"abcdefghij"]}, "unsupported"),
        ({"dtype": "<M8[ns]", "values": TEN}, "unsupported classes dtype"),
        ({"dtype": "=i8", "values": TEN}, "unsupported classes dtype"),
    ],
)
def test_classes_are_checked(saved, tmp_path, classes, match):
    _, _, metadata, weights = saved
    path = write_archive(
        tmp_path / "m.skassoc", {**metadata, "classes": classes}, weights
    )
    refused(path, match)


def wide_classes(n_classes=2**16, width=1024):
    """``n_classes`` short labels declared in a string dtype of ``width``."""
    return {"dtype": f"<U{width}", "values": [f"{i:05x}" for i in range(n_classes)]}


def test_the_classes_are_counted_before_an_array_is_built(saved, tmp_path):
    # 65,536 labels of a 1,024-character dtype: 256 MiB as an array, from
    # half a MiB of file. The logit layer says how many classes there are.
    _, _, metadata, weights = saved
    path = write_archive(
        tmp_path / "m.skassoc", {**metadata, "classes": wide_classes()}, weights
    )
    refused(path, "65536 classes, a logit layer of 10")
    # A header that agrees (its data is never read): the labels' total
    # width is bounded.
    (size,) = struct.unpack("<Q", weights[:8])
    header = json.loads(weights[8 : 8 + size])
    header["logits.bias"]["shape"] = [2**16]
    path = write_archive(
        tmp_path / "m.skassoc",
        {**metadata, "classes": wide_classes()},
        safetensors_bytes(header, weights[8 + size :]),
    )
    refused(path, "65536 classes of dtype <U1024 exceed the 1048576 characters")


def test_a_deflate_bomb_in_the_weights_is_refused(saved, tmp_path):
    _, _, metadata, weights = saved
    bomb = b"\0" * (64 * 2**20)
    path = write_archive(
        tmp_path / "m.skassoc", metadata, bomb, weights_compression=zipfile.ZIP_DEFLATED
    )
    assert os.path.getsize(path) < 2**20
    refused(path, "compressed; it is always stored")


def test_a_deflate_bomb_in_the_metadata_is_refused(saved, tmp_path):
    _, _, metadata, weights = saved
    padded = {**metadata, "padding": " " * (256 * 2**20)}
    path = write_archive(tmp_path / "m.skassoc", padded, weights)
    assert os.path.getsize(path) < 2**20
    refused(path, "metadata.json declares")


def test_a_member_that_lies_about_its_size_is_refused(saved, tmp_path):
    _, _, metadata, weights = saved
    path = write_archive(tmp_path / "m.skassoc", metadata, weights)
    # Patch the declared size of metadata.json in both headers to 10 bytes.
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(METADATA_MEMBER)
    real = info.file_size.to_bytes(4, "little")
    raw = raw.replace(
        info.compress_size.to_bytes(4, "little") + real,
        info.compress_size.to_bytes(4, "little") + (10).to_bytes(4, "little"),
    )
    path.write_bytes(bytes(raw))
    refused(path, "not a valid skassoc model file")


# ----------------------------------------------- what the archive may hold


def test_a_pickle_before_the_archive_is_refused(saved, tmp_path):
    _, valid, _, _ = saved
    polyglot = tmp_path / "m.skassoc"
    polyglot.write_bytes(pickle.dumps({"a": 1}) + valid.read_bytes())
    refused(polyglot, "does not start with a zip archive")


def test_data_after_the_archive_is_refused(saved, tmp_path):
    _, valid, _, _ = saved
    path = tmp_path / "m.skassoc"
    path.write_bytes(valid.read_bytes() + pickle.dumps({"a": 1}))
    refused(path, "does not end with the zip archive")


def test_an_archive_comment_is_refused(saved, tmp_path):
    _, _, metadata, weights = saved
    path = write_archive(tmp_path / "m.skassoc", metadata, weights)
    with zipfile.ZipFile(path, "a") as archive:
        archive.comment = b"cos\nsystem\n"
    refused(path, "archive comment")


@pytest.mark.parametrize("name", ["evil.py", "../escape.txt", "/etc/passwd"])
def test_unknown_members_are_refused(saved, tmp_path, name):
    _, _, metadata, weights = saved
    extra = [(name, b"import os")]
    path = write_archive(tmp_path / "m.skassoc", metadata, weights, extra=extra)
    refused(path, "unknown members")


def test_a_duplicated_member_is_refused(saved, tmp_path):
    _, _, metadata, weights = saved
    extra = [(WEIGHTS_MEMBER, weights)]
    with pytest.warns(UserWarning, match="Duplicate name"):
        path = write_archive(tmp_path / "m.skassoc", metadata, weights, extra=extra)
    refused(path, "twice")


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda s: s["logits.weight"].fill_(float("nan")), "NaN or infinity"),
        (lambda s: s["logits.bias"].fill_(float("inf")), "NaN or infinity"),
        (
            lambda s: s.update({"logits.weight": s["logits.weight"].double()}),
            "do not fit the network",
        ),
        (lambda s: s.pop("logits.bias"), "(?i)missing key"),
        (lambda s: s.pop("logits.weight"), "missing \\[.logits.weight.\\]"),
        (lambda s: s.update({"extra": torch.zeros(3)}), "unexpected"),
        (
            lambda s: s.update({"logits.bias": s["logits.bias"].to(torch.int32)}),
            "logits.bias is \\(10,\\) I32, the network needs",
        ),
    ],
)
def test_weights_are_checked(saved, tmp_path, change, match):
    _, _, metadata, weights = saved
    path = write_archive(
        tmp_path / "m.skassoc", metadata, tampered_weights(weights, change)
    )
    refused(path, match)


def test_files_without_the_input_scale_load_with_the_reference_scale(tmp_path, _digits):
    """Files of earlier versions lack the image networks' input scale."""
    X, y = _digits
    images = (X * 255 / 16).astype(np.uint8).reshape(-1, 8, 8)
    clf = SemiSupervisedAssociationClassifier(
        network="mnist", max_iter=3, device="cpu", random_state=0
    ).fit(images, np.where(np.arange(len(y)) % 2 == 0, y, -1))
    path = tmp_path / "m.skassoc"
    clf.save(path)
    with zipfile.ZipFile(path) as archive:
        metadata = json.loads(archive.read(METADATA_MEMBER))
    # As earlier skassoc wrote them: contiguous CPU copies.
    state = {
        key: tensor.detach().contiguous()
        for key, tensor in clf.model_.state_dict().items()
        if not key.startswith("embedder.input_scale")
    }
    old = legacy_archive(tmp_path / "old.legacy", metadata, state)
    convert_model_file(old, path)
    loaded = SemiSupervisedAssociationClassifier.load(path, device="cpu")
    # 8-bit images: the learned scale was the reference one.
    np.testing.assert_array_equal(
        loaded.predict_proba(images), clf.predict_proba(images)
    )


class _Payload:
    def __reduce__(self):
        return (os.system, (SHELL,))


def test_pickled_code_in_the_weights_is_refused(saved, tmp_path):
    _, _, metadata, _ = saved
    buffer = io.BytesIO()
    torch.save({"logits.weight": _Payload()}, buffer)
    path = write_archive(tmp_path / "m.skassoc", metadata, buffer.getvalue())
    # A zip's first bytes read as a header length of about 10**12 bytes.
    refused(path, "declares a header of")
    assert not os.path.exists("/tmp/skassoc-pwned")


def test_a_checksum_mismatch_is_refused(saved, tmp_path):
    _, _, metadata, weights = saved
    altered = tampered_weights(weights, lambda s: s["logits.bias"].add_(1.0))
    path = write_archive(tmp_path / "m.skassoc", metadata, altered, fix_checksum=False)
    refused(path, "SHA-256")


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda m: {**m, "format_version": 99}, "Upgrade skassoc"),
        (lambda m: [m], "not a JSON object"),
        (lambda m: {**m, "feature_names_in": ["a"]}, "feature_names_in"),
        (lambda m: {**m, "n_iter": -1}, "n_iter"),
        (lambda m: {**m, "n_iter": 10**300}, "n_iter 1000.* is outside 0 to"),
        (lambda m: {**m, "n_iter": MAX_STEPS + 1}, "n_iter .* is outside 0 to"),
        (
            lambda m: {**m, "feature_names_in": ["a"] * m["network"]["n_features"]},
            "feature_names_in holds a name twice",
        ),
        (lambda m: {**m, "history": {"total": ["x"]}}, "history"),
        (lambda m: {**m, "format": "pickle"}, "format"),
    ],
)
def test_metadata_is_checked(saved, tmp_path, change, match):
    _, _, metadata, weights = saved
    metadata = {**metadata, "weights_sha256": hashlib.sha256(weights).hexdigest()}
    path = write_archive(
        tmp_path / "m.skassoc", change(metadata), weights, fix_checksum=False
    )
    refused(path, match)


def test_deeply_nested_json_is_refused(saved, tmp_path):
    _, _, _, weights = saved
    nested = ("[" * 100_000 + "]" * 100_000).encode()
    # Stored: deflated, it would be refused for its ratio before it is parsed.
    path = write_archive(
        tmp_path / "m.skassoc",
        None,
        weights,
        fix_checksum=False,
        metadata_bytes=nested,
        metadata_compression=zipfile.ZIP_STORED,
    )
    refused(path, "not valid JSON")


# ------------------------------------------------------------- the paths


def test_load_refuses_a_fifo_without_blocking(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    refused(fifo, "not a regular file")


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_save_refuses_to_replace_what_is_not_a_regular_file(saved, tmp_path, kind):
    clf = saved[0]
    target = tmp_path / "target"
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    with pytest.raises(ValueError, match="not a regular file.*model files are"):
        clf.save(target)


def test_save_into_a_missing_folder_names_the_folder(saved, tmp_path):
    # The folder, not the temporary file beside the target that save opens.
    target = tmp_path / "no such folder" / "model.skassoc"
    with pytest.raises(FileNotFoundError, match="its folder .* does not exist"):
        saved[0].save(target)


def test_save_says_what_is_wrong_with_a_path_that_names_no_file(saved, tmp_path):
    # Not an error about the temporary file beside the target.
    clf = saved[0]
    with pytest.raises(ValueError, match="The path is empty"):
        clf.save("")
    for folder in [tmp_path / "missing", tmp_path]:
        with pytest.raises(ValueError, match="ends with a path separator"):
            clf.save(f"{folder}{os.sep}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(
    not os.path.exists("/proc/self/status"), reason="needs Linux's /proc"
)
def test_load_of_a_file_that_cannot_seek_is_refused_clearly():
    # /proc's files say they are regular files but cannot seek from the end.
    fd = os.open("/proc/self/status", os.O_RDONLY)
    try:
        os.lseek(fd, 0, os.SEEK_END)
    except OSError:
        pass
    else:
        pytest.skip("this kernel's /proc files seek from their end")
    finally:
        os.close(fd)
    refused("/proc/self/status", "cannot be read as a file of known size")


@pytest.mark.parametrize("length", [231, 255])
def test_names_as_long_as_the_file_system_allows_are_saved(saved, tmp_path, length):
    if os.pathconf(tmp_path, "PC_NAME_MAX") < length:
        pytest.skip("the file system allows shorter names")
    target = tmp_path / ("m" * length)
    saved[0].save(target)
    saved[0].save(target)
    assert [p.name for p in tmp_path.iterdir()] == [target.name]
    SemiSupervisedAssociationClassifier.load(target, device="cpu")


@pytest.mark.skipif(fcntl is None, reason="needs POSIX file locks")
@pytest.mark.parametrize("length", [8, 250])
def test_a_crashed_saves_temporary_is_removed_whatever_the_names_length(
    saved, tmp_path, monkeypatch, length
):
    target = tmp_path / ("m" * length)

    def dying_replace(source, destination):
        # As a save that died before its rename: its temporary file, under
        # another random part and without a lock.
        folder, name = os.path.split(source)
        stem, token, suffix = re.fullmatch(r"(.*)\.([0-9a-f]{12})(\..*)", name).groups()
        other = "0123456789ab" if token != "0123456789ab" else "ba9876543210"
        with open(os.path.join(folder, f"{stem}.{other}{suffix}"), "wb") as copy:
            copy.write(b"half a model")
        raise OSError("the disk is full")

    monkeypatch.setattr(os, "replace", dying_replace)
    with pytest.raises(OSError, match="disk is full"):
        saved[0].save(target)
    monkeypatch.undo()
    assert len(list(tmp_path.iterdir())) == 1
    saved[0].save(target)
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


@pytest.mark.skipif(fcntl is None, reason="needs POSIX file locks")
def test_the_clean_up_takes_only_this_targets_temporary_files(saved, tmp_path):
    kept = [
        "m.x.abcdefabcdef.skassoc-tmp",  # target m.x's
        "m.notes.skassoc-tmp",
        "m.0123456789AB.skassoc-tmp",
        "m.0123456789abc.skassoc-tmp",
        "m.0123456789ab.skassoc-tmp.bak",
    ]
    for name in kept:
        (tmp_path / name).write_text("not a temporary file of m")
    (tmp_path / "m.0123456789ab.skassoc-tmp").write_text("a crashed save's")
    # A FIFO of a temporary file's name is left alone, not opened (which
    # would wait for a writer).
    os.mkfifo(tmp_path / "m.ba9876543210.skassoc-tmp")
    previous = signal.signal(signal.SIGALRM, _raise_timeout)
    signal.alarm(30)
    try:
        saved[0].save(tmp_path / "m")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    remaining = sorted(p.name for p in tmp_path.iterdir())
    assert remaining == sorted([*kept, "m", "m.ba9876543210.skassoc-tmp"])


@pytest.mark.skipif(fcntl is None, reason="needs POSIX file locks")
def test_a_save_without_a_lock_leaves_no_temporary_file(saved, tmp_path, monkeypatch):
    def no_lock(handle, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_lock)
    with pytest.raises(OSError, match="No locks available"):
        saved[0].save(tmp_path / "m")
    assert list(tmp_path.iterdir()) == []


def test_load_refuses_a_fifo_swapped_in_after_the_type_check(tmp_path, monkeypatch):
    # The name is a regular file when looked at, then a FIFO when opened:
    # load must refuse it, not wait for a writer.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    real_stat = os.stat

    def swapped_stat(path, *args, **kwargs):
        return real_stat(__file__ if str(path) == str(fifo) else path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", swapped_stat)
    previous = signal.signal(signal.SIGALRM, _raise_timeout)
    signal.alarm(30)
    try:
        refused(fifo, "not a regular file")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_load_follows_a_symlink_to_a_model_file(saved, tmp_path):
    link = tmp_path / "link.skassoc"
    link.symlink_to(saved[1])
    SemiSupervisedAssociationClassifier.load(link, device="cpu")


def _raise_timeout(signum, frame):
    raise TimeoutError("save blocked")


def test_save_replaces_a_symlink_and_leaves_its_target(saved, tmp_path):
    clf = saved[0]
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    link = tmp_path / "model.skassoc"
    link.symlink_to(target)
    clf.save(link)
    assert not link.is_symlink()
    assert target.read_text() == "keep me"
    SemiSupervisedAssociationClassifier.load(link, device="cpu")


def test_bytes_paths_work_and_other_types_get_a_type_error(saved, tmp_path, digits):
    clf = saved[0]
    path = os.fsencode(tmp_path / "model.skassoc")
    clf.save(path)
    loaded = SemiSupervisedAssociationClassifier.load(path, device="cpu")
    np.testing.assert_array_equal(loaded.predict(digits[0]), clf.predict(digits[0]))
    with pytest.raises(TypeError, match="path must be"):
        clf.save(12)
    with pytest.raises(TypeError, match="path must be"):
        SemiSupervisedAssociationClassifier.load(io.BytesIO(b"PK"))


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
def test_a_crashed_save_leaves_no_temporary_file_after_the_next_save(saved, tmp_path):
    _, valid, _, _ = saved
    target = tmp_path / "model.skassoc"
    # A process killed in the middle of writing the weights.
    script = textwrap.dedent(
        f"""
        import os, signal, zipfile
        from skassoc import SemiSupervisedAssociationClassifier as C
        clf = C.load({str(valid)!r}, device="cpu")
        original = zipfile.ZipFile.writestr
        def dying(self, name, data, **kwargs):
            if name == {WEIGHTS_MEMBER!r}:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, name, data, **kwargs)
        zipfile.ZipFile.writestr = dying
        clf.save({str(target)!r})
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}
    )
    assert result.returncode == -signal.SIGKILL
    strays = list(tmp_path.glob("model.skassoc.*"))
    assert strays, "the killed save should have left its temporary file"
    assert not target.exists()
    saved[0].save(target)
    assert list(tmp_path.glob("model.skassoc.*")) == []
    SemiSupervisedAssociationClassifier.load(target, device="cpu")


# ----------------------------------------------------------- peak memory

_MEASURE = textwrap.dedent(
    """
    import json, re, sys
    import numpy as np
    from skassoc import SemiSupervisedAssociationClassifier as C, convert_model_file
    valid, legacy, hostile = sys.argv[1], sys.argv[2], sys.argv[3:]
    # Warm up imports and allocators on valid files of both kinds.
    C.load(valid, device="cpu")
    convert_model_file(legacy, legacy + ".converted")

    def status(field):
        text = open("/proc/self/status").read()
        return int(re.search(rf"^{field}:\\s*(\\d+) kB", text, re.M)[1]) * 1024

    def peak_growth(read):
        # Writing 5 to clear_refs resets the peak (VmHWM) to the present RSS.
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        before = status("VmRSS")
        outcome = read()
        return [outcome, status("VmHWM") - before]

    def attempt(path):
        try:
            if path.endswith(".legacy"):
                convert_model_file(path, path + ".converted")
            else:
                C.load(path, device="cpu")
        except ValueError:
            return "refused"
        return "read"

    growth = {path: peak_growth(lambda: attempt(path)) for path in hostile}
    # The instrument itself: 64 MiB written must show.
    growth["control"] = peak_growth(lambda: float(np.ones(2**23).sum()))
    print(json.dumps(growth))
    """
)


def legacy_archive(path, metadata, state):
    """A model file of format 2 (skassoc 0.1): the weights by torch.save.

    ``state`` is a state dict, or the bytes of a torch.save archive.
    """
    if isinstance(state, bytes):
        weights = state
    else:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        weights = buffer.getvalue()
    metadata = {key: value for key, value in metadata.items() if key != "output_config"}
    metadata.update(
        format_version=2, weights_sha256=hashlib.sha256(weights).hexdigest()
    )
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(METADATA_MEMBER, json.dumps(metadata))
        archive.writestr("weights.pt", weights)
    return path


def huge_header(weights, **entry):
    """``weights`` with ``logits.weight`` declared as ``entry`` says."""
    (size,) = struct.unpack("<Q", weights[:8])
    header = json.loads(weights[8 : 8 + size])
    header["logits.weight"] = {**header["logits.weight"], **entry}
    return safetensors_bytes(header, weights[8 + size :])


@pytest.mark.skipif(
    not os.access("/proc/self/clear_refs", os.W_OK),
    reason="measures the peak memory through Linux's /proc/self/clear_refs",
)
def test_hostile_files_use_memory_of_the_order_of_their_size(saved, tmp_path):
    clf, valid, metadata, weights = saved
    bomb = b"\0" * (64 * 2**20)
    state = {k: t.detach().clone() for k, t in clf.model_.state_dict().items()}
    legacy = legacy_archive(tmp_path / "valid.legacy", metadata, state)
    # One stored float, read through a stride-0 view as 5e8 of them.
    spread = {**state, "logits.weight": torch.zeros(1).expand(10**4, 5 * 10**4)}
    hostile = {
        "wide_embedding": write_archive(
            tmp_path / "a.skassoc",
            with_network(metadata, embedding_dim=60_000),
            weights,
        ),
        "wide_hidden": write_archive(
            tmp_path / "b.skassoc",
            with_network(metadata, hidden_layer_sizes=[60_000, 60_000]),
            weights,
        ),
        "wide_classes": write_archive(
            tmp_path / "c.skassoc",
            {**metadata, "classes": {"dtype": "<U10000000", "values": ["a", "b"]}},
            weights,
        ),
        "many_wide_classes": write_archive(
            tmp_path / "c2.skassoc", {**metadata, "classes": wide_classes()}, weights
        ),
        "metadata_bomb": write_archive(
            tmp_path / "d.skassoc", {**metadata, "pad": " " * (256 * 2**20)}, weights
        ),
        "weights_bomb": write_archive(
            tmp_path / "e.skassoc",
            metadata,
            bomb,
            weights_compression=zipfile.ZIP_DEFLATED,
        ),
        "claims_5e8_values": write_archive(
            tmp_path / "f.skassoc",
            metadata,
            huge_header(weights, shape=[5 * 10**8], data_offsets=[0, 2 * 10**9]),
        ),
        "claims_overflowing_shape": write_archive(
            tmp_path / "g.skassoc",
            metadata,
            huge_header(weights, shape=[2**62, 2**62, 16]),
        ),
        "claims_5e8_byte_header": write_archive(
            tmp_path / "h.skassoc",
            metadata,
            struct.pack("<Q", 5 * 10**8) + weights[8:],
        ),
        "stride_0_view_of_format_2": legacy_archive(
            tmp_path / "i.legacy", metadata, spread
        ),
    }
    result = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(valid), str(legacy)]
        + [str(path) for path in hostile.values()],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        check=True,
    )
    growth = json.loads(result.stdout)
    assert growth["control"][1] >= 60 * 2**20, growth["control"]
    for name, path in hostile.items():
        outcome, grown = growth[str(path)]
        size = os.path.getsize(path)
        assert outcome == "refused", name
        assert grown <= 16 * 2**20 + 8 * size, (name, grown, size)


# ------------------------------------------------ the weights' header


@pytest.mark.parametrize(
    "entry, match",
    [
        ({"shape": [5 * 10**8], "data_offsets": [0, 2 * 10**9]}, "do not fit"),
        ({"shape": [2**62, 2**62, 16]}, "do not fit"),
        ({"shape": [10, 16], "dtype": "F64"}, "F64, the network needs"),
        ({"shape": "10x16"}, "bad header entry"),
        ({"shape": [10, -16]}, "bad header entry"),
        ({"dtype": 4}, "bad header entry"),
    ],
)
def test_no_tensor_is_read_before_its_header_fits_the_network(
    saved, tmp_path, monkeypatch, entry, match
):
    _, _, metadata, weights = saved
    path = write_archive(
        tmp_path / "m.skassoc", metadata, huge_header(weights, **entry)
    )
    reads = []
    monkeypatch.setattr(safetensors.torch, "load", lambda *a: reads.append(a))
    refused(path, match)
    assert reads == []


def test_header_attacks_are_refused(saved, tmp_path):
    _, _, metadata, weights = saved
    (size,) = struct.unpack("<Q", weights[:8])
    header = json.loads(weights[8 : 8 + size])
    data = weights[8 + size :]
    cases = {
        "longer than the member": (struct.pack("<Q", 10**6) + weights[8:], "declares"),
        "over the limit": (
            struct.pack("<Q", MAX_HEADER_BYTES + 1)
            + b" " * (MAX_HEADER_BYTES + 1)
            + data,
            "declares a header",
        ),
        "not json": (struct.pack("<Q", 4) + b"{{{{" + data, "not valid JSON"),
        "a list": (safetensors_bytes([1, 2], data), "not a JSON object"),
        "a name twice": (
            struct.pack("<Q", size + 2 + len('"logits.bias":{}'))
            + weights[8 : 7 + size]
            + b',"logits.bias":{}}'
            + data,
            "twice",
        ),
        "overlapping data": (
            safetensors_bytes(
                {
                    **header,
                    "logits.bias": {
                        **header["logits.bias"],
                        "data_offsets": header["logits.weight"]["data_offsets"][:1]
                        + [header["logits.weight"]["data_offsets"][0] + 40],
                    },
                },
                data,
            ),
            "not a valid safetensors buffer",
        ),
        "data past the tensors": (weights + b"\0" * 64, "not a valid safetensors"),
        "the file's metadata": (
            safetensors_bytes({**header, "__metadata__": {"a": "b"}}, data),
            "holds a __metadata__ entry",
        ),
    }
    for evil, match in cases.values():
        path = write_archive(tmp_path / "m.skassoc", metadata, evil)
        with pytest.raises(ValueError, match=match):
            SemiSupervisedAssociationClassifier.load(path, device="cpu")


def test_a_long_shape_in_the_header_is_quoted_short(saved, tmp_path):
    _, _, metadata, weights = saved
    path = write_archive(
        tmp_path / "m.skassoc", metadata, huge_header(weights, shape=[7] * 100_000)
    )
    with pytest.raises(ValueError, match="do not fit") as error:
        SemiSupervisedAssociationClassifier.load(path, device="cpu")
    assert len(str(error.value)) < 600


# ------------------------------------------------- pickles of formats 1 and 2


def _binunicode(text):
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def _state_dict_pickle(shape, stride):
    """A torch.save pickle of ``{"logits.bias": tensor}``, by hand.

    ``shape`` and ``stride`` are the pickle opcodes of the two tuples, so
    that a size can be stored once and repeated through the memo.
    """
    storage = (
        b"(" + _binunicode("storage") + b"ctorch\nFloatStorage\n"
        + _binunicode("0") + _binunicode("cpu") + b"K\x00tQ"
    )  # fmt: skip
    return (
        b"\x80\x02}" + _binunicode("logits.bias")
        + b"ctorch._utils\n_rebuild_tensor_v2\n(" + storage + b"K\x00"
        + shape + stride
        + b"\x89ccollections\nOrderedDict\n)RtRs."
    )  # fmt: skip


def _torch_archive(pickle_bytes):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", pickle_bytes)
        archive.writestr("archive/byteorder", b"little")
        archive.writestr("archive/data/0", b"")
        archive.writestr("archive/version", b"3\n")
    return buffer.getvalue()


def test_a_shape_of_many_huge_sizes_is_refused_before_any_arithmetic(saved, tmp_path):
    # Two thousand sizes of 2,000 bits then a 0: their product would be 0
    # after quadratic work, and each of them was quoted in the message.
    _, _, metadata, _ = saved
    huge = b"\x8a\xff" + b"\xff" * 254 + b"\x7f"  # LONG1, 255 bytes
    n = 2000
    shape = b"(" + huge + b"q\x00" + b"h\x00" * (n - 1) + b"K\x00t"
    stride = b"(K\x01q\x01" + b"h\x01" * n + b"t"
    weights = _torch_archive(_state_dict_pickle(shape, stride))
    old = legacy_archive(tmp_path / "old.skassoc", metadata, weights)
    with pytest.raises(ValueError, match="2001 dimensions or sizes out of") as error:
        convert_model_file(old, tmp_path / "new.skassoc")
    assert len(str(error.value)) < 600
    assert not (tmp_path / "new.skassoc").exists()


@pytest.mark.parametrize(
    "shape, stride, match",
    [
        # A size beyond any network's, in few dimensions.
        (b"(\x8a\x06\x00\x00\x00\x00\x00\x01t", b"(K\x01t", "out of bounds"),
        # Nine dimensions, each of size 1: no network's tensor has as many.
        (b"(" + b"K\x01" * 9 + b"t", b"(" + b"K\x01" * 9 + b"t", "9 dimensions"),
        # Few small sizes, but none of the network's shapes.
        (b"(K\x03K\x00t", b"(K\x01K\x01t", "shape \\(3, 0\\) is none of"),
    ],
    ids=["huge size", "nine dimensions", "empty"],
)
def test_legacy_shapes_are_bounded_and_matched_to_the_network(
    saved, tmp_path, shape, stride, match
):
    _, _, metadata, _ = saved
    weights = _torch_archive(_state_dict_pickle(shape, stride))
    old = legacy_archive(tmp_path / "old.skassoc", metadata, weights)
    with pytest.raises(ValueError, match=match):
        convert_model_file(old, tmp_path / "new.skassoc")


def test_an_empty_legacy_tensor_needs_the_strides_of_a_contiguous_one():
    from skassoc._io._legacy import LegacyWeightsError, read_records

    expected = {"logits.bias": ((0, 5), torch.float32)}
    buffer = io.BytesIO()
    torch.save({"logits.bias": torch.empty(0, 5)}, buffer)
    records = read_records(buffer.getvalue(), expected)
    assert records["logits.bias"].shape == (0, 5)
    # Strides (7, 3) lay out no contiguous tensor, empty or not.
    strided = torch.empty(0).as_strided((0, 5), (7, 3))
    buffer = io.BytesIO()
    torch.save({"logits.bias": strided}, buffer)
    with pytest.raises(LegacyWeightsError, match="a view"):
        read_records(buffer.getvalue(), expected)


# --------------------------------------------- what a refit may cost the user


@pytest.mark.parametrize(
    "params, match",
    [
        # The walker's labeled x labeled matrices alone: about 240 GB.
        ({"labeled_per_class": 5000}, "GiB, more than 16 GiB"),
        ({"labeled_per_class": MAX_BATCH}, "labeled samples a step, more than"),
        ({"unlabeled_batch_size": 2**20}, "parameter unlabeled_batch_size"),
        ({"max_iter": 10**7}, "parameter max_iter"),
        # In bounds one by one; the whole fit about 1e18 multiply-adds.
        (
            {
                "max_iter": MAX_STEPS,
                "unlabeled_batch_size": MAX_BATCH,
                "hidden_layer_sizes": [4096, 4096],
            },
            "multiply-adds, more than 3e\\+16",
        ),
        # A wider network than the fitted one, for the next fit.
        ({"hidden_layer_sizes": [2**16, 2**16]}, "a network of 4"),
        ({"embedding_dim": 2**16, "hidden_layer_sizes": [2**16]}, "a network of"),
    ],
)
def test_a_file_may_not_ask_a_costly_refit(saved, tmp_path, params, match):
    _, _, metadata, weights = saved
    path = write_archive(
        tmp_path / "m.skassoc", with_params(metadata, **params), weights
    )
    refused(path, match)


def test_save_refuses_what_load_would_refuse_for_its_cost(saved, tmp_path):
    clf = clone(saved[0]).set_params(labeled_per_class=5000)
    clf.__dict__.update({k: v for k, v in saved[0].__dict__.items() if k.endswith("_")})
    path = tmp_path / "m.skassoc"
    with pytest.raises(ValueError, match="Cannot save these parameters.*set_params"):
        clf.save(path)
    assert list(tmp_path.iterdir()) == []


def _image_spec(network, shape, n_classes=10):
    return ModelSpec(
        network=network,
        input_shape=shape,
        n_features=int(np.prod(shape)),
        n_classes=n_classes,
        embedding_dim=128,
    )


@pytest.mark.parametrize("name", ["paper", "consistency", "fast", "domain_adaptation"])
def test_the_recipes_are_within_the_budget(name):
    params = recipe_params(name)
    params.pop("compile", None)
    if name == "domain_adaptation":
        spec = _image_spec("svhn", (3, 32, 32))
    else:
        spec = _image_spec("mnist", (1, 28, 28))
    assert refit_cost_problem(params, spec) is None


@pytest.mark.parametrize(
    "network, shape, n_classes",
    [("stl10", (3, 96, 96), 10), ("svhn", (3, 32, 32), 100), ("mlp", None, 1000)],
)
def test_the_defaults_are_within_the_budget(network, shape, n_classes):
    if shape is None:
        spec = ModelSpec(
            network="mlp",
            input_shape=None,
            n_features=784,
            n_classes=n_classes,
            embedding_dim=128,
            hidden_layer_sizes=(256, 256),
        )
    else:
        spec = _image_spec(network, shape, n_classes)
    assert refit_cost_problem({}, spec) is None


def test_the_step_estimate_counts_the_labeled_square():
    # labeled x labeled float64 matrices: 50,000 labeled samples need at
    # least one of 20 GB, whatever the unlabeled batch.
    needed = step_memory_bytes(
        n_labeled=50_000,
        n_unlabeled=8,
        views=1,
        embedding_dim=16,
        activation_bytes=1000,
        n_parameters=10_000,
        chunk_size=None,
    )
    assert needed >= 8 * 50_000**2


def test_a_labeled_batch_set_by_hand_beyond_memory_is_refused(_digits, monkeypatch):
    # 5,000 labeled samples per class: the step's walker matrices need about
    # 240 GB; the fit must say so before the step allocates them.
    X, y = _digits
    monkeypatch.setattr(skassoc._classifier, "available_memory_bytes", lambda d: 2**36)

    def never(*args):
        raise AssertionError("the step ran: its memory was not checked")

    monkeypatch.setattr(skassoc._engine._losses, "association_matrices", never)
    clf = SemiSupervisedAssociationClassifier(
        labeled_per_class=5000,
        unlabeled_batch_size=8,
        hidden_layer_sizes=(8,),
        max_iter=1,
        device="cpu",
    )
    with pytest.raises(
        ValueError, match=r"One training step needs about 2\d\d\.\d GiB"
    ):
        clf.fit(X[:200], np.where(np.arange(200) % 4 == 0, y[:200], -1))


def test_save_refuses_metadata_that_load_would_not_read_back(
    saved, tmp_path, monkeypatch
):
    # The metadata's size limit on load holds on save too, so a saved file
    # always loads; lowered here so that an ordinary model exceeds it.
    clf = saved[0]
    monkeypatch.setattr(skassoc._io._archive, "MAX_METADATA_BYTES", 1000)
    path = tmp_path / "model.skassoc"
    with pytest.raises(ValueError, match="beyond what load reads back"):
        clf.save(path)
    assert list(tmp_path.iterdir()) == []
