"""Export a built-in partition to one folder per client in the local npz format (the library; the
command is `python -m client_app.export`, which validates the run config keys first).

`export(cfg, out)` writes `out/client-000 ... out/client-NNN`, each with `train.npz` and `test.npz`:
`x` and `y` exactly as the partitioned run hands that client (float32 images, after any domain
transform; traffic: z-scored windows with scalars `target_mean` / `target_std`), `domain` where the
partition gives each image a true domain, `group` (the client's true cluster, per sample) where it
has clusters. The names sort in client-id order, so a run on the folders (one SuperNode per folder,
or one node with `data-dir=out`) gives the clients the same ids, seeds and numbers as the
partitioned run. `out/bouquet-export.json` records the run config keys used.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from datasets.federated import load_client_data, load_partition
from datasets.local import EXPORT_FILE


def client_folder_name(client: int, num_clients: int) -> str:
    """`client-000` style names whose sorted order is the client-id order."""
    return f"client-{client:0{max(3, len(str(num_clients - 1)))}d}"


def export(cfg: Any, out: str | Path) -> list[Path]:
    """Write every client of `cfg`'s partition under `out` (a validated run config: its `data_spec`,
    `num_clients` and `flat()` keys); returns the client folders."""
    out = Path(out)
    spec = cfg.data_spec
    _, partition = load_partition(spec)
    clusters = partition.cluster_ids
    folders = []
    for client in range(cfg.num_clients):
        data = load_client_data(spec, client)
        folder = out / client_folder_name(client, cfg.num_clients)
        folder.mkdir(parents=True, exist_ok=True)
        for part in ("train", "test"):
            arrays: dict[str, np.ndarray] = {
                "x": getattr(data, f"{part}_x").numpy(), "y": getattr(data, f"{part}_y").numpy()}
            domains = getattr(data, f"{part}_domains")
            if domains is not None:
                arrays["domain"] = domains.numpy()
            if clusters is not None:
                arrays["group"] = np.full(len(arrays["y"]), int(clusters[client]), dtype=np.int64)
            if data.task == "regression":
                arrays["target_mean"] = np.array(data.target_mean, dtype=np.float64)
                arrays["target_std"] = np.array(data.target_std, dtype=np.float64)
            np.savez(folder / f"{part}.npz", **arrays)
        folders.append(folder)
    (out / EXPORT_FILE).write_text(json.dumps(cfg.flat(), indent=2, default=str) + "\n")
    return folders
