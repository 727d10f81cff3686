"""Where training computes: the device (train.device) and, under torchrun, the process group.

Data-parallel pre-training is `calo pretrain --nproc N` (which starts torchrun) or torchrun
itself around `-m calo.cli pretrain`: gloo on the CPU, NCCL on GPUs. Every process trains; only
the main one (rank 0) takes the donor's lock, logs to MLflow, saves and registers the model.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys

import torch
import torch.distributed as dist

from calo import config as cfg
from calo.errors import CaloError
from calo.log import get_logger


def training_device(setting: str) -> str:
    """train.device as torch names it: auto is CUDA where torch sees one; each process of a
    data-parallel run takes the GPU of its local rank."""
    cuda = torch.cuda.is_available()
    if setting == "cuda" and not cuda:
        raise CaloError("train.device is cuda but torch sees no CUDA device (a CPU build of "
                        "torch, or no GPU here): set train.device to auto or cpu")
    if setting == "cpu" or not cuda:
        return "cpu"
    return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"


def fit_options(train: cfg.Train) -> dict:
    """params.yaml's train section as models.training.fit takes it."""
    return {**dataclasses.asdict(train), "device": training_device(train.device)}


def is_main() -> bool:
    """Not a data-parallel run, or its rank 0: the process that writes."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def join_process_group(settings: cfg.Settings) -> bool:
    """Join torchrun's process group when started by it (WORLD_SIZE > 1); True if joined."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return False
    device = training_device(settings.train.device)
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    if dist.get_rank() != 0:  # the main process reports; the others would repeat it
        get_logger().setLevel(logging.WARNING)
    return True


def leave_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def launch(nproc: int, argv: list[str]) -> int:
    """Run `calo <argv>` in nproc processes on this machine under torchrun; its exit code."""
    if nproc < 1:
        raise CaloError(f"--nproc must be at least 1, got {nproc}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", "-m", "calo.cli", *argv]
    threads = str(max(1, (os.cpu_count() or 1) // nproc))  # the cores, shared out
    return subprocess.call(cmd, env={"OMP_NUM_THREADS": threads, **os.environ,
                                     LAUNCHED: "1"})


# Set in the processes `launch` starts: the launching command reports, they do not.
LAUNCHED = "CALO_LAUNCHED"
