"""save_model / load_model: exact round trips, and no code run on load."""

import copy
import hashlib
import io
import json
import os
import pathlib
import pickle
import stat
import tempfile
import threading
import zipfile

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.datasets import load_digits
from sklearn.exceptions import NotFittedError
from torch import nn

import skassoc
import skassoc._io._limits
import skassoc._io._metadata
import skassoc._io._model_file
from skassoc import SemiSupervisedAssociationClassifier
from skassoc._io._format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    LEGACY_WEIGHTS_MEMBER,
    METADATA_MEMBER,
    WEIGHTS_MEMBER,
)

load_model = SemiSupervisedAssociationClassifier.load


def save_model(estimator, path):
    estimator.save(path)


INVALID = "is not a valid skassoc model file"


def small_classifier(**params):
    defaults = dict(
        hidden_layer_sizes=(32,),
        embedding_dim=16,
        labeled_per_class=5,
        unlabeled_batch_size=32,
        max_iter=30,
        learning_rate=1e-2,
        device="cpu",
        random_state=0,
    )
    return SemiSupervisedAssociationClassifier(**{**defaults, **params})


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    X, y = X[:300], y[:300]
    # Half the labels hidden: the semi-supervised case the format must carry.
    y_semi = np.where(np.random.RandomState(0).rand(len(y)) < 0.5, y, -1)
    return X, y_semi


@pytest.fixture(scope="module")
def fitted_mlp(digits):
    X, y = digits
    return small_classifier().fit(X, y)


@pytest.fixture
def saved(fitted_mlp, tmp_path):
    path = tmp_path / "model.skassoc"
    save_model(fitted_mlp, path)
    return path


def read_members(path, weights_member=WEIGHTS_MEMBER):
    with zipfile.ZipFile(path) as archive:
        return json.loads(archive.read(METADATA_MEMBER)), archive.read(weights_member)


def write_members(path, metadata=None, weights=None):
    """Write a model archive by hand, as an attacker or a bad disk might."""
    with zipfile.ZipFile(path, "w") as archive:
        if metadata is not None:
            text = metadata if isinstance(metadata, str) else json.dumps(metadata)
            archive.writestr(METADATA_MEMBER, text)
        if weights is not None:
            archive.writestr(WEIGHTS_MEMBER, weights)


def assert_same_model(loaded, original, X):
    for name in ["network_", "embedding_dim_", "n_features_in_", "n_iter_"]:
        assert getattr(loaded, name) == getattr(original, name), name
    assert loaded.classes_.dtype == original.classes_.dtype
    np.testing.assert_array_equal(loaded.classes_, original.classes_)
    assert loaded.input_shape_ == original.input_shape_
    assert loaded.history_ == original.history_
    assert loaded.get_params() == original.get_params()
    # Tuples come back as tuples, not as JSON's lists.
    for name, value in original.get_params().items():
        assert type(loaded.get_params()[name]) is type(value), name
    np.testing.assert_array_equal(loaded.predict_proba(X), original.predict_proba(X))
    np.testing.assert_array_equal(loaded.transform(X), original.transform(X))
    np.testing.assert_array_equal(loaded.predict(X), original.predict(X))
    state, original_state = loaded.model_.state_dict(), original.model_.state_dict()
    assert state.keys() == original_state.keys()
    for key, tensor in original_state.items():
        torch.testing.assert_close(state[key].cpu(), tensor.cpu(), rtol=0, atol=0)
    assert not loaded.model_.training


# ------------------------------------------------------------ round trips


def test_round_trip_mlp(fitted_mlp, saved, digits):
    loaded = load_model(saved, device="cpu")
    assert isinstance(loaded, SemiSupervisedAssociationClassifier)
    assert loaded.device_ == torch.device("cpu")
    assert not hasattr(loaded, "feature_names_in_")
    assert_same_model(loaded, fitted_mlp, digits[0])


def test_default_device_is_auto(saved, monkeypatch):
    asked = []
    resolve = skassoc._io._model_file.resolve_device

    def record(device):
        asked.append(device)
        return resolve(device)

    monkeypatch.setattr(skassoc._io._model_file, "resolve_device", record)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert load_model(saved).device_.type == expected
    assert asked == ["auto"]


@pytest.mark.parametrize("kind", ["object", "unicode"])
def test_round_trip_string_classes_and_feature_names(kind, digits, tmp_path):
    pd = pytest.importorskip("pandas")
    X, y = digits
    names = np.array([f"digit{d}" for d in range(10)], dtype=object)
    if kind == "object":
        # What a pandas column of str gives; -1 (an int) marks unlabeled.
        y_str = np.where(y >= 0, names[np.maximum(y, 0)], -1)
        assert y_str.dtype == object
    else:
        y_str = np.where(y >= 0, names[np.maximum(y, 0)].astype(str), "-1")
        assert y_str.dtype.kind == "U"
    frame = pd.DataFrame(X, columns=[f"pixel{i}" for i in range(X.shape[1])])
    clf = small_classifier().fit(frame, y_str)
    path = tmp_path / "strings.skassoc"
    save_model(clf, path)
    loaded = load_model(path, device="cpu")
    assert loaded.classes_.dtype == clf.classes_.dtype
    assert loaded.feature_names_in_.dtype == object
    np.testing.assert_array_equal(loaded.feature_names_in_, clf.feature_names_in_)
    assert_same_model(loaded, clf, frame)
    assert loaded.predict(frame)[0] in set(names)
    np.testing.assert_array_equal(
        loaded.get_feature_names_out(), clf.get_feature_names_out()
    )


