"""Sparse inputs: their checks, and rows gathered from them without densifying.

A TF-IDF or count matrix of text, or one-hot categories, is mostly zeros: a
100,000 x 50,000 matrix of 0.1 % density holds 5 million values, which a
dense copy would spread over 20 GB. Such ``X`` stays a CSR matrix here
(:class:`SparseRows`). Indexing it gathers the chosen rows and *packs* them
into a small dense array of shape ``(n, 2, k)``: each row's column indices
(channel 0) and values (channel 1), padded to the longest of the ``n``
rows (``k`` values) with index 0 and value 0. Everything downstream (the
batch draws, the augmentation, chunked prediction, the held-out validation
rows) handles that array as it handles a batch of dense rows,
and the built-in ``"sparse_mlp"`` network (:mod:`skassoc._nn._sparse`)
multiplies it into its first layer sparsely. A padded entry adds ``0``
times the weights of feature 0: nothing.

Indices travel as float32 next to the values, exact for integers up to
``2**24``; wider matrices are refused.
"""

import numpy as np
from scipy import sparse
from sklearn.utils.validation import validate_data

__all__ = [
    "MAX_SPARSE_FEATURES",
    "SPARSE_NETWORKS",
    "SparseRows",
    "check_sparse_fit_options",
    "check_sparse_model",
    "check_sparse_network",
    "is_sparse",
    "pack_rows",
    "validate_sparse_rows",
]

#: The widest sparse ``X``: its column indices travel as float32 (see above).
MAX_SPARSE_FEATURES = 2**24
#: The built-in networks that take sparse rows.
SPARSE_NETWORKS = ("sparse_mlp",)
#: The sparse formats accepted as they are (CSC is converted to CSR once).
ACCEPTED_FORMATS = ("csr", "csc")


def is_sparse(X):
    """Whether ``X`` is a SciPy sparse matrix or array."""
    return sparse.issparse(X)


def validate_sparse_rows(probe, X, y=None, *, reset=True):
    """scikit-learn's checks of a sparse ``X`` (and ``y``); ``X`` as CSR float32.

    CSR and CSC matrices and arrays are accepted (CSC is converted to CSR:
    one copy); other formats are refused with advice, as their conversion
    costs memory that the caller should see. The result is a copy of its
    own in canonical form: sorted indices, duplicates summed, no stored
    zeros, so that its rows pack the same way whatever the input's layout.

    Parameters
    ----------
    probe : estimator
        Carries (``reset=False``) or receives (``reset=True``) the number
        of features, as for ``validate_data``.
    X : sparse matrix or array
    y : array-like, default=None
        Checked with ``X`` when given.
    reset : bool, default=True
        Whether ``X`` is a training ``X``.

    Returns
    -------
    rows : scipy.sparse.csr_matrix or csr_array
        A float64 or float32 copy (the caller checks the magnitude of the
        values, then narrows them to float32).
    y : ndarray or None
    """
    if X.format not in ACCEPTED_FORMATS:
        raise TypeError(
            f"X is a sparse matrix in {X.format.upper()} format; skassoc "
            "takes CSR or CSC (the formats that TfidfVectorizer and "
            "OneHotEncoder return). Convert it once with X.tocsr()."
        )
    if y is None:
        rows = validate_data(
            probe, X, accept_sparse="csr", dtype=(np.float32, np.float64), reset=reset
        )
    else:
        rows, y = validate_data(
            probe,
            X,
            y,
            accept_sparse="csr",
            dtype=(np.float32, np.float64),
            y_numeric=False,
            reset=reset,
        )
    if rows.shape[1] > MAX_SPARSE_FEATURES:
        raise ValueError(
            f"Sparse X has {rows.shape[1]:,} features; skassoc's sparse network "
            f"takes up to {MAX_SPARSE_FEATURES:,} (2**24), whose indices it "
            "stores exactly in float32. Use fewer features, e.g. "
            "HashingVectorizer(n_features=2**20) or TfidfVectorizer(min_df=2)."
        )
    # A copy of our own (check_array copies only to convert): canonicalised
    # in place below, never the caller's matrix.
    rows = rows.copy() if rows is X else rows
    rows.sum_duplicates()
    rows.eliminate_zeros()
    return rows, y


