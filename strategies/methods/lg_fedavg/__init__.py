"""`lg-fedavg`: personal feature extractor, shared head (`server.py`, on the partial-sharing base
`strategies.shared.partial`); clients run the generic `train.local` step. Under `secure-aggregation`
the server learns only the weighted sum of `head.*` and each feature extractor stays on its client."""

from strategies.methods.lg_fedavg.settings import METHODS  # noqa: F401 (the registry reads it)
