"""Batch sampling for association training, on the training device.

Every draw has a fixed shape and uses only device random numbers, so a whole
training step (sampling included) can be captured as one CUDA graph and no
index ever travels between host and device.
"""

import warnings

import torch

from ._validation import user_stacklevel

__all__ = ["AssociationBatchSampler"]


class AssociationBatchSampler:
    """Draws a class-balanced labeled batch and an unlabeled batch.

    Parameters
    ----------
    class_indices : list of torch.Tensor
        For every class (in the order of the encoded labels), the indices of
        its labeled samples in the training tensor.
    unlabeled_indices : torch.Tensor
        Indices of the samples to draw the unlabeled batch from. When the data
        has no unlabeled samples, pass all indices (the paper's "all labels"
        setting).
    labeled_per_class : int
        Samples of every class in each labeled batch.
    unlabeled_batch_size : int
        Size of the unlabeled batch.
    device : torch.device
        Device the indices live on and the draws happen on.

    Notes
    -----
    A class with at least ``labeled_per_class`` samples contributes a random
    subset drawn without replacement (with exactly that many samples every
    batch holds all of them, as in the paper); a smaller class is drawn with
    replacement, and the constructor warns once. The unlabeled batch is drawn
    uniformly with replacement, which keeps its shape fixed for any pool size.
    """

    def __init__(
        self,
        class_indices,
        unlabeled_indices,
        labeled_per_class,
        unlabeled_batch_size,
        device,
    ):
        counts = torch.tensor([len(idx) for idx in class_indices])
        n_small = int((counts < labeled_per_class).sum())
        if n_small:
            warnings.warn(
                f"{n_small} class(es) have fewer than labeled_per_class="
                f"{labeled_per_class} labeled samples (smallest: "
                f"{int(counts.min())}); "
                "their samples are drawn with replacement. Lower labeled_per_class "
                "to silence this.",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
        n_classes = len(class_indices)
        width = int(counts.max())
        table = torch.zeros(n_classes, width, dtype=torch.long)
        for row, idx in enumerate(class_indices):
            table[row, : len(idx)] = idx.cpu()

        self.device = torch.device(device)
        self.labeled_per_class = labeled_per_class
        self.unlabeled_batch_size = unlabeled_batch_size
        self._table = table.to(self.device)
        self._counts = counts.to(self.device)
        self._padding = (torch.arange(width) >= counts[:, None]).to(self.device)
        self._with_replacement = (counts < labeled_per_class).to(self.device)
        self._unlabeled = unlabeled_indices.to(self.device)
        self.labels = torch.arange(n_classes, device=self.device).repeat_interleave(
            labeled_per_class
        )

    def sample(self):
        """Draw one pair of batches.

        Returns
        -------
        labeled : torch.Tensor of shape (n_classes * labeled_per_class,)
            Training indices of the labeled batch, grouped by class; their
            classes are :attr:`labels`.
        unlabeled : torch.Tensor of shape (unlabeled_batch_size,)
            Training indices of the unlabeled batch.
        """
        n_classes, width = self._table.shape
        k = self.labeled_per_class
        # Without replacement: the k smallest of uniform keys (padding pushed
        # past them) give a uniform random subset of each class.
        keys = torch.rand(n_classes, width, device=self.device)
        keys = keys.masked_fill(self._padding, 2.0)
        if k <= width:
            positions = keys.topk(k, dim=1, largest=False).indices
        else:
            positions = torch.zeros(n_classes, k, dtype=torch.long, device=self.device)
        # With replacement, for the classes that are too small.
        repeated = (
            torch.rand(n_classes, k, device=self.device) * self._counts[:, None]
        ).long()
        # float rounding of rand * count may reach count itself.
        repeated = torch.minimum(repeated, self._counts[:, None] - 1)
        positions = torch.where(self._with_replacement[:, None], repeated, positions)
        labeled = self._table.gather(1, positions).reshape(-1)
        draw = torch.randint(
            len(self._unlabeled), (self.unlabeled_batch_size,), device=self.device
        )
        return labeled, self._unlabeled[draw]
