"""Which CPU kernels torch runs: the same on every x86-64 machine, so a run's numbers repeat across CPUs.

torch chooses its CPU kernels by the processor it finds. On a CPU with AVX-512, ATen's vectorised
reductions, oneDNN's convolutions and MKL's matrix products take AVX-512 code paths that add in another
order than the AVX2 paths of a CPU without it. The difference is in the last bits of a float32 sum, but a
federation compounds it over epochs and rounds: the same fixed-seed run then ends with other graph edges
and other accuracies on a laptop than on the machine that recorded a result.

Bouquet therefore caps all three at AVX2 (every x86-64 CPU since 2013 has it) unless the environment says
`BOUQUET_CPU_KERNELS=native`. The variables are read by torch at its first CPU operation, not at import,
so setting them when `models` is first imported (before any tensor is computed) is in time. A variable the
user has set already is left as it is. Other architectures (e.g. aarch64) are not touched. GPU kernels are
not affected.
"""

from __future__ import annotations

import os
import platform

MODE_VARIABLE = "BOUQUET_CPU_KERNELS"
MODES = ("portable", "native")
# ATen's dispatch level, oneDNN's highest instruction set, MKL's conditional numerical reproducibility.
PORTABLE_X86 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"}


def kernel_mode() -> str:
    """The mode asked for by `BOUQUET_CPU_KERNELS` ('portable' when unset)."""
    mode = os.environ.get(MODE_VARIABLE, "portable").strip().lower() or "portable"
    if mode not in MODES:
        raise ValueError(f"{MODE_VARIABLE}={mode!r}: allowed values are {', '.join(MODES)}")
    return mode


def use_portable_kernels() -> str:
    """Cap torch's CPU kernels at AVX2 on x86-64 unless `BOUQUET_CPU_KERNELS=native`; returns the mode.

    Call before the process computes its first tensor (importing torch is fine)."""
    mode = kernel_mode()
    if mode == "portable" and platform.machine().lower() in ("x86_64", "amd64"):
        for name, value in PORTABLE_X86.items():
            os.environ.setdefault(name, value)
    return mode


def kernel_facts() -> dict[str, str]:
    """What this process runs with, for a results file: the mode, torch's CPU dispatch level and the
    variables that choose the kernels."""
    import torch

    facts = {"mode": kernel_mode(), "torch-cpu-capability": torch.backends.cpu.get_cpu_capability()}
    facts.update({name: os.environ.get(name, "") for name in PORTABLE_X86})
    return facts
