"""Where a training step's batch comes from.

:class:`DeviceBatches` keeps every training input on the training device and
gathers each batch there, so the step never touches the host (the fast path,
and the one a CUDA graph captures whole). :class:`HostBatches` leaves the
inputs where they are, e.g. a :class:`numpy.memmap` larger than memory: each
batch is drawn and gathered on the host, then copied into a fixed device
buffer that the step reads. Only the rows of the batch are ever read.
"""

import numpy as np
import torch

from ._inputs import UNLABELED, as_tensor
from ._sampling import AssociationBatchSampler

__all__ = ["DeviceBatches", "HostBatches", "make_batches"]


def make_batches(inputs, settings):
    """What draws and gathers each step's batch for ``inputs``.

    Inputs given as a memory map stay where they are and every batch is
    gathered from them on the host; all other inputs are copied to the
    training device once.

    Parameters
    ----------
    inputs : TrainingData
        The validated training data.
    settings : FitSettings
        Device, batch sizes and how the unlabeled batch is drawn.

    Returns
    -------
    batches : DeviceBatches or HostBatches
    """
    encoded = inputs.encoded
    labeled = encoded != UNLABELED
    class_indices = [
        torch.as_tensor(np.flatnonzero(encoded == k))
        for k in range(len(inputs.classes))
    ]
    # The paper's "all labels" setting: with nothing unlabeled, every sample
    # also serves as unlabeled.
    pool = np.flatnonzero(~labeled) if not labeled.all() else np.arange(len(encoded))
    sampling = (
        class_indices,
        torch.as_tensor(pool),
        settings.labeled_per_class,
        settings.unlabeled_batch_size,
    )
    if inputs.on_host:
        return HostBatches(
            inputs.data, *sampling, settings.device, settings.unlabeled_sampling
        )
    sampler = AssociationBatchSampler(
        *sampling, settings.device, settings.unlabeled_sampling
    )
    return DeviceBatches(as_tensor(inputs.data).to(settings.device), sampler)


class DeviceBatches:
    """Batches gathered on the device from device-resident inputs.

    Parameters
    ----------
    data : torch.Tensor
        Every training input, on the training device.
    sampler : AssociationBatchSampler
        Draws batch indices on the same device.
    """

    def __init__(self, data, sampler):
        self.data = data
        self.sampler = sampler
        self.labels = sampler.labels

    def prefetch(self):
        """Deal the next unlabeled batch when it comes in shuffled epochs.

        Otherwise nothing to do: the batch is drawn inside the step.
        """
        self.sampler.advance()

    def batch(self):
        """The labeled batch followed by the unlabeled batch, as float32."""
        labeled, unlabeled = self.sampler.sample()
        return self.data[torch.cat([labeled, unlabeled])].float()


class HostBatches:
    """Batches gathered on the host from inputs that stay there.

    Parameters
    ----------
    inputs : numpy.ndarray
        Every training input (a memory map, typically), never copied whole.
    class_indices, unlabeled_indices, labeled_per_class, unlabeled_batch_size
        As for :class:`~skassoc._sampling.AssociationBatchSampler`, which draws
        the indices on the host with torch's default CPU generator.
    device : torch.device
        The training device, which holds only one batch.
    unlabeled_sampling : {"replacement", "epochs"}, default="replacement"
        As for :class:`~skassoc._sampling.AssociationBatchSampler`.

    Notes
    -----
    :meth:`prefetch` runs on the host between steps: it draws the next
    indices, gathers those rows into one of two pinned buffers and queues an
    asynchronous copy into the device buffer that :meth:`batch` returns. On a
    GPU the gathering of step ``k + 1`` thus overlaps step ``k``; the second
    pinned buffer keeps a gather from overwriting rows still being copied.
    Within a batch, rows are read in file order (the unlabeled batch is a
    set, so its order does not matter), which keeps reads from a memory map
    sequential.
    """

    def __init__(
        self,
        inputs,
        class_indices,
        unlabeled_indices,
        labeled_per_class,
        unlabeled_batch_size,
        device,
        unlabeled_sampling="replacement",
    ):
        self.sampler = AssociationBatchSampler(
            class_indices,
            unlabeled_indices,
            labeled_per_class,
            unlabeled_batch_size,
            "cpu",
            unlabeled_sampling,
        )
        # Read with NumPy, never viewed by torch: a read-only memory map
        # would need a copy (see as_tensor), which is what this class avoids.
        self.inputs = inputs
        dtype = as_tensor(inputs[:0]).dtype
        self.device = torch.device(device)
        self.labels = self.sampler.labels.to(self.device)
        self.n_labeled = self.sampler.labels.shape[0]
        shape = (self.n_labeled + unlabeled_batch_size, *inputs.shape[1:])
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

    def prefetch(self):
        """Draw the next batch and start moving it to the device buffer."""
        self.sampler.advance()
        labeled, unlabeled = self.sampler.sample()
        indices = torch.cat([labeled, unlabeled.sort().values])
        turn = self._turn
        if self._copied[turn] is not None:
            # The copy out of this pinned buffer, two steps ago, must be done.
            self._copied[turn].synchronize()
        # Fancy indexing reads only the batch's rows (and brings them to
        # native byte order); the copy into the pinned buffer is one batch.
        self._host_buffers[turn].numpy()[...] = self.inputs[indices.numpy()]
        if self._device_buffer is not self._host_buffers[turn]:
            self._device_buffer.copy_(self._host_buffers[turn], non_blocking=True)
            self._copied[turn].record()
        self._turn = (turn + 1) % len(self._host_buffers)

    def batch(self):
        """The batch of the last :meth:`prefetch`, on the device, as float32."""
        return self._device_buffer.float()
