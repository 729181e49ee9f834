"""Batches gathered from sparse training rows, which stay sparse on the host.

Each step's rows are drawn on the host, gathered from the CSR matrix and
packed (``skassoc._sparse``): a batch of a few hundred rows as wide as the
longest of them, copied to the training device. The matrix itself is never
copied to the device nor densified.
"""

import torch

from ._sampling import AssociationBatchSampler

__all__ = ["SparseBatches"]


class SparseBatches:
    """The step's packed sparse rows, gathered on the host.

    Parameters
    ----------
    rows : SparseRows
        Every training row.
    class_indices, unlabeled_indices, labeled_per_class, unlabeled_batch_size
        As for :class:`~skassoc._engine._sampling.AssociationBatchSampler`,
        which draws the indices on the host with torch's default CPU
        generator.
    device : torch.device
        The training device.
    unlabeled_sampling : {"replacement", "epochs"}, default="replacement"
    weights : torch.Tensor of shape (n_samples,), default=None
        Factors on the classification loss of every sample, on the device.

    Notes
    -----
    The indices come from the same generator, in the same order, as those of
    dense rows on a CPU (:class:`~skassoc._engine._batches.DeviceBatches`),
    so that on a CPU a fit on sparse rows draws the batches of the fit on
    the same rows made dense. The batch's width changes from step to step,
    which is why sparse fits run without a CUDA graph.
    """

    def __init__(
        self,
        rows,
        class_indices,
        unlabeled_indices,
        labeled_per_class,
        unlabeled_batch_size,
        device,
        unlabeled_sampling="replacement",
        weights=None,
    ):
        self.sampler = AssociationBatchSampler(
            class_indices,
            unlabeled_indices,
            labeled_per_class,
            unlabeled_batch_size,
            "cpu",
            unlabeled_sampling,
        )
        self.rows = rows
        self.device = torch.device(device)
        self.labels = self.sampler.labels.to(self.device)
        self.weights = weights
        self._labeled = None
        self._batch = None

    def prefetch(self):
        """Draw the next batch, gather and pack its rows, send them to the device."""
        self.sampler.advance()
        labeled, unlabeled = self.sampler.sample()
        self._labeled = labeled.to(self.device)
        packed = self.rows[torch.cat([labeled, unlabeled]).numpy()]
        self._batch = torch.from_numpy(packed).to(self.device, non_blocking=True)

    def batch(self):
        """The packed rows of the last :meth:`prefetch`, on the device."""
        return self._batch

    def labeled_indices(self):
        """Training indices of the labeled rows of the last :meth:`prefetch`."""
        return self._labeled

    def labeled_weights(self):
        """Loss factors of the current batch's labeled rows (None: unweighted)."""
        if self.weights is None:
            return None
        return self.weights[self._labeled]
