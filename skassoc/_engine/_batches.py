"""Where a training step's batch comes from.

:class:`DeviceBatches` keeps every training input on the training device and
gathers each batch there, so the step never touches the host (the fast path,
and the one a CUDA graph captures whole). :class:`HostBatches` leaves the
inputs where they are, e.g. a :class:`numpy.memmap` larger than memory: each
batch is drawn and gathered on the host, then copied into a fixed device
buffer that the step reads. Only the rows of the batch are ever read.
"""

import warnings

import numpy as np
import torch

from .._inputs import HELD_OUT, UNLABELED, as_tensor
from .._utils import user_stacklevel
from ._host_drawn import HostDrawnBatches
from ._sampling import AssociationBatchSampler
from ._sparse_batches import SparseBatches

__all__ = ["DeviceBatches", "HostBatches", "make_batches", "UNLABELED_POOLS"]

#: Where the unlabeled batch is drawn from (the ``unlabeled_pool`` parameter).
UNLABELED_POOLS = ("unlabeled", "all")


def make_batches(inputs, settings, loss_weights=None):
    """What draws and gathers each step's batch for ``inputs``.

    Inputs given as a memory map stay where they are and every batch is
    gathered from them on the host, as are sparse inputs
    (:class:`~skassoc._engine._sparse_batches.SparseBatches`); all other
    inputs are copied to the training device once.

    Parameters
    ----------
    inputs : TrainingData
        The validated training data.
    settings : FitSettings
        Device, batch sizes and how the unlabeled batch is drawn.
    loss_weights : ndarray of shape (n_samples,), default=None
        A factor on the classification loss of every sample (class and
        sample weights); kept on the device and gathered there by the
        labeled batch's indices.

    Returns
    -------
    batches : DeviceBatches, HostBatches or SparseBatches
    """
    encoded = inputs.encoded
    class_indices = [
        torch.as_tensor(np.flatnonzero(encoded == k))
        for k in range(len(inputs.classes))
    ]
    pool = unlabeled_pool(encoded, settings.unlabeled_pool)
    weights = None
    if loss_weights is not None:
        weights = torch.as_tensor(loss_weights, dtype=torch.float32)
        weights = weights.to(settings.device)
    # Rows gathered on the host are drawn there too, with torch's default CPU
    # generator: the gather needs the indices there, and on a CPU a fit then
    # draws the same batches however its rows are held.
    on_host = inputs.sparse or inputs.on_host
    sampler = AssociationBatchSampler(
        class_indices,
        torch.as_tensor(pool),
        settings.labeled_per_class,
        settings.unlabeled_batch_size,
        "cpu" if on_host else settings.device,
        settings.unlabeled_sampling,
    )
    if inputs.sparse:
        return SparseBatches(inputs.data, sampler, settings.device, weights=weights)
    if inputs.on_host:
        return HostBatches(inputs.data, sampler, settings.device, weights=weights)
    data = as_tensor(inputs.data).to(settings.device)
    return DeviceBatches(data, sampler, weights=weights)


def unlabeled_pool(encoded, pool):
    """Indices the unlabeled batch is drawn from; warns when ``-1`` is missing.

    ``pool="unlabeled"`` draws from the ``-1`` samples; with none, every
    sample also serves as unlabeled (the paper's "all labels" setting), with
    a warning: a ``y`` without ``-1`` is what a meta-estimator that
    re-encodes labels hands over. ``pool="all"`` draws from every sample.
    Samples held out for validation are never drawn.
    """
    trained = np.flatnonzero(encoded != HELD_OUT)
    if pool == "all":
        return trained
    unlabeled = np.flatnonzero(encoded == UNLABELED)
    if len(unlabeled):
        return unlabeled
    warnings.warn(
        "y holds no unlabeled samples (no label is -1): every sample is "
        "trained as labeled, and the unlabeled batch is drawn from all of "
        "them. If your y marks unlabeled samples with -1, a "
        "meta-estimator (cross_val_predict, StackingClassifier, "
        "VotingClassifier, CalibratedClassifierCV, ...) may have re-encoded "
        "the labels so that -1 became a class of its own: see 'Meta-estimators "
        "and -1' in the user guide. To train on fully labeled data on purpose "
        "(the paper's 'all labels' setting), set unlabeled_pool='all'.",
        UserWarning,
        stacklevel=user_stacklevel(),
    )
    return trained


