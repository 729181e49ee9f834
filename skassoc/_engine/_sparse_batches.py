"""Batches gathered from sparse training rows, which stay sparse on the host.

Each step's rows are drawn on the host, gathered from the CSR matrix and
packed (``skassoc._sparse``): a batch of a few hundred rows as wide as the
longest of them, copied to the training device. The matrix itself is never
copied to the device nor densified.
"""

import torch

from ._host_drawn import HostDrawnBatches

__all__ = ["SparseBatches"]


class SparseBatches(HostDrawnBatches):
    """The step's packed sparse rows, gathered on the host.

    Parameters
    ----------
    rows : SparseRows
        Every training row.
    sampler : AssociationBatchSampler
        Draws the indices on the host, as for
        :class:`~skassoc._engine._host_drawn.HostDrawnBatches`.
    device : torch.device
        The training device.
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

    def __init__(self, rows, sampler, device, weights=None):
        super().__init__(sampler, device, weights)
        self.rows = rows
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
