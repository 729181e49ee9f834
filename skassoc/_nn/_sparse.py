"""The MLP for sparse rows: its first layer multiplies only their nonzeros.

:class:`SparseMLPNet` takes a batch in either of two forms and computes the
same embeddings from both: dense rows ``(n, n_features)``, or sparse rows
packed as ``(n, 2, k)`` (column indices and values of each row's nonzeros,
see :mod:`skassoc._sparse`). For packed rows the first layer is torch's
``embedding_bag`` in ``"sum"`` mode with the values as per-sample weights:
row ``i`` becomes ``sum_j v_ij * W[c_ij]``, a sparse-dense product that
reads only the weight rows of the features present, in a batch whose size
follows its nonzeros, never ``n_features``.
"""

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .._inputs import as_tensor
from .._sparse import SparseRows
from ._init import mlp_layers, xavier_init_

__all__ = ["SparseLinear", "SparseMLPNet", "is_packed"]


def is_packed(x):
    """Whether the batch ``x`` holds packed sparse rows ``(n, 2, k)``."""
    return x.ndim == 3


class SparseLinear(nn.Module):
    """A linear layer for dense rows or packed sparse rows.

    Its weight is stored ``(in_features, out_features)``, one row per input
    feature: the layout ``embedding_bag`` reads without a copy.

    Parameters
    ----------
    in_features, out_features : int
    """

    def __init__(self, in_features, out_features):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features))
        # Xavier-uniform, as every built-in layer (its bound is symmetric in
        # the two sizes, so the transposed layout changes nothing).
        nn.init.xavier_uniform_(self.weight)

    def forward(self, x):
        """``x @ weight + bias`` for dense ``(n, in_features)`` rows; for
        packed rows, the same over their nonzero values only."""
        if is_packed(x):
            columns = x[:, 0].long()
            return (
                F.embedding_bag(
                    columns, self.weight, per_sample_weights=x[:, 1], mode="sum"
                )
                + self.bias
            )
        return torch.addmm(self.bias, x, self.weight)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}"


