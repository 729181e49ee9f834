"""Where batches come from: memory-mapped pools, and chunked large batches."""

import os

import numpy as np
import pytest
import torch

import skassoc._classifier
import skassoc._engine._batches
import skassoc._engine._builtin
import skassoc._engine._optim
import skassoc._engine._sampling
import skassoc._engine._step
from skassoc import SemiSupervisedAssociationClassifier

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def make_clf(fast_params, **overrides):
    return SemiSupervisedAssociationClassifier(**{**fast_params, **overrides})


# A short CPU fit on the digits images, the same for memory maps and arrays.
SMALL_IMAGE_FIT = {
    "device": "cpu",
    "random_state": 0,
    "labeled_per_class": 2,
    "unlabeled_batch_size": 16,
    "precision": "fp32",
}


def test_memory_mapped_inputs_train_like_in_memory_ones(
    digits_images, tmp_path, write_memmap
):
    X, y = digits_images
    y_semi = np.where(np.arange(len(y)) % 4 == 0, y, -1)
    mapped = write_memmap(tmp_path / "X.npy", X)
    params = {**SMALL_IMAGE_FIT, "network": "mnist", "max_iter": 20}
    from_disk = SemiSupervisedAssociationClassifier(**params).fit(mapped, y_semi)
    in_memory = SemiSupervisedAssociationClassifier(**params).fit(X, y_semi)
    # The same draws; only the order of the rows inside the unlabeled batch
    # differs (the losses do not depend on it), so float sums differ slightly.
    np.testing.assert_allclose(
        from_disk.predict_proba(X), in_memory.predict_proba(X), atol=1e-3
    )
    assert from_disk.n_iter_ == 20


class _RecordingHostBatches(skassoc._engine._batches.HostBatches):
    inputs_seen = []

    def __init__(self, inputs, *args, **kwargs):
        type(self).inputs_seen.append(inputs)
        super().__init__(inputs, *args, **kwargs)


@pytest.mark.parametrize(
    "layout",
    ["channels_swapped_uint8", "float64_rows", "float32_grey_images"],
)
def test_memory_maps_are_used_where_they_are(
    digits_images, tmp_path, monkeypatch, layout, write_memmap
):
    # No copy, not even of views that are not contiguous (load_stl10 returns
    # one) or of float64 files, which are converted batch by batch.
    X, y = digits_images
    y_semi = np.where(np.arange(len(y)) % 4 == 0, y, -1)
    if layout == "channels_swapped_uint8":
        on_disk = np.ascontiguousarray(np.repeat(X[:, None], 3, 1).swapaxes(2, 3))
        mapped = write_memmap(tmp_path / "X.npy", on_disk)
        X_fit, X_ref = mapped.swapaxes(2, 3), np.repeat(X[:, None], 3, 1)
        params = {"network": "mnist"}
    elif layout == "float64_rows":
        X_ref = X.reshape(len(X), -1).astype(np.float64)
        X_fit = mapped = write_memmap(tmp_path / "X.npy", X_ref)
        params = {"network": "mlp"}
    else:
        X_ref = X.astype(np.float32)
        X_fit = mapped = write_memmap(tmp_path / "X.npy", X_ref)
        params = {"network": "mnist"}
    monkeypatch.setattr(_RecordingHostBatches, "inputs_seen", [])
    monkeypatch.setattr(skassoc._engine._batches, "HostBatches", _RecordingHostBatches)
    params = {**SMALL_IMAGE_FIT, **params, "max_iter": 10}
    from_disk = SemiSupervisedAssociationClassifier(**params).fit(X_fit, y_semi)
    (inputs,) = _RecordingHostBatches.inputs_seen
    assert np.shares_memory(inputs, mapped)
    in_memory = SemiSupervisedAssociationClassifier(**params).fit(X_ref, y_semi)
    np.testing.assert_allclose(
        from_disk.predict_proba(X_ref), in_memory.predict_proba(X_ref), atol=1e-3
    )
    assert from_disk.n_features_in_ == in_memory.n_features_in_


@pytest.mark.parametrize(
    "dtype, value, match",
    [
        (np.float32, np.nan, "NaN or infinity"),
        (np.float64, np.inf, "NaN or infinity"),
        (np.float64, 1e39, "too large for float32"),
    ],
)
def test_bad_values_in_a_memory_map_are_refused(
    tmp_path, fast_params, dtype, value, match, write_memmap
):
    X = np.random.RandomState(0).rand(60, 4).astype(dtype)
    X[41, 2] = value
    mapped = write_memmap(tmp_path / "X.npy", X)
    clf = make_clf(fast_params)
    with pytest.raises(ValueError, match=match):
        clf.fit(mapped, np.arange(60) % 3)
    assert not hasattr(clf, "n_features_in_")


def test_memory_map_with_bad_labels_or_layout(tmp_path, fast_params, write_memmap):
    mapped = write_memmap(tmp_path / "X.npy", np.zeros((30, 4), np.float32))
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        make_clf(fast_params).fit(mapped, np.arange(29) % 3)
    with pytest.raises(ValueError, match="0 sample"):
        make_clf(fast_params).fit(mapped[:0], np.arange(0))
    # The same messages as for arrays in memory.
    with pytest.raises(ValueError, match="requires y to be passed"):
        make_clf(fast_params).fit(mapped, None)
    with pytest.raises(ValueError, match="Input contains NaN"):
        make_clf(fast_params).fit(mapped, np.array([0.0, np.nan] * 15, dtype=object))
    # A reversed view cannot be read in place; no silent copy of the file.
    with pytest.raises(ValueError, match="reversed view of a memory map"):
        make_clf(fast_params).fit(mapped[::-1], np.arange(30) % 3)


