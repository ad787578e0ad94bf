"""The host-to-device path: copy (non_blocking from pinned memory), finish preprocessing on the
device, and optionally copy the NEXT batch on a side CUDA stream while the current one computes
(seed 000 §6.2, "overlap compute and communication")."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from paratrain.data.transforms import resize_normalize


class DeviceLoader:
    def __init__(
        self,
        loader: Iterable,
        device: torch.device,
        *,
        dtype: torch.dtype,
        size: int | None,
        mean,
        std,
        finish_on_device: bool,
        non_blocking: bool,
        channels_last: bool,
        prefetch: bool,
    ):
        self.loader, self.device, self.dtype = loader, device, dtype
        self.size = size
        if finish_on_device:
            # On the device once: a per-batch tensor from a Python list would be a pageable copy,
            # which makes the host wait for the stream every step (2 syncs a step, profiled).
            mean = torch.as_tensor(mean, dtype=dtype, device=device)
            std = torch.as_tensor(std, dtype=dtype, device=device)
        self.mean, self.std = mean, std
        self.finish_on_device, self.non_blocking, self.channels_last = (
            finish_on_device,
            non_blocking,
            channels_last,
        )
        self.prefetch = prefetch and device.type == "cuda"

    def __len__(self) -> int:
        return len(self.loader)

    def _move(self, batch):
        x, y = batch
        x = x.to(self.device, non_blocking=self.non_blocking)
        y = y.to(self.device, non_blocking=self.non_blocking)
        if self.finish_on_device:
            x = resize_normalize(x, self.size, self.mean, self.std, self.dtype)
        elif x.dtype != self.dtype:
            x = x.to(self.dtype)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y

    def __iter__(self) -> Iterator:
        if not self.prefetch:
            for batch in self.loader:
                yield self._move(batch)
            return
        stream = torch.cuda.Stream(self.device)
        it = iter(self.loader)
        nxt = self._staged(it, stream)
        while nxt is not None:
            torch.cuda.current_stream(self.device).wait_stream(stream)
            x, y = nxt
            # The tensors were made on the side stream; tell the allocator the compute stream uses
            # them too, so their memory is not reused before the compute is done.
            x.record_stream(torch.cuda.current_stream(self.device))
            y.record_stream(torch.cuda.current_stream(self.device))
            nxt = self._staged(it, stream)
            yield x, y

    def _staged(self, it, stream):
        try:
            batch = next(it)
        except StopIteration:
            return None
        with torch.cuda.stream(stream):
            return self._move(batch)
