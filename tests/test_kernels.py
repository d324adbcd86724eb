"""CPU kernel choice (models/kernels.py): importing Bouquet's models caps torch's CPU kernels at AVX2 on
x86-64 unless BOUQUET_CPU_KERNELS=native, so a fixed-seed run gives the same numbers on every CPU."""

import json
import os
import platform
import subprocess
import sys

import pytest

from models.kernels import MODE_VARIABLE, PORTABLE_X86, kernel_mode
from tests.conftest import REPO

X86 = platform.machine().lower() in ("x86_64", "amd64")


def _cpu_flags() -> set[str]:
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


PROBE = """
import json, os, torch
import models  # noqa: F401  (the import chooses the kernels)
x = torch.arange(1, 100_001, dtype=torch.float32).div_(7.0)
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(),
                  "env": {k: os.environ.get(k) for k in %r}, "sum": float(x.sum())}))
""" % (list(PORTABLE_X86),)


def _probe(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in PORTABLE_X86 and k != MODE_VARIABLE}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env={**clean, **env, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not X86 or "avx2" not in _cpu_flags(), reason="needs an x86-64 CPU with AVX2")
def test_importing_models_caps_torch_at_avx2_and_native_lifts_the_cap():
    portable = _probe()
    assert portable["capability"] == "AVX2"
    assert portable["env"] == PORTABLE_X86
    native = _probe(**{MODE_VARIABLE: "native"})
    assert native["env"] == {k: None for k in PORTABLE_X86}
    if "avx512f" in _cpu_flags():  # the native path differs only where the CPU offers more
        assert native["capability"] == "AVX512"
    # the cap is what an explicitly capped process computes, bit for bit
    assert portable["sum"] == _probe(**{MODE_VARIABLE: "native", **PORTABLE_X86})["sum"]


@pytest.mark.skipif(not X86, reason="x86-64 only")
def test_a_variable_the_user_set_is_kept():
    assert _probe(ATEN_CPU_CAPABILITY="default")["capability"] == "DEFAULT"


def test_an_unknown_mode_names_the_variable_and_the_allowed_values(monkeypatch):
    monkeypatch.setenv(MODE_VARIABLE, "fast")
    with pytest.raises(ValueError, match=r"BOUQUET_CPU_KERNELS='fast': allowed values are portable, native"):
        kernel_mode()
    monkeypatch.setenv(MODE_VARIABLE, "Native")
    assert kernel_mode() == "native"
