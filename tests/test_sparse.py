"""Sparse X: fits on CSR and CSC rows equal the dense fit, never densify,
and every path (predict, save, export) takes them or refuses them clearly."""

import os

import numpy as np
import pytest
import torch
from conftest import FAST_PARAMS
from scipy import sparse

from skassoc import SemiSupervisedAssociationClassifier
from skassoc._defaults import sparse_step_seconds
from skassoc._engine._sparse_augmentation import FeatureDropout
from skassoc._nn._sparse import SparseMLPNet
from skassoc._sparse import SparseRows, pack_rows

pytestmark = [
    pytest.mark.usefixtures("torch_single_thread"),
    # Tiny fits of a few dozen steps: what they learn is not the point here.
    pytest.mark.filterwarnings("ignore:fit_report_ finds this fit suspect"),
]

# The suite's fast parameters, with the network left to "auto" (which picks
# the sparse MLP for sparse rows).
SPARSE_PARAMS = {k: v for k, v in FAST_PARAMS.items() if k != "network"}


@pytest.fixture(scope="module")
def bags():
    """200 rows of 60 count features, 3 classes, about 10 % nonzero, every
    fourth labeled: ``X`` (dense float64), ``y`` and ``y_semi``."""
    rng = np.random.default_rng(0)
    y = rng.integers(3, size=200)
    rates = np.full((3, 60), 0.05)
    for k in range(3):
        rates[k, 20 * k : 20 * k + 20] = 0.25
    X = rng.poisson(rates[y]).astype(np.float64)
    y_semi = np.where(np.arange(200) % 4 == 0, y, -1)
    return X, y, y_semi


def make_clf(**params):
    return SemiSupervisedAssociationClassifier(**{**SPARSE_PARAMS, **params})


def test_a_sparse_fit_equals_the_dense_fit_of_the_same_network(bags):
    X, _, y_semi = bags
    dense = make_clf(network="sparse_mlp", augmentation=None).fit(X, y_semi)
    fitted = make_clf(augmentation=None).fit(sparse.csr_matrix(X), y_semi)
    assert fitted.network_ == "sparse_mlp"
    np.testing.assert_allclose(
        fitted.transform(sparse.csr_matrix(X)), dense.transform(X), atol=1e-5
    )
    np.testing.assert_allclose(
        fitted.predict_proba(sparse.csr_matrix(X)), dense.predict_proba(X), atol=1e-5
    )
    # Either model takes either form.
    np.testing.assert_array_equal(fitted.predict(X), dense.predict(sparse.csr_array(X)))


@pytest.mark.parametrize(
    "container",
    [sparse.csc_matrix, sparse.csr_array, sparse.csc_array],
    ids=["csc_matrix", "csr_array", "csc_array"],
)
def test_csr_and_csc_matrices_and_arrays_fit_alike(bags, container):
    X, _, y_semi = bags
    reference = make_clf(max_iter=5).fit(sparse.csr_matrix(X), y_semi)
    fitted = make_clf(max_iter=5).fit(container(X), y_semi)
    np.testing.assert_array_equal(
        fitted.predict_proba(container(X)), reference.predict_proba(X)
    )


def test_the_callers_matrix_is_left_as_it_was(bags):
    X, _, y_semi = bags
    # Unsorted indices and a stored zero: canonicalised on a copy only.
    matrix = sparse.csr_matrix(X[:, ::-1])[:, ::-1]
    matrix.data[0] = 0.0
    before = [array.copy() for array in (matrix.data, matrix.indices, matrix.indptr)]
    make_clf(max_iter=2).fit(matrix, y_semi)
    for kept, array in zip(before, (matrix.data, matrix.indices, matrix.indptr)):
        np.testing.assert_array_equal(kept, array)


@pytest.mark.parametrize("convert", ["tocoo", "tolil", "todok", "tobsr"])
def test_other_sparse_formats_are_refused_with_advice(bags, convert):
    X, _, y_semi = bags
    matrix = getattr(sparse.csr_matrix(X), convert)()
    with pytest.raises(TypeError, match=r"CSR or CSC.*X\.tocsr\(\)"):
        make_clf().fit(matrix, y_semi)


@pytest.mark.parametrize(
    "params, match",
    [
        ({"network": "mlp"}, "subtracts the feature's mean"),
        ({"network": "small"}, "embeds images"),
        ({"network": torch.nn.Linear(60, 4)}, "custom torch.nn.Module"),
        ({"input_shape": (6, 10)}, "input_shape=.* describes images"),
        ({"cuda_graph": True}, "cuda_graph=True cannot train on sparse X"),
        ({"compile": True}, "compile cannot train on sparse X"),
        ({"augmentation": {"feature_noise": 0.5}}, "feature noise would make"),
        ({"augmentation": "paper"}, "image warps need images"),
        ({"augmentation": {"feature_dropout": 1.0}}, r"in \[0, 1\)"),
    ],
)
def test_what_cannot_take_sparse_rows_is_refused_with_advice(bags, params, match):
    X, _, y_semi = bags
    with pytest.raises(ValueError, match=match):
        make_clf(**params).fit(sparse.csr_matrix(X), y_semi)


def test_a_dense_model_refuses_sparse_rows_at_prediction(bags):
    X, _, y_semi = bags
    clf = make_clf(network="mlp").fit(X, y_semi)
    with pytest.raises(ValueError, match=r"X\.toarray\(\)"):
        clf.predict(sparse.csr_matrix(X))
    with pytest.raises(ValueError, match="X_val is sparse but X is dense"):
        make_clf(network="mlp").fit(
            X, y_semi, X_val=sparse.csr_matrix(X[:20]), y_val=bags[1][:20]
        )


