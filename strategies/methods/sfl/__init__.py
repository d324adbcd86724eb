"""`sfl` and `sfl-star`: Structured Federated Learning; settings and messages `settings.py`, server
step `server.py`, its GCN propagation (`gcn`, `spmm`) and SFL*'s graph learner (`graph_learner`);
client step `client_app/methods/sfl.py`."""

from strategies.methods.sfl.settings import METHODS  # noqa: F401 (the registry reads it)
