"""`fedper`: shared feature extractor, personal head (`server.py`, on the partial-sharing base
`strategies.shared.partial`); clients run the generic `train.local` step. Under `secure-aggregation`
the server learns only the weighted sum of `features.*` and each head stays on its client."""

from strategies.methods.fedper.settings import METHODS  # noqa: F401 (the registry reads it)