class SparseMLPNet(nn.Module):
    """A fully connected embedding network for sparse feature rows.

    Divides every value by the typical length of a training row (the root
    mean square of the rows' Euclidean norms, learned by
    :meth:`fit_normalization`), softly bounds the result to ``input_clip``
    as :class:`~skassoc._nn._networks.MLPNet` does, then applies ELU layers;
    the last one is the embedding.

    Parameters
    ----------
    n_features : int
        Number of input features.
    hidden_layer_sizes : tuple of int, default=(256, 256)
        Widths of the hidden layers before the embedding layer.
    embedding_dim : int, default=128
        Width of the embedding.
    input_clip : float or None, default=3.0
        Scaled values ``z`` become ``input_clip * tanh(z / input_clip)``;
        None leaves them unbounded.

    Notes
    -----
    The scaling keeps every zero zero, so a sparse row stays sparse: a
    standardisation (the MLP's) would subtract each feature's mean and make
    every value of the row nonzero. One factor for all features keeps their
    relative weights, which for TF-IDF rows are the point (rare words weigh
    more); it brings rows of any kind to about unit length, the length of
    TfidfVectorizer's rows, which are thus left as they are, while counts or
    one-hot rows shrink to it. Scaling each feature by its largest magnitude
    (scikit-learn's ``MaxAbsScaler``) instead lifts every rare word to the
    weight of the most telling ones; on the corpus of the text benchmark
    (``docs/benchmarks``) it cost accuracy in an exploration (whose script
    is not in the repository), as did scaling all values up: the first
    layer's weights each move by about the learning rate per step, so
    larger inputs learn faster and noisier there. Values beyond
    the training rows' at prediction are bounded by the clip.

    The first layer (:class:`SparseLinear`) stores its weight
    ``(n_features, width)``, one row per feature; its gradient, like every
    other parameter's, is dense and Adam updates every weight each step, so
    a step's cost grows with ``n_features`` times the first width as well
    as with the nonzeros (see ``skassoc._defaults.sparse_step_seconds``).
    """

    default_l2_scale = 1e-4
    takes_hidden_layer_sizes = True
    image_input = False
    #: Its CPU work runs at the dense layers' rate (see ``_defaults``).
    cpu_rate = "dense"

    def __init__(
        self,
        n_features,
        hidden_layer_sizes=(256, 256),
        embedding_dim=128,
        input_clip=3.0,
    ):
        super().__init__()
        (_, first_width), *rest = mlp_layers(
            n_features, hidden_layer_sizes, embedding_dim
        )
        self.first = SparseLinear(n_features, first_width)
        layers = [nn.ELU()]
        for width_in, width_out in rest:
            layers += [nn.Linear(width_in, width_out), nn.ELU()]
        self.layers = nn.Sequential(*layers)
        self.input_clip = None if input_clip is None else float(input_clip)
        if self.input_clip is not None and not self.input_clip > 0:
            raise ValueError(f"input_clip must be > 0 or None; got {input_clip!r}.")
        self.register_buffer("scale", torch.tensor(1.0))
        self.register_buffer("clip", torch.tensor(self.input_clip or 0.0))
        xavier_init_(self.layers)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        clip = state_dict.get(prefix + "clip")
        if clip is not None:
            value = float(clip)
            self.input_clip = value if value > 0 else None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @classmethod
    def from_inputs(cls, input_shape, n_features, embedding_dim, hidden_layer_sizes):
        """The network for rows of ``n_features`` values, or flattened dense
        images of ``input_shape`` (as :class:`~skassoc._nn._networks.MLPNet`)."""
        n_inputs = n_features if input_shape is None else math.prod(input_shape)
        return cls(n_inputs, tuple(hidden_layer_sizes), embedding_dim)

    @classmethod
    def forward_macs(cls, input_shape, n_features, embedding_dim, hidden_layer_sizes):
        """Multiply-adds of one dense row's forward pass (its layers').

        A sparse row costs its nonzeros instead of ``n_features`` in the first
        layer: :func:`~skassoc._defaults.sparse_step_seconds` counts those.
        """
        n_inputs = n_features if input_shape is None else math.prod(input_shape)
        layers = mlp_layers(n_inputs, hidden_layer_sizes, embedding_dim)
        return sum(width_in * width_out for width_in, width_out in layers)

    @property
    def n_features(self):
        return self.first.in_features

    @property
    def hidden_layer_sizes(self):
        """Widths of the hidden layers, as built (the last is the embedding's)."""
        widths = [self.first.out_features]
        widths += [m.out_features for m in self.layers if isinstance(m, nn.Linear)]
        return tuple(widths[:-1])

    @torch.no_grad()
    def fit_normalization(self, x, input_format=None):
        """Learn the typical length of the training rows ``x``.

        Parameters
        ----------
        x : SparseRows, ndarray or numpy.memmap of shape (n, n_features)
            Training rows; sparse ones are read through their stored values,
            dense ones a few MiB at a time.
        input_format : None
            For the registry's common signature (feature rows have none).
        """
        if isinstance(x, SparseRows):
            squares = np.square(x.matrix.data, dtype=np.float64).sum()
        else:
            squares = 0.0
            rows_per_chunk = max(1, 2**18 // max(1, self.n_features))
            for start in range(0, x.shape[0], rows_per_chunk):
                chunk = as_tensor(x[start : start + rows_per_chunk]).double()
                squares += float(chunk.square().sum())
        length = math.sqrt(squares / max(1, x.shape[0]))
        # Rows that are all 0 stay unscaled.
        self.scale.fill_(length if length > 0 else 1.0)

    def _bounded(self, z):
        if self.input_clip is None:
            return z
        return self.input_clip * torch.tanh(z / self.input_clip)

    def forward(self, x):
        """Embeddings of dense rows ``(n, ...)`` or packed rows ``(n, 2, k)``."""
        if is_packed(x):
            # Scaled and bounded values next to their columns; 0 stays 0.
            x = torch.stack([x[:, 0], self._bounded(x[:, 1] / self.scale)], dim=1)
        else:
            x = self._bounded(x.flatten(1) / self.scale)
        return self.layers(self.first(x))

    def extra_repr(self):
        return f"input_clip={self.input_clip}"
