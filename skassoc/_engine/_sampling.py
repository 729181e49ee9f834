"""Batch sampling for association training, on the training device.

Every draw has a fixed shape and reads only device tensors, so a whole
training step (sampling included) can be captured as one CUDA graph. Drawn
with replacement, the unlabeled batch uses device random numbers only; drawn
in shuffled epochs, its indices are dealt into a device buffer by the host
before each step (:meth:`AssociationBatchSampler.advance`), which costs one
small device copy a step and, once an epoch, a shuffle on the host and a
copy of it.
"""

import warnings

import torch

from .._utils import user_stacklevel

__all__ = ["AssociationBatchSampler", "UNLABELED_SAMPLINGS"]

#: How the unlabeled batch can be drawn (see AssociationBatchSampler).
UNLABELED_SAMPLINGS = ("replacement", "epochs")


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
    unlabeled_sampling : {"replacement", "epochs"}, default="replacement"
        How the unlabeled batch is drawn. ``"replacement"``: uniformly with
        replacement, every step independently. ``"epochs"``: the pool is
        shuffled and dealt out in order, epoch after epoch (an epoch is one
        pass over the pool), so that every sample is drawn once per epoch; a
        batch may straddle two epochs (and a pool smaller than the batch is
        dealt out several times in one batch). This is what the authors'
        input queue does, and what a :class:`torch.utils.data.DataLoader`
        with ``shuffle=True`` does within an epoch. Call :meth:`advance`
        before every :meth:`sample`: :meth:`sample` hands out the batch of
        the last :meth:`advance` (zeros before the first). A new sampler
        starts a new epoch.

    Notes
    -----
    A class with at least ``labeled_per_class`` samples contributes a random
    subset drawn without replacement (with exactly that many samples every
    batch holds all of them, as in the paper); a smaller class is drawn with
    replacement, and the constructor warns once. Either way of drawing the
    unlabeled batch keeps its shape fixed for any pool size.

    The shuffles of ``"epochs"`` are drawn on the host by a CPU generator of
    the sampler's own, seeded at construction from torch's CPU generator
    (which a fit seeds): they never touch the CUDA generator that captured
    graphs hold, and fits in other threads, which reseed the global
    generators, cannot change them. Each epoch's order is copied to the
    device once; the host waits for the device there, which costs little
    when an epoch holds many batches (with a pool smaller than the batch, it
    happens several times a step).
    """

    def __init__(
        self,
        class_indices,
        unlabeled_indices,
        labeled_per_class,
        unlabeled_batch_size,
        device,
        unlabeled_sampling="replacement",
    ):
        if unlabeled_sampling not in UNLABELED_SAMPLINGS:
            raise ValueError(
                f"unlabeled_sampling must be one of {UNLABELED_SAMPLINGS}, "
                f"got {unlabeled_sampling!r}."
            )
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
        self.unlabeled_sampling = unlabeled_sampling
        if unlabeled_sampling == "replacement":
            self._unlabeled = unlabeled_indices.to(self.device)
        else:
            # The pool stays on the host, where its epochs are shuffled.
            self._unlabeled_on_host = unlabeled_indices.cpu()
            seed = int(torch.randint(2**62, (), device="cpu"))
            self._shuffles = torch.Generator(device="cpu").manual_seed(seed)
            # The current epoch (training indices in dealing order), the next
            # position in it, and the batch that sample() hands out: fixed
            # buffers, so that a captured graph reads each step's batch.
            self._epoch_order = torch.empty_like(
                self._unlabeled_on_host, device=self.device
            )
            self._epoch_position = len(self._unlabeled_on_host)
            self._unlabeled_batch = torch.zeros(
                unlabeled_batch_size, dtype=torch.long, device=self.device
            )
        self.labels = torch.arange(n_classes, device=self.device).repeat_interleave(
            labeled_per_class
        )

    def state_dict(self):
        """Where the shuffled epochs stand (empty with replacement, whose
        draws come from torch's generator alone)."""
        if self.unlabeled_sampling != "epochs":
            return {}
        return {
            "generator": self._shuffles.get_state(),
            # A copy: the live buffer changes as the epochs go on.
            "order": self._epoch_order.to("cpu", copy=True),
            "position": self._epoch_position,
        }

    def load_state_dict(self, state):
        """Continue the epochs of :meth:`state_dict`'s sampler.

        An empty state, or one of a pool of another size (the data changed
        between two fits), leaves the sampler to start a new epoch.
        """
        if self.unlabeled_sampling != "epochs" or not state:
            return
        self._shuffles.set_state(state["generator"])
        order, pool = state["order"], self._unlabeled_on_host
        # Only an order of this pool's own indices: one from other data (or
        # a file) could hold indices past its end.
        if len(order) == len(pool) and torch.equal(
            order.sort().values, pool.sort().values
        ):
            self._epoch_order.copy_(order)
            self._epoch_position = int(state["position"])

    def class_shares(self):
        """Each class's share of the labeled samples, a float tensor summing to 1."""
        return self._counts.double().div(self._counts.sum()).float()

    def advance(self):
        """Deal the next unlabeled batch of an epoch (host work, before a step).

        Does nothing when the unlabeled batch is drawn with replacement. Must
        run outside a captured graph: it shuffles a new epoch on the host when
        the current one runs out.
        """
        if self.unlabeled_sampling != "epochs":
            return
        n_pool, size = len(self._unlabeled_on_host), self.unlabeled_batch_size
        dealt = 0
        while dealt < size:
            if self._epoch_position == n_pool:
                shuffle = torch.randperm(n_pool, generator=self._shuffles, device="cpu")
                # A copy from pageable memory: the host waits for the steps
                # queued before it, once an epoch.
                self._epoch_order.copy_(self._unlabeled_on_host[shuffle])
                self._epoch_position = 0
            take = min(size - dealt, n_pool - self._epoch_position)
            start = self._epoch_position
            self._unlabeled_batch[dealt : dealt + take].copy_(
                self._epoch_order[start : start + take]
            )
            self._epoch_position += take
            dealt += take

    def sample(self):
        """Draw one pair of batches.

        Returns
        -------
        labeled : torch.Tensor of shape (n_classes * labeled_per_class,)
            Training indices of the labeled batch, grouped by class; their
            classes are :attr:`labels`.
        unlabeled : torch.Tensor of shape (unlabeled_batch_size,)
            Training indices of the unlabeled batch. In shuffled epochs,
            that of the last :meth:`advance` (the same buffer every call).
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
        if self.unlabeled_sampling == "epochs":
            return labeled, self._unlabeled_batch
        draw = torch.randint(
            len(self._unlabeled), (self.unlabeled_batch_size,), device=self.device
        )
        return labeled, self._unlabeled[draw]
