"""Each graph method's server step on plain arrays, without any grid or Flower process: SFL's
aggregation as a function of V, FLT's relatedness driven with made-up client replies."""

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from strategies.methods.flt.settings import (
    AUTOENCODER, CENTROIDS, CENTROIDS_MU, QUERY_FLT_EMBED, TRAIN_FLT_AE, AutoencoderReply,
    EmbedReply, FLTSection,
)
from strategies.methods.flt.server import FLT
from strategies.methods.sfl.gcn import GCNPropagation
from strategies.shared.graph import row_normalize
from strategies.shared.messages import METRICS
from strategies.shared.phases import answer
from strategies.methods.sfl.server import sfl_step
from server_app.harness.local_grid import set_task_identity

set_task_identity()


def Online(n: int) -> list[int]:
    """Which clients are reachable: all of them (what the runner hands a method's step)."""
    return list(range(n))


def test_sfl_step_propagates_v_over_the_graph_and_reads_out_the_mean():
    graph = torch.tensor([[1.0, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]])
    v = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    u, w = sfl_step(GCNPropagation(row_normalize(graph), hops=1, alpha=0.5), v, None, None)
    expected = 0.5 * row_normalize(graph).to(torch.float64) @ v.double() + 0.5 * v.double()
    torch.testing.assert_close(u.double(), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(w, u.mean(dim=0))


def test_sfl_step_gives_an_untrained_client_without_trained_neighbours_the_global_model():
    graph = torch.tensor([[1.0, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]])
    weights = torch.tensor([1.0, 0.5, 0.0, 0.0], dtype=torch.float64)  # clients 2, 3: never trained
    v = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    from strategies.shared.graph import fresh_graph
    propagation = GCNPropagation(fresh_graph(graph, weights), hops=1, alpha=1.0)
    u, w = sfl_step(propagation, v, weights, graph)
    # w = (1·U_0 + 0.5·U_1) / 1.5; clients 2 and 3 reach no trained row, so they get w
    torch.testing.assert_close(w, (u[0] + 0.5 * u[1]) / 1.5)
    torch.testing.assert_close(u[2], w)
    torch.testing.assert_close(u[3], w)
    # rows 0 and 1 average only trained rows, weighted by freshness: (1·v0 + 0.5·v1) / 1.5
    torch.testing.assert_close(u[0], (v[0] + 0.5 * v[1]) / 1.5)


def test_flt_relatedness_from_made_up_replies_joins_clients_with_close_centroids():
    """Phases 1–2 of FLT driven without a grid: the autoencoder round comes back unchanged, and the
    embedding replies put clients 0–2 and 3–5 around two distant points. (The paper's absolute
    threshold: with two groups the median pair distance is a between-group one, and the default
    relative threshold may leave clients of one group apart; `benchmarks/results/flt-thresholds.md`.)"""
    flt = FLT(6, 1.0, FLTSection(k=2, latent_dim=4, umap_neighbors=4, ae_epochs=1,
                                 threshold="absolute"),
              input_shape=(1, 28, 28), seed=0)
    arrays = ArrayRecord({"w": Array(np.zeros((3, 2), dtype=np.float32))})
    rng = np.random.default_rng(0)

    def respond(client: int, message: Message) -> Message:
        kind = message.metadata.message_type
        if kind == TRAIN_FLT_AE:
            return Message(RecordDict({
                AUTOENCODER: message.content[AUTOENCODER],
                METRICS: AutoencoderReply(num_examples=10, recon_loss=0.5).metrics()}),
                reply_to=message)
        assert kind == QUERY_FLT_EMBED
        centre = 0.0 if client < 3 else 50.0
        mu = (centre + rng.normal(0, 0.1, size=(2, 4))).astype(np.float32)
        return Message(RecordDict({CENTROIDS: ArrayRecord({CENTROIDS_MU: Array(mu)}),
                                   METRICS: EmbedReply(num_examples=10).metrics()}),
                       reply_to=message)

    answer(flt.before_train(1, arrays, ConfigRecord(), Online(6)), respond)
    adjacency = flt.relatedness.adjacency
    assert adjacency.shape == (6, 6)
    same = np.equal.outer(np.arange(6) < 3, np.arange(6) < 3)
    assert (adjacency[same] > 0).all() and (adjacency[~same] == 0).all()
    assert flt.autoencoder_losses == [0.5]


def test_fedska_structure_step_learns_the_client_clusters_from_descriptors_alone():
    """FedSKA's structure learning (§2) on plain descriptor tensors: two groups of clients whose mean
    features differ in a few dimensions get a graph with its weight inside the groups."""
    from strategies.methods.fedska.settings import FedSKASection
    from strategies.methods.fedska.structure_learning import StructureModel
    from strategies.shared.graph import structure_share

    generator = torch.Generator().manual_seed(0)
    base = torch.rand(1, 16, generator=generator).repeat(12, 1)
    groups = torch.arange(12) % 2
    base[groups == 1, :4] += 0.5  # ReLU-like features: positive, mostly shared
    descriptors = base + 0.02 * torch.rand(12, 16, generator=generator)
    graph, losses = StructureModel(16, FedSKASection(k=3), seed=0).fit(descriptors)
    assert graph.shape == (12, 12) and len(losses) == FedSKASection().structure_steps
    truth = np.equal.outer(groups.numpy(), groups.numpy())
    assert structure_share(graph.numpy(), truth) >= 0.95


def test_fedcg_labelling_step_balances_a_collapsed_teacher_from_made_up_client_sums():
    """FedCG's balancing (§6.9) driven without a grid: the clients' per-domain sums come from fixed
    teacher logits that put every image in domain 0; the labelling the step forms spreads them."""
    from client_app.methods.fedcg import pseudo_domains
    from models import build_model
    from strategies.methods.fedcg.settings import (
        TEACHER_LABELLING, FedCGBalanceReply, FedCGBalanceRequest,
    )
    from strategies.shared.run_config import RunConfig, default_run_config
    from strategies.methods.fedcg.domain_balance import Labelling, logit_moments, soft_marginals
    from strategies.methods.fedcg.server import fedcg_for
    from strategies.shared.messages import CONFIG

    d = 4
    g = torch.Generator().manual_seed(0)
    logits = [torch.randn(n, d, generator=g) * 0.3 + torch.tensor([6.0, 0, 0, 0]) for n in (80, 60, 70)]
    cfg = RunConfig.from_flower({**default_run_config(), "method": "fedcg", "model": "cnn",
                                 "dataset": "digits", "num-clients": 3, "fedcg.bottleneck": 4})
    fedcg = fedcg_for(cfg)
    arrays = ArrayRecord(build_model("cnn", (1, 28, 28), 10).state_dict())

    def respond(client: int, message: Message) -> Message:
        z = logits[client]
        if FedCGBalanceRequest.read(message.content[CONFIG]).statistic == "moments":
            n, sums, squares = logit_moments(z)
            reply = FedCGBalanceReply(num_examples=n, logit_sum=sums, logit_square_sum=squares)
        else:
            labelling = Labelling.from_record(message.content[TEACHER_LABELLING], d)
            n, soft, hard = soft_marginals(z, labelling)
            reply = FedCGBalanceReply(num_examples=n, soft_sum=soft, hard_counts=hard)
        return Message(RecordDict({METRICS: reply.metrics()}), reply_to=message)

    answer(fedcg.before_train(1, arrays, ConfigRecord(), Online(3)), respond)
    hist = np.bincount(pseudo_domains(torch.cat(logits), fedcg.labelling).numpy(), minlength=d)
    assert hist.max() / hist.sum() <= 1 / d + 0.05, hist
    assert fedcg.balance_report["hard-histogram"] == hist.tolist()