class DeviceBatches:
    """Batches gathered on the device from device-resident inputs.

    Parameters
    ----------
    data : torch.Tensor
        Every training input, on the training device.
    sampler : AssociationBatchSampler
        Draws batch indices on the same device.
    weights : torch.Tensor of shape (n_samples,), default=None
        Factors on the classification loss of every sample, on the device.
    """

    def __init__(self, data, sampler, weights=None):
        self.data = data
        self.sampler = sampler
        self.labels = sampler.labels
        self.weights = weights
        self._labeled = None

    def prefetch(self):
        """Deal the next unlabeled batch when it comes in shuffled epochs.

        Otherwise nothing to do: the batch is drawn inside the step.
        """
        self.sampler.advance()

    def batch(self):
        """The labeled batch followed by the unlabeled batch, as float32."""
        labeled, unlabeled = self.sampler.sample()
        self._labeled = labeled
        return self.data[torch.cat([labeled, unlabeled])].float()

    def labeled_indices(self):
        """Training indices of the labeled rows of the last :meth:`batch`."""
        return self._labeled

    def labeled_weights(self):
        """Loss factors of the last batch's labeled rows (None: unweighted).

        Gathered on the device: capturable, no host synchronisation.
        """
        if self.weights is None:
            return None
        return self.weights[self._labeled]


class HostBatches(HostDrawnBatches):
    """Batches gathered on the host from inputs that stay there.

    Parameters
    ----------
    inputs : numpy.ndarray
        Every training input (a memory map, typically), never copied whole.
    sampler : AssociationBatchSampler
        Draws the indices on the host, as for :class:`HostDrawnBatches`.
    device : torch.device
        The training device, which holds only one batch.
    weights : torch.Tensor of shape (n_samples,), default=None
        Factors on the classification loss of every sample, on the device.

    Notes
    -----
    :meth:`prefetch` runs on the host between steps: it draws the next
    indices, gathers those rows into one of two pinned buffers and queues an
    asynchronous copy into the device buffer that :meth:`batch` returns. On a
    GPU the gathering of step ``k + 1`` thus overlaps step ``k``; the second
    pinned buffer keeps a gather from overwriting rows still being copied.
    Within a batch, unlabeled rows are read in file order, which keeps reads
    from a memory map sequential, then put back in the order drawn: the
    augmentation draws its noise row by row, so on a CPU a fit from a memory
    map equals the fit from the same array in memory (on a GPU the two draw
    their batches from different generators). :meth:`labeled_indices` are on
    the device when the batches carry weights, else on the host.
    """

    def __init__(self, inputs, sampler, device, weights=None):
        super().__init__(sampler, device, weights)
        # Read with NumPy, never viewed by torch: a read-only memory map
        # would need a copy (see as_tensor), which is what this class avoids.
        self.inputs = inputs
        dtype = as_tensor(inputs[:0]).dtype
        self.n_labeled = self.labels.shape[0]
        n_rows = self.n_labeled + sampler.unlabeled_batch_size
        shape = (n_rows, *inputs.shape[1:])
        on_gpu = self.device.type == "cuda"
        self._host_buffers = [
            torch.empty(shape, dtype=dtype, pin_memory=on_gpu)
            for _ in range(2 if on_gpu else 1)
        ]
        self._copied = [
            torch.cuda.Event() if on_gpu else None for _ in self._host_buffers
        ]
        self._device_buffer = (
            torch.empty(shape, dtype=dtype, device=self.device)
            if on_gpu
            else self._host_buffers[0]
        )
        self._turn = 0
        # The labeled rows' training indices, for the step to gather weights.
        self._labeled = torch.zeros(self.n_labeled, dtype=torch.long)
        if weights is not None:
            self._labeled = self._labeled.to(self.device)

    def prefetch(self):
        """Draw the next batch and start moving it to the device buffer."""
        self.sampler.advance()
        labeled, unlabeled = self.sampler.sample()
        in_file_order, drawn_position = unlabeled.sort()
        indices = torch.cat([labeled, in_file_order]).numpy()
        if self.weights is not None:
            # A small copy from pageable memory, staged before it returns:
            # the host need not wait for the device.
            self._labeled.copy_(labeled, non_blocking=True)
        else:
            self._labeled = labeled
        turn = self._turn
        if self._copied[turn] is not None:
            # The copy out of this pinned buffer, two steps ago, must be done.
            self._copied[turn].synchronize()
        # Fancy indexing reads only the batch's rows (and brings them to
        # native byte order); the copy into the pinned buffer is one batch.
        rows = self.inputs[indices]
        host = self._host_buffers[turn].numpy()
        host[: self.n_labeled] = rows[: self.n_labeled]
        host[self.n_labeled + drawn_position.numpy()] = rows[self.n_labeled :]
        if self._device_buffer is not self._host_buffers[turn]:
            self._device_buffer.copy_(self._host_buffers[turn], non_blocking=True)
            self._copied[turn].record()
        self._turn = (turn + 1) % len(self._host_buffers)

    def batch(self):
        """The batch of the last :meth:`prefetch`, on the device, as float32."""
        return self._device_buffer.float()
