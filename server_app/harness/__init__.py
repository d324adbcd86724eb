"""Running Bouquet without a Flower deployment, or setting one up: the in-process federation
(`simulate`, `local_grid`), the loopback SuperLink + SuperNodes (`loopback`), the deployment commands
(`deploy`) and the outcome of a `flwr run` (`outcome`). Tests, benchmarks and users' scripts use them;
the ServerApp itself does not."""