_MEMMAP_FIT = """
import numpy as np
from skassoc import SemiSupervisedAssociationClassifier

def labels(n):
    y = np.full(n, -1)
    y[:30] = np.arange(30) % 3
    return y

def warm_up(path, params):
    small = np.asarray(np.load(path, mmap_mode="r")[:1000])
    SemiSupervisedAssociationClassifier(**params).fit(small, labels(1000))

def measured(path, params):
    X = np.load(path, mmap_mode="r")
    clf = SemiSupervisedAssociationClassifier(**params).fit(X, labels(len(X)))
    return len(clf.predict(X[:5]))
"""


@pytest.mark.skipif(
    not os.path.exists("/proc/self/status"), reason="reads Linux's /proc"
)
def test_a_memory_mapped_pool_is_never_loaded_whole(
    tmp_path, fast_params, peak_memory_growth
):
    n_samples, n_features = 200_000, 784  # 157 MB of uint8, 627 MB as float32
    rng = np.random.RandomState(0)
    mapped = np.lib.format.open_memmap(
        tmp_path / "pool.npy", mode="w+", dtype=np.uint8, shape=(n_samples, n_features)
    )
    for start in range(0, n_samples, 20_000):
        mapped[start : start + 20_000] = rng.randint(
            0, 256, (20_000, n_features), dtype=np.uint8
        )
    mapped.flush()
    del mapped
    params = {**fast_params, "max_iter": 20}
    grown_mib, predicted = peak_memory_growth(
        _MEMMAP_FIT, str(tmp_path / "pool.npy"), params
    )
    # A copy of the pool would add at least 150 MiB of private memory; the
    # fit's own working set (the feature-noise sample, the report's chunks)
    # is bounded whatever the pool's size.
    assert grown_mib < 60, f"fit grew private memory by {grown_mib:.0f} MiB"
    assert predicted == 5


class _CountingCheckpoint:
    """Wraps torch's checkpoint and counts the chunks it was asked for."""

    def __init__(self, original):
        self.original = original
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.original(*args, **kwargs)


def _with_chunk_size(monkeypatch, chunk_size):
    """Make the estimator's training runs embed in chunks of ``chunk_size``."""
    original = skassoc._classifier.resolve_fit_settings

    def resolve_fit_settings(*args, **kwargs):
        settings = original(*args, **kwargs)
        settings.training.embedding_chunk_size = chunk_size
        return settings

    monkeypatch.setattr(
        skassoc._classifier, "resolve_fit_settings", resolve_fit_settings
    )
    spy = _CountingCheckpoint(skassoc._engine._step.checkpoint)
    monkeypatch.setattr(skassoc._engine._step, "checkpoint", spy)
    return spy


def test_chunked_embedding_trains_like_one_pass(monkeypatch, fast_params, blobs_semi):
    X, y = blobs_semi
    whole = make_clf(fast_params).fit(X, y)
    # 9 labeled + 32 unlabeled samples a step, and the consistency loss's 32
    # noisy copies of the latter: chunks of 16 (four of them) and 9.
    spy = _with_chunk_size(monkeypatch, 16)
    chunked = make_clf(fast_params).fit(X, y)
    assert "consistency" in chunked.history_
    assert spy.calls == 5 * fast_params["max_iter"]
    np.testing.assert_allclose(
        chunked.predict_proba(X), whole.predict_proba(X), atol=1e-4
    )


def test_networks_with_batch_norm_are_never_chunked(
    monkeypatch, fast_params, blobs_semi
):
    X, y = blobs_semi
    spy = _with_chunk_size(monkeypatch, 16)
    network = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ELU()
    )
    clf = make_clf(fast_params, network=network).fit(X, y)
    assert spy.calls == 0
    assert clf.n_iter_ == fast_params["max_iter"]


@pytest.mark.parametrize("storage", ["array", "memory_map"])
def test_fit_deals_unlabeled_samples_in_passes(
    digits_images, tmp_path, monkeypatch, storage, write_memmap
):
    X, y = digits_images
    X, y = X[:120], y[:120]
    y_semi = np.where(np.arange(len(y)) % 3 == 0, y, -1)
    pool = set(np.flatnonzero(y_semi == -1).tolist())  # 80 images
    if storage == "memory_map":
        X = write_memmap(tmp_path / "X.npy", X)
    dealt = []
    sample = skassoc._engine._sampling.AssociationBatchSampler.sample

    def recording_sample(sampler):
        labeled, unlabeled = sample(sampler)
        dealt.append(unlabeled.tolist())
        return labeled, unlabeled

    monkeypatch.setattr(
        skassoc._engine._sampling.AssociationBatchSampler, "sample", recording_sample
    )
    params = {**SMALL_IMAGE_FIT, "network": "mnist", "unlabeled_batch_size": 30}
    clf = SemiSupervisedAssociationClassifier(
        **params, max_iter=16, unlabeled_sampling="epochs"
    ).fit(X, y_semi)
    assert clf.n_iter_ == 16
    stream = np.concatenate(dealt)
    assert len(stream) == 16 * 30
    # Six passes of 80 in 16 steps of 30, the batches straddling passes.
    for one_pass in stream.reshape(6, 80):
        assert set(one_pass.tolist()) == pool
