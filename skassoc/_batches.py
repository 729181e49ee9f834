"""Where a training step's batch comes from.

:class:`DeviceBatches` keeps every training input on the training device and
gathers each batch there, so the step never touches the host (the fast path,
and the one a CUDA graph captures whole). :class:`HostBatches` leaves the
inputs where they are, e.g. a :class:`numpy.memmap` larger than memory: each
batch is drawn and gathered on the host, then copied into a fixed device
buffer that the step reads. Only the rows of the batch are ever read.
"""

import torch

from ._sampling import AssociationBatchSampler
from ._validation import as_tensor

__all__ = ["DeviceBatches", "HostBatches"]


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
        self.inputs = as_tensor(inputs)
        self.device = torch.device(device)
        self.labels = self.sampler.labels.to(self.device)
        self.n_labeled = self.sampler.labels.shape[0]
        shape = (self.n_labeled + unlabeled_batch_size, *self.inputs.shape[1:])
        on_gpu = self.device.type == "cuda"
        self._host_buffers = [
            torch.empty(shape, dtype=self.inputs.dtype, pin_memory=on_gpu)
            for _ in range(2 if on_gpu else 1)
        ]
        self._copied = [
            torch.cuda.Event() if on_gpu else None for _ in self._host_buffers
        ]
        self._device_buffer = (
            torch.empty(shape, dtype=self.inputs.dtype, device=self.device)
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
        torch.index_select(self.inputs, 0, indices, out=self._host_buffers[turn])
        if self._device_buffer is not self._host_buffers[turn]:
            self._device_buffer.copy_(self._host_buffers[turn], non_blocking=True)
            self._copied[turn].record()
        self._turn = (turn + 1) % len(self._host_buffers)

    def batch(self):
        """The batch of the last :meth:`prefetch`, on the device, as float32."""
        return self._device_buffer.float()