def check_sparse_network(network):
    """Refuse a network that cannot take sparse rows, with advice.

    Parameters
    ----------
    network : str
        The resolved network's name, or ``"custom"``.

    Raises
    ------
    ValueError
        Unless ``network`` is in :data:`SPARSE_NETWORKS`.
    """
    if network in SPARSE_NETWORKS:
        return
    if network == "custom":
        why = (
            "a custom torch.nn.Module receives dense float batches, and sparse "
            "X reaches only the built-in network 'sparse_mlp'"
        )
    elif network == "mlp":
        why = (
            "network='mlp' standardises every feature (it subtracts the "
            "feature's mean), which would make every zero of X nonzero"
        )
    else:
        why = f"network={network!r} embeds images, not sparse rows of features"
    raise ValueError(
        f"X is sparse, but {why}. Use network='auto' or 'sparse_mlp' (it "
        "divides every value by the rows' typical length, which keeps zeros "
        "zero), or pass X.toarray() if the dense matrix fits in memory."
    )


def check_sparse_model(network):
    """Refuse sparse ``X`` at prediction for a model whose network takes dense
    rows only (``network``: the fitted network's name, or ``"custom"``)."""
    if network in SPARSE_NETWORKS:
        return
    raise ValueError(
        f"X is sparse, but this model's network ({network!r}) was fitted on "
        "dense inputs and takes dense ones. Pass X.toarray() (a chunk of rows "
        "at a time if the whole would not fit in memory), or refit the model "
        "on sparse X (network='auto' or 'sparse_mlp')."
    )


def check_sparse_fit_options(estimator):
    """Refuse the options that cannot train on sparse batches, with advice.

    A sparse batch is as wide as its longest row, so its shape changes from
    step to step: a captured CUDA graph cannot replay it, and a compiled
    network would compile again for every new width.
    """
    if estimator.cuda_graph is True:
        raise ValueError(
            "cuda_graph=True cannot train on sparse X: each step's batch is as "
            "wide as its longest row, a shape a captured graph cannot replay. "
            "Leave cuda_graph='auto' (off for sparse X) or set it to False."
        )
    if isinstance(estimator.compile, dict) or estimator.compile:
        raise ValueError(
            "compile cannot train on sparse X: each step's batch is as wide as "
            "its longest row, and the network would compile again for every "
            "new width. Leave compile=False."
        )


def pack_rows(rows):
    """CSR ``rows`` as a float32 array of shape ``(n, 2, k)`` (see the module).

    Channel 0 holds each row's column indices, channel 1 its values, in the
    row's order; ``k`` is the largest number of values in a row (at least 1),
    and shorter rows are padded with index 0 and value 0.
    """
    n = rows.shape[0]
    lengths = np.diff(rows.indptr)
    width = max(1, int(lengths.max(initial=0)))
    packed = np.zeros((n, 2, width), dtype=np.float32)
    row_of_value = np.repeat(np.arange(n), lengths)
    # Each value's place in its row: its position minus its row's start.
    place = np.arange(rows.nnz) - np.repeat(rows.indptr[:-1], lengths)
    packed[row_of_value, 0, place] = rows.indices
    packed[row_of_value, 1, place] = rows.data
    return packed


class SparseRows:
    """Training or prediction rows held sparse; indexing packs the chosen rows.

    ``rows[indices]`` (a slice, or an array of row indices) returns those
    rows packed by :func:`pack_rows`: what a batch draw, a prediction chunk
    and the held-out validation rows read. Only those rows are ever made
    dense-shaped, and only over their own nonzeros.

    Parameters
    ----------
    matrix : scipy.sparse.csr_matrix or csr_array
        Float32 rows in canonical form (see :func:`validate_sparse_rows`).
    """

    #: Read as 2-D feature rows wherever a layout is chosen (never images).
    ndim = 2

    def __init__(self, matrix):
        self.matrix = matrix

    @property
    def shape(self):
        """``(n_samples, n_features)``, the matrix's."""
        return self.matrix.shape

    @property
    def dtype(self):
        return self.matrix.dtype

    def __len__(self):
        return self.matrix.shape[0]

    def __getitem__(self, rows):
        return pack_rows(self.matrix[rows])

    def __repr__(self):
        n, d = self.shape
        return f"SparseRows({n} x {d}, {self.matrix.nnz} stored values)"

    def row_lengths(self):
        """How many values each row stores."""
        return np.diff(self.matrix.indptr)