@pytest.mark.parametrize(
    "labels",
    [
        np.array([1.0, 2.0, 5.0]),
        np.array([-2.0, 0.0, 3.0], dtype=np.float32),
        np.array([3, 7, 1000], dtype=np.int32),
    ],
    ids=["float64", "float32", "int32"],
)
def test_round_trip_numeric_class_dtypes(labels, digits, tmp_path):
    X, y = digits
    keep = y < 3  # labeled samples of three classes plus the unlabeled ones
    y3 = np.where(y[keep] >= 0, labels[np.maximum(y[keep], 0)], -1)
    y3 = y3.astype(labels.dtype)
    clf = small_classifier().fit(X[keep], y3)
    assert clf.classes_.dtype == labels.dtype
    path = tmp_path / "numeric.skassoc"
    save_model(clf, path)
    loaded = load_model(path, device="cpu")
    assert_same_model(loaded, clf, X[keep])


def test_round_trip_image_network(digits, tmp_path):
    X, y = digits
    clf = small_classifier(network="mnist", input_shape=(8, 8), max_iter=20).fit(X, y)
    assert clf.network_ == "mnist" and clf.input_shape_ == (1, 8, 8)
    path = tmp_path / "image.skassoc"
    save_model(clf, path)
    loaded = load_model(path, device="cpu")
    assert_same_model(loaded, clf, X)
    # Image batches as (n, h, w) work on the loaded model as on the original.
    np.testing.assert_array_equal(
        loaded.predict_proba(X.reshape(-1, 8, 8)), clf.predict_proba(X)
    )


def test_round_trip_validation_history(digits, tmp_path):
    X, y = digits
    labeled = y != -1
    clf = small_classifier(max_iter=10, validation_interval=5)
    clf.fit(X, y, X_val=X[labeled], y_val=y[labeled])
    assert clf.history_["validation_step"] == [5, 10]
    path = tmp_path / "validated.skassoc"
    save_model(clf, path)
    loaded = load_model(path, device="cpu")
    assert_same_model(loaded, clf, X)
    assert loaded.validation_interval == 5


def test_round_trip_augmentation_settings(digits, tmp_path):
    # A dict parameter (recipe "improved" has one) is saved and read back.
    X, y = digits
    augmentation = {"affine_std": 0.05, "blur_probability": 0.0, "unlabeled": False}
    clf = small_classifier(
        input_shape=(8, 8), augmentation=augmentation, max_iter=5
    ).fit(X, y)
    path = tmp_path / "augmented.skassoc"
    save_model(clf, path)
    loaded = load_model(path, device="cpu")
    assert loaded.get_params()["augmentation"] == augmentation
    assert_same_model(loaded, clf, X)


def test_parameter_without_json_form_cannot_be_saved(fitted_mlp, tmp_path):
    clf = copy.deepcopy(fitted_mlp).set_params(augmentation={1: 0.5})
    with pytest.raises(ValueError, match="Cannot save parameter augmentation"):
        save_model(clf, tmp_path / "m.skassoc")


@pytest.mark.parametrize(
    "name, value",
    [("learning_rate", 20.0), ("tol", 1e9), ("augmentation", {"feature_noise": 101})],
)
def test_values_load_would_refuse_are_not_saved(fitted_mlp, tmp_path, name, value):
    clf = copy.deepcopy(fitted_mlp).set_params(**{name: value})
    path = tmp_path / "m.skassoc"
    with pytest.raises(ValueError, match=f"Cannot save parameter {name}=.*outside"):
        save_model(clf, path)
    assert not path.exists()


def test_architecture_comes_from_the_fitted_network(fitted_mlp, digits, tmp_path):
    # set_params after fit must not change the network that gets rebuilt.
    clf = copy.deepcopy(fitted_mlp).set_params(hidden_layer_sizes=(64, 64))
    path = tmp_path / "changed.skassoc"
    save_model(clf, path)
    loaded = load_model(path, device="cpu")
    assert loaded.hidden_layer_sizes == (64, 64)
    np.testing.assert_array_equal(
        loaded.predict_proba(digits[0]), fitted_mlp.predict_proba(digits[0])
    )