def test_sparse_paths_of_a_fit_and_its_model(bags, tmp_path):
    X, y, y_semi = bags
    rows = sparse.csr_matrix(X)
    clf = make_clf(early_stopping=True, validation_interval=10, class_prior="auto")
    clf.fit(rows, np.where(np.arange(200) % 2 == 0, y, -1))
    assert clf.validation_scores_ and clf.score(rows, y) > 0.5  # chance: 1/3
    clf.save(tmp_path / "sparse.skassoc")
    loaded = SemiSupervisedAssociationClassifier.load(
        tmp_path / "sparse.skassoc", device="cpu"
    )
    np.testing.assert_array_equal(loaded.predict_proba(rows), clf.predict_proba(rows))


def test_the_onnx_graph_of_a_sparse_model_takes_dense_rows(bags, tmp_path):
    pytest.importorskip("onnx")
    onnxruntime = pytest.importorskip("onnxruntime")
    from skassoc.export import export_onnx

    X, _, y_semi = bags
    clf = make_clf(max_iter=5).fit(sparse.csr_matrix(X), y_semi)
    path = export_onnx(clf, tmp_path / "sparse.onnx")
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    (proba,) = session.run(None, {"input": X.astype(np.float32)})
    np.testing.assert_allclose(proba, clf.predict_proba(X), atol=1e-5)


def test_packed_rows_hold_each_rows_nonzeros():
    matrix = sparse.csr_matrix(
        np.array([[0, 2.0, 0, 3.0], [0, 0, 0, 0], [5.0, 0, 0, 0]], dtype=np.float32)
    )
    packed = pack_rows(matrix)
    assert packed.shape == (3, 2, 2)
    dense = np.zeros((3, 4), dtype=np.float32)
    for row in range(3):
        np.add.at(dense[row], packed[row, 0].astype(int), packed[row, 1])
    np.testing.assert_array_equal(dense, matrix.toarray())
    assert SparseRows(matrix)[[2, 0]].shape == (2, 2, 2)


def test_the_network_computes_the_same_from_packed_and_dense_rows(bags):
    X, _, _ = bags
    matrix = sparse.csr_matrix(X.astype(np.float32))
    torch.manual_seed(0)
    net = SparseMLPNet(60, (16,), 8)
    net.fit_normalization(SparseRows(matrix))
    from_dense = SparseMLPNet(60, (16,), 8)
    from_dense.fit_normalization(X.astype(np.float32))
    torch.testing.assert_close(net.scale, from_dense.scale)
    packed = net(torch.from_numpy(pack_rows(matrix)))
    dense = net(torch.from_numpy(matrix.toarray()))
    torch.testing.assert_close(packed, dense, atol=1e-6, rtol=1e-5)


def test_feature_dropout_drops_nonzeros_only_and_keeps_their_mean():
    torch.manual_seed(0)
    dense = torch.zeros(400, 50)
    dense[:, ::5] = 2.0
    dropped = FeatureDropout(0.25)(dense)
    assert (dropped[dense == 0] == 0).all()
    kept = dropped[dense != 0]
    assert 0.2 < (kept == 0).float().mean() < 0.3
    assert abs(float(kept.mean()) - 2.0) < 0.1
    packed = torch.from_numpy(pack_rows(sparse.csr_matrix(dense.numpy())))
    packed[:5, 1, -3:] = 0.0  # padding
    out = FeatureDropout(0.25)(packed)
    torch.testing.assert_close(out[:, 0], packed[:, 0])
    assert (out[:5, 1, -3:] == 0).all()


def test_a_steps_nominal_cost_follows_the_rows_and_the_first_layer():
    lengths = np.full(1000, 50)
    base = sparse_step_seconds(10_000, (256,), 128, lengths, 300)
    assert sparse_step_seconds(100_000, (256,), 128, lengths, 300) > base
    assert sparse_step_seconds(10_000, (256,), 128, lengths * 10, 300) > base


_WIDE_SPARSE_FIT = """
import numpy as np
from scipy import sparse
from skassoc import SemiSupervisedAssociationClassifier

def data(n, width):
    rng = np.random.default_rng(0)
    # Built by hand: sparse.random is slow under SCIPY_ARRAY_API (conftest).
    cells = (np.repeat(np.arange(n), 8), rng.integers(width, size=8 * n))
    rows = sparse.csr_matrix((rng.random(8 * n), cells), shape=(n, width))
    return rows, np.where(np.arange(n) % 5 == 0, rng.integers(2, size=n), -1)

def warm_up(params):
    SemiSupervisedAssociationClassifier(**params).fit(*data(200, 1_000))

def measured(params):
    rows, y = data(1_000, 400_000)
    clf = SemiSupervisedAssociationClassifier(**params).fit(rows, y)
    return len(clf.predict(rows))
"""


@pytest.mark.skipif(
    not os.path.exists("/proc/self/status"), reason="reads Linux's /proc"
)
def test_a_wide_sparse_fit_never_densifies_its_rows(peak_memory_growth):
    # Dense, these rows would take 1.6 GB (float32); the fit's own memory is
    # a first layer of 400,000 x 4 weights (with Adam's state, 26 MB).
    params = {
        **SPARSE_PARAMS,
        "hidden_layer_sizes": (4,),
        "embedding_dim": 4,
        "max_iter": 3,
    }
    grown_mib, predicted = peak_memory_growth(_WIDE_SPARSE_FIT, params)
    assert grown_mib < 150, f"fit grew private memory by {grown_mib:.0f} MiB"
    assert predicted == 1_000
