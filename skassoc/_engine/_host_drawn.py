"""What batches drawn and gathered on the host share (dense and sparse rows)."""

import torch

__all__ = ["HostDrawnBatches"]


class HostDrawnBatches:
    """What batches drawn and gathered on the host share.

    Subclasses gather the rows of each draw in ``prefetch`` and set
    ``self._labeled`` to the training indices of its labeled rows.

    Parameters
    ----------
    sampler : AssociationBatchSampler
        Draws the indices on the host (``device="cpu"``), where the rows are
        gathered, with torch's default CPU generator.
    device : torch.device
        The training device.
    weights : torch.Tensor of shape (n_samples,), default=None
        Factors on the classification loss of every sample, on the device.
    """

    def __init__(self, sampler, device, weights=None):
        # The rows are gathered on the host at the indices drawn there.
        assert sampler.device.type == "cpu", "host batches need a CPU sampler"
        self.sampler = sampler
        self.device = torch.device(device)
        # The step reads the labels on the device; the sampler keeps its own.
        self.labels = sampler.labels.to(self.device)
        self.weights = weights
        self._labeled = None

    def labeled_indices(self):
        """Training indices of the labeled rows of the last ``prefetch``."""
        return self._labeled

    def labeled_weights(self):
        """Loss factors of the current batch's labeled rows (None: unweighted)."""
        if self.weights is None:
            return None
        return self.weights[self._labeled]