@pytest.mark.parametrize("change", [{"image_size": 10}, {"image_channels": 3}])
def test_image_format_comes_from_the_fitted_network(digits, tmp_path, change):
    # The resize of the fitted model is saved, not that of later parameters.
    X, y = digits
    images = X.reshape(-1, 8, 8)
    clf = small_classifier(network="mnist", image_size=9, max_iter=3).fit(images, y)
    expected = clf.predict_proba(images)
    clf.set_params(**change)
    path = tmp_path / "formatted.skassoc"
    save_model(clf, path)
    loaded = load_model(path, device="cpu")
    assert loaded.get_params() == clf.get_params()
    np.testing.assert_array_equal(loaded.predict_proba(images), expected)


@pytest.mark.parametrize(
    "params",
    [
        {"network": "mlp", "image_size": 12},
        {"network": "mlp", "image_channels": 3},
        {"network": "mnist", "image_channels": np.int64(3)},
    ],
)
def test_round_trip_formatted_images(digits, tmp_path, params):
    X, y = digits
    images = X.reshape(-1, 8, 8)
    clf = small_classifier(max_iter=3, **params).fit(images, y)
    save_model(clf, tmp_path / "m.skassoc")
    loaded = load_model(tmp_path / "m.skassoc", device="cpu")
    np.testing.assert_array_equal(
        loaded.predict_proba(images), clf.predict_proba(images)
    )


def test_model_without_image_format_ignores_later_format_params(digits, tmp_path):
    X, y = digits
    images = X.reshape(-1, 8, 8)
    clf = small_classifier(network="mnist", max_iter=3).fit(images, y)
    expected = clf.predict_proba(images)
    save_model(clf.set_params(image_size=12), tmp_path / "m.skassoc")
    loaded = load_model(tmp_path / "m.skassoc", device="cpu")
    np.testing.assert_array_equal(loaded.predict_proba(images), expected)


def test_loaded_model_can_warm_start_and_be_cloned(saved, digits, fitted_mlp):
    X, y = digits
    loaded = load_model(saved, device="cpu")
    assert clone(loaded).get_params() == loaded.get_params()
    loaded.set_params(warm_start=True, max_iter=10).fit(X, y)
    assert loaded.n_iter_ == 10
    # It continued from the saved weights, as the original would have.
    original = copy.deepcopy(fitted_mlp).set_params(warm_start=True, max_iter=10)
    original.fit(X, y)
    np.testing.assert_allclose(
        loaded.predict_proba(X), original.predict_proba(X), atol=1e-6
    )
    fresh = clone(loaded).set_params(warm_start=False).fit(X, y)
    assert not np.allclose(loaded.predict_proba(X), fresh.predict_proba(X))


def test_metadata_is_plain_json(fitted_mlp, saved):
    metadata, weights = read_members(saved)
    assert metadata["format"] == FORMAT_NAME
    assert metadata["format_version"] == FORMAT_VERSION
    assert metadata["skassoc_version"] == skassoc.__version__
    assert metadata["torch_version"] == str(torch.__version__)
    assert metadata["weights_sha256"] == hashlib.sha256(weights).hexdigest()
    # What reaches a compiler or the hardware is never written.
    assert "device" not in metadata["params"]
    assert "compile" not in metadata["params"]
    assert metadata["params"]["hidden_layer_sizes"] == [32]
    assert metadata["classes"]["values"] == list(range(10))
    network = metadata["network"]
    assert network["name"] == "mlp" and network["input_shape"] is None
    assert network["hidden_layer_sizes"] == [32]
    assert metadata["n_iter"] == fitted_mlp.n_iter_


def test_save_replaces_file_and_leaves_no_temporary(fitted_mlp, tmp_path):
    path = tmp_path / "model.skassoc"
    path.write_bytes(b"old contents")
    save_model(fitted_mlp, str(path))
    assert zipfile.is_zipfile(path)
    assert [p.name for p in tmp_path.iterdir()] == ["model.skassoc"]


def test_load_leaves_torch_random_state_alone(saved):
    # Building the network draws initial weights; the caller must not notice.
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    load_model(saved, device="cpu")
    torch.testing.assert_close(torch.rand(3), expected)


# ------------------------------------------------------------ safety


