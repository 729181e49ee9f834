"""Model files from strangers: what a tampered file can and cannot do.

Each case starts from a valid file, alters it as an attacker would (the
checksum recomputed where the attacker can), and checks that loading either
refuses it with a ValueError naming the problem or keeps the change within
what a model file may set.
"""

import hashlib
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
import torch
from sklearn.base import clone

from skassoc import SemiSupervisedAssociationClassifier
from skassoc._persistence import MAX_BATCH, MAX_STEPS, METADATA_MEMBER, WEIGHTS_MEMBER

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


def state_bytes(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def tampered_weights(weights, change):
    state = torch.load(io.BytesIO(weights), weights_only=True)
    change(state)
    return state_bytes(state)


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
    ],
)
def test_parameters_outside_their_domain_are_refused(saved, tmp_path, name, value):
    _, _, metadata, weights = saved
    path = write_archive(
        tmp_path / "m.skassoc", with_params(metadata, **{name: value}), weights
    )
    refused(path, f"parameter {name} = .* outside the values")


@pytest.mark.parametrize("name", ["__class__", "callbacks", "_fit_context"])
def test_unknown_parameters_are_refused(saved, tmp_path, name):
    _, _, metadata, weights = saved
    path = write_archive(
        tmp_path / "m.skassoc", with_params(metadata, **{name: 1}), weights
    )
    refused(path, "unknown parameter")


def test_every_estimator_parameter_has_a_file_rule():
    from skassoc._persistence import NEVER_FROM_FILE, SAFE_PARAMS

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


@pytest.mark.parametrize(
    "classes, match",
    [
        ({"dtype": "<U100000", "values": ["a", "b"]}, "implausibly wide"),
        ({"dtype": "<i8", "values": list(range(100_000))}, "bad classes values"),
        ({"dtype": "<i8", "values": [1, 1, 2, 3, 4, 5, 6, 7, 8, 9]}, "do not fit"),
        ({"dtype": "|O", "values": [1, "a"]}, "bad classes values"),
        ({"dtype": "V8", "values": [1, 2]}, "unsupported classes dtype"),
        ({"dtype": "<i8", "values": list(range(11))}, "do not fit the network"),
        ({"dtype": "not a dtype", "values": [1, 2]}, "classes dtype"),
    ],
)
def test_classes_are_checked(saved, tmp_path, classes, match):
    _, _, metadata, weights = saved
    path = write_archive(
        tmp_path / "m.skassoc", {**metadata, "classes": classes}, weights
    )
    refused(path, match)


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
            lambda s: s.update({"logits.bias": s["logits.bias"].to_sparse()}),
            "tensor state dict \\(of dense tensors\\)",
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
    ).fit(images, y)
    path = tmp_path / "m.skassoc"
    clf.save(path)
    with zipfile.ZipFile(path) as archive:
        metadata = json.loads(archive.read(METADATA_MEMBER))
        weights = archive.read(WEIGHTS_MEMBER)
    old = tampered_weights(
        weights,
        lambda s: [s.pop(k) for k in list(s) if k.startswith("embedder.input_scale")],
    )
    loaded = SemiSupervisedAssociationClassifier.load(
        write_archive(path, metadata, old), device="cpu"
    )
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
    refused(path, "not a plain tensor state dict")
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
    with pytest.raises(ValueError, match="not a regular file"):
        clf.save(target)


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
            if name == "weights.pt":
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
    import json, resource, sys
    from skassoc import SemiSupervisedAssociationClassifier as C
    valid, hostile = sys.argv[1], sys.argv[2:]
    C.load(valid, device="cpu")  # warm up torch.load and friends
    growth = {}
    for path in hostile:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            C.load(path, device="cpu")
            outcome = "loaded"
        except ValueError:
            outcome = "refused"
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        growth[path] = [outcome, (after - before) * 1024]
    print(json.dumps(growth))
    """
)


def test_rejected_files_use_memory_of_the_order_of_their_size(saved, tmp_path):
    _, valid, metadata, weights = saved
    bomb = b"\0" * (64 * 2**20)
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
        "metadata_bomb": write_archive(
            tmp_path / "d.skassoc", {**metadata, "pad": " " * (256 * 2**20)}, weights
        ),
        "weights_bomb": write_archive(
            tmp_path / "e.skassoc",
            metadata,
            bomb,
            weights_compression=zipfile.ZIP_DEFLATED,
        ),
    }
    result = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(valid), *map(str, hostile.values())],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        check=True,
    )
    growth = json.loads(result.stdout)
    for name, path in hostile.items():
        outcome, grown = growth[str(path)]
        size = os.path.getsize(path)
        assert outcome == "refused", name
        assert grown <= 16 * 2**20 + 8 * size, (name, grown, size)
