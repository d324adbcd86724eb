"""Which torch device a ClientApp trains on: `device=auto|cpu|cuda`, Ray's GPU assignment respected.

In a `flwr run` simulation every ClientApp runs in a Ray actor that holds the federation's
`client-resources` (e.g. `num-gpus = 0.25`). Ray tells the actor which GPU(s) it was given
(`ray.get_gpu_ids()`) and normally restricts `CUDA_VISIBLE_DEVICES` to them, so the first visible
device is the assigned one; several actors given a fraction of one GPU share it. `auto` therefore takes
a GPU only when Ray assigned one: an actor given no GPU trains on the CPU even where CUDA devices are
visible (Ray announces that it will stop hiding them from zero-GPU actors), so no client lands on a GPU
that the scheduler did not reserve for it. Outside Ray (deployed SuperNodes, in-process federations)
`auto` is cuda when torch sees a device, else cpu.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch


class DeviceError(RuntimeError):
    """The requested device cannot be used on this node."""


@dataclass(frozen=True)
class DeviceFacts:
    """What the device choice depends on: the GPUs torch sees (`cuda_count`), the GPU ids Ray assigned
    to this worker (None outside a Ray worker) and `CUDA_VISIBLE_DEVICES` (None when unset)."""

    cuda_count: int
    ray_gpu_ids: tuple[str, ...] | None = None
    visible_devices: str | None = None


def ray_gpu_ids() -> tuple[str, ...] | None:
    """The GPU ids Ray assigned to this task or actor; None when this process is not a Ray worker
    (Ray is never imported here: a Ray worker has it loaded already)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    from ray._private.worker import WORKER_MODE, global_worker

    if global_worker.mode != WORKER_MODE:
        return None
    return tuple(str(gpu) for gpu in ray.get_gpu_ids())


def current_facts() -> DeviceFacts:
    """The facts of this process."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return DeviceFacts(count, ray_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"))


def _visible_index(gpu: str, visible: str | None) -> int:
    """torch's index of physical GPU `gpu`: its position in CUDA_VISIBLE_DEVICES (Ray restricted it
    to the assigned GPUs) or, where nothing restricts visibility, the id itself."""
    if visible is not None and visible.strip():
        listed = [part.strip() for part in visible.split(",")]
        if gpu in listed:
            return listed.index(gpu)
    return int(gpu)


def choose_device(choice: str, facts: DeviceFacts) -> str:
    """The device string (`cpu`, `cuda:<i>`) for `choice` under `facts`; a DeviceError saying what to
    change when the choice cannot be honoured."""
    if choice not in ("auto", "cpu", "cuda"):
        raise DeviceError(f"run config: key 'device' = {choice!r} is invalid; allowed: auto, cpu, cuda")
    if choice == "cpu":
        return "cpu"
    assigned: Sequence[str] | None = facts.ray_gpu_ids
    if assigned is not None:  # a Ray worker: the GPUs Ray reserved for this ClientApp
        if not assigned:
            if choice == "cuda":
                raise DeviceError(
                    "device='cuda' was requested but Ray gave this ClientApp no GPU: set the "
                    "federation's client-resources num-gpus > 0 (e.g. --federation-config "
                    "\"client-resources-num-gpus=0.25\")")
            return "cpu"
        if facts.cuda_count == 0:
            raise DeviceError(
                f"Ray assigned GPU {', '.join(assigned)} to this ClientApp but torch sees no CUDA "
                "device (a CPU-only torch build, or no driver on this Ray node): install a CUDA "
                "build of torch there, or set client-resources num-gpus = 0")
        index = _visible_index(assigned[0], facts.visible_devices)
        if index >= facts.cuda_count:
            raise DeviceError(
                f"Ray assigned GPU {assigned[0]} but torch sees only {facts.cuda_count} device(s) "
                f"(CUDA_VISIBLE_DEVICES={facts.visible_devices!r})")
        return f"cuda:{index}"
    if facts.cuda_count > 0:
        return "cuda:0"
    if choice == "cuda":
        raise DeviceError("device='cuda' was requested but this node has no CUDA device")
    return "cpu"


def resolve_device(choice: str) -> torch.device:
    """The torch device for the run config's `device` in this process (`choose_device`)."""
    return torch.device(choose_device(choice, current_facts()))