def test_load_runs_no_unpickler(saved, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("load unpickled something")

    for module, name in [
        (torch, "load"),
        (pickle, "load"),
        (pickle, "loads"),
        (pickle, "Unpickler"),
    ]:
        monkeypatch.setattr(module, name, refuse)
    load_model(saved, device="cpu")


class _WritesMarker:
    """An object whose unpickling runs code: it writes a marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def _pickled(payload, writer):
    if writer == "pickle":
        return pickle.dumps(payload)
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")
@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_malicious_weights_run_no_code(writer, saved, tmp_path):
    # The payload is real: plain pickle runs it.
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(_WritesMarker(control)))
    assert control.exists()

    marker = tmp_path / "marker"
    evil = _pickled({"logits.weight": _WritesMarker(marker)}, writer)
    metadata, _ = read_members(saved)
    # A matching checksum: the attacker controls the whole file, so the
    # checksum cannot be what stops this; the weights' reader must.
    metadata["weights_sha256"] = hashlib.sha256(evil).hexdigest()
    write_members(saved, metadata, evil)
    with pytest.raises(ValueError, match=INVALID):
        load_model(saved, device="cpu")
    assert not marker.exists()


# ------------------------------------------------------------ older formats


def legacy_file(path, estimator, version, weights=None):
    """A model file as earlier skassoc wrote it: format 1 or 2, torch.save weights."""
    save_model(estimator, path)
    metadata, _ = read_members(path)
    if weights is None:
        state = {
            key: tensor.detach().cpu().contiguous()
            for key, tensor in estimator.model_.state_dict().items()
        }
        weights = _pickled(state, "torch.save")
    del metadata["output_config"]
    # What earlier skassoc wrote and load never took from a file.
    metadata["params"]["device"] = "cpu"
    if version == 1:
        del metadata["class_prior"], metadata["params"]["class_prior"]
    metadata.update(
        format_version=version, weights_sha256=hashlib.sha256(weights).hexdigest()
    )
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(METADATA_MEMBER, json.dumps(metadata))
        archive.writestr(LEGACY_WEIGHTS_MEMBER, weights)
    return path


@pytest.mark.parametrize("version", [1, 2])
def test_older_formats_are_refused_with_advice(fitted_mlp, tmp_path, version):
    path = legacy_file(tmp_path / "old.skassoc", fitted_mlp, version)
    with pytest.raises(
        ValueError, match=rf"format version {version}.*torch pickle.*convert_model_file"
    ):
        load_model(path, device="cpu")


@pytest.mark.parametrize("version", [1, 2])
def test_convert_model_file_reads_older_formats(fitted_mlp, digits, tmp_path, version):
    old = legacy_file(tmp_path / "old.skassoc", fitted_mlp, version)
    new = tmp_path / "new.skassoc"
    skassoc.convert_model_file(old, new)
    metadata, _ = read_members(new)
    assert metadata["format_version"] == FORMAT_VERSION
    assert "device" not in metadata["params"]
    loaded = load_model(new, device="cpu")
    X = digits[0]
    if version == 1:
        # Written before class_prior: it predicted with equal frequencies.
        assert loaded.class_prior == "uniform"
        np.testing.assert_array_equal(loaded.class_prior_, np.full(10, 0.1))
    else:
        assert_same_model(loaded, fitted_mlp, X)
    np.testing.assert_array_equal(loaded.transform(X), fitted_mlp.transform(X))


def test_convert_model_file_in_place(fitted_mlp, digits, tmp_path):
    path = legacy_file(tmp_path / "model.skassoc", fitted_mlp, 2)
    skassoc.convert_model_file(str(path), str(path))
    assert_same_model(load_model(path, device="cpu"), fitted_mlp, digits[0])
    assert [p.name for p in tmp_path.iterdir()] == ["model.skassoc"]
    with pytest.raises(ValueError, match="already of format 3: there is nothing"):
        skassoc.convert_model_file(path, tmp_path / "again.skassoc")


def test_convert_reads_channels_last_image_weights(digits, tmp_path):
    # A contiguous copy of a channels-last conv weight with one input channel
    # keeps its odd stride on the size-1 dimension; torch.save wrote that.
    X, y = digits
    clf = small_classifier(network="mnist", input_shape=(8, 8), max_iter=3).fit(X, y)
    old = legacy_file(tmp_path / "old.skassoc", clf, 2)
    skassoc.convert_model_file(old, tmp_path / "new.skassoc")
    assert_same_model(load_model(tmp_path / "new.skassoc", device="cpu"), clf, X)


# Where the pickled code of a test would write if it ran.
MARKER = pathlib.Path(tempfile.gettempdir()) / "skassoc-test-pwned"


def _state(estimator):
    return {
        key: tensor.detach().clone()
        for key, tensor in estimator.model_.state_dict().items()
    }


@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")
@pytest.mark.parametrize(
    "change, match",
    [
        (
            lambda s: s.update({"logits.weight": _WritesMarker(MARKER)}),
            "names .*exec",
        ),
        (
            # A stride-0 view: one stored float claiming all of them.
            lambda s: s.update(
                {"logits.weight": torch.zeros(1).expand(s["logits.weight"].shape)}
            ),
            "a view",
        ),
        (
            lambda s: s.update({"logits.bias": torch.arange(20.0)[5:15]}),
            "a view",
        ),
        (
            # The network's shape, laid out column by column.
            lambda s: s.update(
                {"logits.weight": s["logits.weight"].t().contiguous().t()}
            ),
            "a view",
        ),
        (
            lambda s: s.update({"logits.weight": s["logits.weight"].double()}),
            "DoubleStorage",
        ),
        (
            lambda s: s.update({"logits.weight": torch.zeros(10, 17)}),
            "do not fit the network",
        ),
        (lambda s: s.update({"extra": s["logits.bias"]}), "share one storage"),
        (lambda s: s.update({"extra": [1.0]}), "opcode EMPTY_LIST"),
    ],
    ids=[
        "code",
        "stride-0",
        "offset",
        "transposed",
        "double",
        "shape",
        "shared",
        "list",
    ],
)
def test_convert_refuses_what_is_not_a_plain_state_dict(
    fitted_mlp, tmp_path, change, match
):
    state = _state(fitted_mlp)
    change(state)
    weights = _pickled(state, "torch.save")
    old = legacy_file(tmp_path / "old.skassoc", fitted_mlp, 2, weights=weights)
    new = tmp_path / "new.skassoc"
    with pytest.raises(ValueError, match=f"{INVALID}: .*{match}"):
        skassoc.convert_model_file(old, new)
    assert not new.exists()
    assert not MARKER.exists()


def test_convert_reads_big_endian_labels_of_older_files(fitted_mlp, digits, tmp_path):
    # Earlier skassoc wrote the labels' dtype as fit gave it; save writes
    # little-endian today, and load takes nothing else.
    old = legacy_file(tmp_path / "old.skassoc", fitted_mlp, 2)
    metadata, weights = read_members(old, LEGACY_WEIGHTS_MEMBER)
    metadata["classes"]["dtype"] = ">i8"
    with zipfile.ZipFile(old, "w") as archive:
        archive.writestr(METADATA_MEMBER, json.dumps(metadata))
        archive.writestr(LEGACY_WEIGHTS_MEMBER, weights)
    skassoc.convert_model_file(old, tmp_path / "new.skassoc")
    loaded = load_model(tmp_path / "new.skassoc", device="cpu")
    assert loaded.classes_.dtype == np.dtype("<i8")
    np.testing.assert_array_equal(
        loaded.predict(digits[0]), fitted_mlp.predict(digits[0])
    )


def test_convert_checks_the_checksum_and_todays_limits(fitted_mlp, tmp_path):
    old = legacy_file(tmp_path / "old.skassoc", fitted_mlp, 2)
    metadata, weights = read_members(old, LEGACY_WEIGHTS_MEMBER)
    with zipfile.ZipFile(old, "w") as archive:
        archive.writestr(METADATA_MEMBER, json.dumps(metadata))
        archive.writestr(LEGACY_WEIGHTS_MEMBER, weights[:-8] + b"\0" * 8)
    with pytest.raises(ValueError, match="SHA-256 of weights.pt"):
        skassoc.convert_model_file(old, tmp_path / "new.skassoc")
    # Format 2 allowed 10**7 steps; today's files may not ask for them.
    metadata["params"]["max_iter"] = 10**7
    with zipfile.ZipFile(old, "w") as archive:
        archive.writestr(METADATA_MEMBER, json.dumps(metadata))
        archive.writestr(LEGACY_WEIGHTS_MEMBER, weights)
    with pytest.raises(ValueError, match="parameter max_iter = 10000000 is outside"):
        skassoc.convert_model_file(old, tmp_path / "new.skassoc")
    assert not (tmp_path / "new.skassoc").exists()


# ------------------------------------------------------------ bad files


def test_newer_format_version_asks_to_upgrade(saved):
    metadata, weights = read_members(saved)
    metadata["format_version"] = FORMAT_VERSION + 1
    write_members(saved, metadata, weights)
    with pytest.raises(ValueError, match=rf"format version {FORMAT_VERSION + 1}.*"):
        load_model(saved, device="cpu")
    with pytest.raises(ValueError, match="Upgrade skassoc"):
        load_model(saved, device="cpu")


@pytest.mark.parametrize(
    "field, value",
    [("format", "something-else"), ("format_version", "1"), ("format_version", 0)],
)
def test_wrong_format_fields(saved, field, value):
    metadata, weights = read_members(saved)
    metadata[field] = value
    write_members(saved, metadata, weights)
    with pytest.raises(ValueError, match=INVALID):
        load_model(saved, device="cpu")


@pytest.mark.parametrize("keep", [0.5, 0.95, 10])
def test_truncated_file(saved, keep):
    data = saved.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep
    saved.write_bytes(data[:cut])
    with pytest.raises(ValueError, match=INVALID) as info:
        load_model(saved, device="cpu")
    assert str(saved) in str(info.value)


def test_tampered_weights_fail_the_checksum(saved):
    metadata, weights = read_members(saved)
    tampered = bytearray(weights)
    # Flip bytes in the tensor data near the end, past the pickle header.
    for i in range(len(tampered) - 600, len(tampered) - 590):
        tampered[i] ^= 0xFF
    write_members(saved, metadata, bytes(tampered))
    with pytest.raises(ValueError, match="SHA-256"):
        load_model(saved, device="cpu")


def test_corrupted_archive_bytes(saved):
    data = bytearray(saved.read_bytes())
    start = data.find(b"logits.weight")  # inside the stored weights member
    assert start > 0
    data[start : start + 4] = b"XXXX"
    saved.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=INVALID):
        load_model(saved, device="cpu")


@pytest.mark.parametrize("missing", [METADATA_MEMBER, WEIGHTS_MEMBER])
def test_missing_member(saved, missing):
    metadata, weights = read_members(saved)
    if missing == METADATA_MEMBER:
        write_members(saved, None, weights)
    else:
        write_members(saved, metadata, None)
    with pytest.raises(ValueError, match=f"{INVALID}: the archive has no {missing}"):
        load_model(saved, device="cpu")


@pytest.mark.parametrize("content", [b"", b"garbage, not a zip" * 100])
def test_not_a_zip(tmp_path, content):
    path = tmp_path / "garbage.skassoc"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=INVALID):
        load_model(path, device="cpu")


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "\udcff"])
def test_bad_metadata_json(saved, text):
    _, weights = read_members(saved)
    with zipfile.ZipFile(saved, "w") as archive:
        archive.writestr(METADATA_MEMBER, text.encode("utf-8", "surrogateescape"))
        archive.writestr(WEIGHTS_MEMBER, weights)
    with pytest.raises(ValueError, match=INVALID):
        load_model(saved, device="cpu")


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m["network"].update(embedding_dim=17),
        lambda m: m["network"].update(n_features=65),
        lambda m: m["network"].update(hidden_layer_sizes=[33]),
        lambda m: m["classes"]["values"].append(10),
        lambda m: m["network"].update(name="svhn"),
    ],
    ids=["embedding_dim", "n_features", "hidden", "n_classes", "network"],
)
def test_weights_that_do_not_fit_the_metadata(saved, edit):
    metadata, weights = read_members(saved)
    edit(metadata)
    write_members(saved, metadata, weights)
    with pytest.raises(ValueError, match=INVALID):
        load_model(saved, device="cpu")


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m.pop("history"),
        lambda m: m["network"].update(input_shape=[1, -8, 8]),
        lambda m: m["classes"].update(dtype="<U2", values=["abc", "d"]),
        lambda m: m["classes"].update(dtype="V8"),
        lambda m: m["params"].update(unknown_param=1),
        lambda m: m["params"].update(predict_batch_size=-3),
        lambda m: m.pop("weights_sha256"),
        lambda m: m["params"].update(hidden_layer_sizes="32"),
        lambda m: m["network"].update(image_size=[9, 9]),
    ],
    ids=[
        "no-history",
        "shape",
        "truncating-dtype",
        "void-dtype",
        "unknown-param",
        "bad-param",
        "no-checksum",
        "string-for-tuple",
        "format-of-rows",
    ],
)
def test_malformed_metadata(saved, edit):
    metadata, weights = read_members(saved)
    edit(metadata)
    write_members(saved, metadata, weights)
    with pytest.raises(ValueError, match=INVALID):
        load_model(saved, device="cpu")


def test_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path / "nowhere.skassoc", device="cpu")


# ------------------------------------------------------------ what cannot be saved


def test_custom_module_cannot_be_saved(digits, tmp_path):
    X, y = digits
    network = nn.Sequential(nn.Linear(64, 8), nn.ELU())
    clf = small_classifier(network=network, max_iter=5).fit(X, y)
    path = tmp_path / "custom.skassoc"
    with pytest.raises(ValueError, match=r"custom torch.nn.Module.*state_dict"):
        save_model(clf, path)
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


def test_unfitted_estimator_cannot_be_saved(tmp_path):
    with pytest.raises(NotFittedError):
        save_model(small_classifier(), tmp_path / "m.skassoc")


def test_random_state_instance_cannot_be_saved(fitted_mlp, tmp_path):
    clf = copy.deepcopy(fitted_mlp).set_params(random_state=np.random.RandomState(0))
    with pytest.raises(ValueError, match="random_state"):
        save_model(clf, tmp_path / "m.skassoc")


def test_unsupported_labels_cannot_be_saved(fitted_mlp, tmp_path):
    clf = copy.deepcopy(fitted_mlp)
    clf.classes_ = np.empty(10, dtype=object)
    clf.classes_[:] = [frozenset({i}) for i in range(10)]
    with pytest.raises(ValueError, match="classes_"):
        save_model(clf, tmp_path / "m.skassoc")


# ------------------------------------------------------------ devices


def test_model_saved_on_cuda_loads_on_cpu(fitted_mlp, saved, digits):
    # What a GPU machine writes: the weights are always stored on the CPU, so
    # only the metadata says "cuda".
    # Older files also stored the device parameter; it is never taken from a
    # file: the model goes where load is told.
    metadata, weights = read_members(saved)
    metadata["params"]["device"] = "cuda"
    write_members(saved, metadata, weights)
    with pytest.warns(UserWarning, match="device"):
        loaded = load_model(saved, device="cpu")
    assert loaded.device_ == torch.device("cpu")
    assert loaded.get_params()["device"] == "cpu"
    assert next(loaded.model_.parameters()).device.type == "cpu"
    np.testing.assert_array_equal(
        loaded.predict_proba(digits[0]), fitted_mlp.predict_proba(digits[0])
    )


def test_unavailable_device_is_refused(saved):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ValueError, match="CUDA is not available"):
        load_model(saved, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("input_shape", [None, (8, 8)], ids=["mlp", "mnist"])
def test_cuda_round_trip(digits, tmp_path, input_shape):
    X, y = digits
    clf = small_classifier(
        device="cuda", precision="fp32", input_shape=input_shape
    ).fit(X, y)
    path = tmp_path / "cuda.skassoc"
    save_model(clf, path)
    on_gpu = load_model(path, device="cuda")
    assert on_gpu.device_.type == "cuda"
    assert next(on_gpu.model_.parameters()).is_cuda
    np.testing.assert_allclose(
        on_gpu.predict_proba(X), clf.predict_proba(X), rtol=1e-5, atol=1e-6
    )
    on_cpu = load_model(path, device="cpu")
    assert next(on_cpu.model_.parameters()).device.type == "cpu"
    np.testing.assert_allclose(
        on_cpu.predict_proba(X), clf.predict_proba(X), rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(
        on_cpu.transform(X), clf.transform(X), rtol=1e-4, atol=1e-4
    )


def test_estimator_save_and_load_methods(fitted_mlp, digits, tmp_path):
    X, _ = digits
    path = tmp_path / "model.skassoc"
    fitted_mlp.save(path)
    loaded = SemiSupervisedAssociationClassifier.load(path, device="cpu")
    assert_same_model(loaded, fitted_mlp, X)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match="not a valid skassoc model file"):
        SemiSupervisedAssociationClassifier.load(path)


# ------------------------------------------------------------ what save writes


def test_short_labels_of_a_wide_string_dtype_round_trip(fitted_mlp, digits, tmp_path):
    # np.array(..., dtype="<U2000") holding short labels: the width is not
    # stored, only what the labels need, so load accepts what save wrote.
    X, y = digits
    names = np.array([f"digit{d}" for d in range(10)], dtype="<U2000")
    y_str = np.where(y >= 0, names[np.maximum(y, 0)], "-1").astype("<U2000")
    clf = small_classifier(max_iter=3).fit(X, y_str)
    assert clf.classes_.dtype == np.dtype("<U2000")
    path = tmp_path / "wide.skassoc"
    save_model(clf, path)
    loaded = load_model(path, device="cpu")
    assert loaded.classes_.dtype.kind == "U"
    np.testing.assert_array_equal(loaded.classes_, clf.classes_)
    np.testing.assert_array_equal(loaded.predict(X), clf.predict(X))


def test_string_classes_keep_the_width_fit_gave_them(digits, tmp_path):
    # "-1" marks the unlabeled samples: fit's np.unique keeps its width.
    X, y = digits
    keep = y < 3
    letters = np.array(["a", "b", "c"])
    y_str = np.where(y[keep] >= 0, letters[np.maximum(y[keep], 0)], "-1")
    clf = small_classifier(max_iter=3).fit(X[keep], y_str)
    assert clf.classes_.dtype == np.dtype("<U2")
    path = tmp_path / "letters.skassoc"
    save_model(clf, path)
    loaded = load_model(path, device="cpu")
    assert loaded.classes_.dtype == clf.classes_.dtype
    assert loaded.predict(X[keep]).dtype == clf.predict(X[keep]).dtype
    np.testing.assert_array_equal(loaded.predict(X[keep]), clf.predict(X[keep]))


def test_string_classes_over_the_total_limit_are_narrowed_then_refused(
    fitted_mlp, tmp_path, monkeypatch
):
    clf = copy.deepcopy(fitted_mlp)
    clf.classes_ = np.array([f"d{i}" for i in range(10)], dtype="<U8")
    # 10 labels x 8 characters are over this limit, x 2 (the longest) within.
    monkeypatch.setattr(skassoc._io._metadata, "MAX_LABEL_ARRAY_CHARS", 30)
    save_model(clf, tmp_path / "narrowed.skassoc")
    loaded = load_model(tmp_path / "narrowed.skassoc", device="cpu")
    assert loaded.classes_.dtype == np.dtype("<U2")
    np.testing.assert_array_equal(loaded.classes_, clf.classes_)
    monkeypatch.setattr(skassoc._io._metadata, "MAX_LABEL_ARRAY_CHARS", 15)
    with pytest.raises(ValueError, match="10 string classes of up to 2 characters"):
        save_model(clf, tmp_path / "refused.skassoc")
    assert not (tmp_path / "refused.skassoc").exists()


def test_big_endian_labels_are_saved_little_endian(digits, tmp_path):
    X, y = digits
    keep = y < 3
    clf = small_classifier(max_iter=3).fit(X[keep], y[keep].astype(">i8"))
    assert clf.classes_.dtype == np.dtype(">i8")
    path = tmp_path / "big_endian.skassoc"
    save_model(clf, path)
    assert read_members(path)[0]["classes"]["dtype"] == "<i8"
    loaded = load_model(path, device="cpu")
    assert loaded.classes_.dtype == np.dtype("<i8")
    np.testing.assert_array_equal(loaded.classes_, clf.classes_)
    np.testing.assert_array_equal(loaded.predict(X), clf.predict(X))


@pytest.mark.skipif(
    np.dtype(np.longdouble).itemsize == 8, reason="long double is float64 here"
)
def test_long_double_labels_are_refused_before_writing(fitted_mlp, tmp_path):
    # Their size depends on the platform: a file holds float64 at most.
    clf = copy.deepcopy(fitted_mlp)
    clf.classes_ = np.arange(10, dtype=np.longdouble)
    with pytest.raises(ValueError, match="Cannot save classes_ of dtype"):
        save_model(clf, tmp_path / "long.skassoc")
    assert list(tmp_path.iterdir()) == []


def test_more_steps_than_a_file_records_are_refused_before_writing(
    fitted_mlp, tmp_path
):
    clf = copy.deepcopy(fitted_mlp)
    clf.n_iter_ = skassoc._io._limits.MAX_STEPS + 1
    with pytest.raises(ValueError, match="records at most 100000"):
        save_model(clf, tmp_path / "long.skassoc")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["unicode", "object"])
def test_labels_over_the_length_limit_are_refused_before_writing(
    fitted_mlp, tmp_path, kind
):
    clf = copy.deepcopy(fitted_mlp)
    labels = [f"{i}" + "x" * skassoc._io._limits.MAX_LABEL_CHARS for i in range(10)]
    clf.classes_ = np.array(labels, dtype=object if kind == "object" else str)
    path = tmp_path / "long.skassoc"
    with pytest.raises(ValueError, match="Cannot save classes_.*1024 characters"):
        save_model(clf, path)
    assert list(tmp_path.iterdir()) == []


def test_class_prior_tensor_that_requires_grad_saves(digits, tmp_path):
    X, y = digits
    keep = y < 2
    prior = torch.tensor([0.3, 0.7], requires_grad=True)
    clf = small_classifier(max_iter=3, class_prior=prior).fit(X[keep], y[keep])
    path = tmp_path / "prior.skassoc"
    save_model(clf, path)
    loaded = load_model(path, device="cpu")
    np.testing.assert_allclose(loaded.class_prior, [0.3, 0.7], rtol=1e-6)
    np.testing.assert_array_equal(loaded.class_prior_, clf.class_prior_)
    np.testing.assert_array_equal(loaded.predict_proba(X), clf.predict_proba(X))


@pytest.mark.parametrize("transform", ["pandas", "default"])
def test_set_output_survives_save_and_load(fitted_mlp, digits, tmp_path, transform):
    pd = pytest.importorskip("pandas")
    X, _ = digits
    clf = copy.deepcopy(fitted_mlp).set_output(transform=transform)
    path = tmp_path / "output.skassoc"
    save_model(clf, path)
    out = load_model(path, device="cpu").transform(X)
    assert isinstance(out, pd.DataFrame) == (transform == "pandas")
    assert read_members(path)[0]["output_config"] == {"transform": transform}


def test_without_set_output_the_default_output_is_kept(saved, digits):
    loaded = load_model(saved, device="cpu")
    assert isinstance(loaded.transform(digits[0]), np.ndarray)
    assert read_members(saved)[0]["output_config"] == {}


@pytest.mark.parametrize(
    "value", [{"transform": "os.system"}, {"transform": "pandas", "x": 1}, ["pandas"]]
)
def test_a_bad_output_config_is_refused(saved, value):
    metadata, weights = read_members(saved)
    metadata["output_config"] = value
    write_members(saved, metadata, weights)
    with pytest.raises(ValueError, match=f"{INVALID}: bad output_config"):
        load_model(saved, device="cpu")


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
@pytest.mark.parametrize("mode", [0o600, 0o660])
def test_save_keeps_the_permissions_of_the_file_it_replaces(fitted_mlp, tmp_path, mode):
    # A private model stays private when it is saved again.
    path = tmp_path / "private.skassoc"
    path.write_bytes(b"an older model")
    path.chmod(mode)
    previous = os.umask(0o022)
    try:
        save_model(fitted_mlp, path)
        # A new file gets the process's default (its umask).
        save_model(fitted_mlp, tmp_path / "new.skassoc")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "new.skassoc").stat().st_mode) == 0o644
    load_model(path, device="cpu")


# ------------------------------------------------------------ concurrent saves


def test_concurrent_saves_to_one_path_all_succeed(fitted_mlp, digits, tmp_path):
    # Each save first deletes the temporary files of crashed saves; it must
    # never take a live save's file, just created and not yet locked, for one.
    path = tmp_path / "model.skassoc"
    errors = []

    def save_many():
        for _ in range(20):
            try:
                save_model(fitted_mlp, path)
            except Exception as exc:  # noqa: BLE001 - collected and reported
                errors.append(exc)

    threads = [threading.Thread(target=save_many) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [p.name for p in tmp_path.iterdir()] == ["model.skassoc"]
    loaded = load_model(path, device="cpu")
    np.testing.assert_array_equal(
        loaded.predict(digits[0]), fitted_mlp.predict(digits[0])
    )
