"""`flt`: Federated Learning with Taskonomy (docs/methods/flt.md).

A one-off Form Client Relatedness (FCR) before round 1's training, then FedAvg generalised over the
discovered client graph:

- Phase 0 (optional, server only): pretrain the convolutional autoencoder on data the server owns,
  never a client's (`flt.pretrain-samples` > 0 images of `flt.pretrain-data`: a .npz on the server, or
  `unassigned`, the built-in data set's samples that no client holds; without it phase 0 is skipped).
- Phase 1 (`train.flt_ae`, `flt.ae-rounds` rounds, all clients): F epochs of reconstruction training
  with Adam on each client, n-weighted FedAvg of the autoencoders (spec §6.1 [D]).
- Phase 2 (`query.flt_embed`, all clients): each client replies only the k k-means centroids of its
  codes; the server fits a 2-D UMAP on all centroids, measures the distance A between every two
  clients' centroid sets, thresholds it into Ã (A_ij < γ, self-loops) and optionally cuts Ã into C
  Ward clusters. Clients that do not answer keep a self-only row; a client seen later is queried then
  and placed with the fitted UMAP's `transform` (`place_client`).
- Rounds: sampled clients train their own model (`train.local`, plain SGD); then every client's model
  becomes the n-weighted mean of its Ã-neighbours' latest models, stale ones included (spec §2 [C],
  Jacobi from a snapshot; `strategies.methods.flt.neighbourhood.NeighbourhoodModels`); `flt.fresh-only=true` averages
  only the neighbours trained this round (a client with none keeps its model). With clusters, one model per
  cluster. Every client is evaluated with its own model on its own test split.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from models.autoencoder import (
    build_autoencoder,
    check_autoencoder_input,
    reconstruction_epochs,
)
from strategies.methods.flt.settings import (
    AUTOENCODER,
    CENTROIDS,
    CENTROIDS_MU,
    ENCODER,
    QUERY_FLT_EMBED,
    TRAIN_FLT_AE,
    AutoencoderInstructions,
    AutoencoderReply,
    EmbedInstructions,
    EmbedReply,
)
from strategies.shared.client_matrix import ClientMatrixStorage
from strategies.shared.graph import share_inside_groups
from strategies.shared.messages import CONFIG, METRICS, PERSONAL, TRAIN_LOCAL
from strategies.methods.flt.neighbourhood import NeighbourhoodModels, neighbourhood_weights
from strategies.shared.params import ParameterLayout
from strategies.shared.personalized import PersonalizedStrategy, weighted_mean
from strategies.shared.privacy import (DP_UPLOAD, PRIVACY, PrivacyInstructions, PrivacyReport,
                                       ledger_fields)
from strategies.shared.phases import Phase, PhasedStrategy, Steps
from strategies.methods.flt.relatedness import (
    Relatedness,
    adjusted_rand,
    connected_components,
    form_client_relatedness,
    place_client,
    ward_clusters,
)

if TYPE_CHECKING:
    from datasets.federated import DataSpec
    from datasets.partition import Partition
    from strategies.methods.flt.settings import FLTSection
    from strategies.shared.run_config import RunConfig

log = logging.getLogger("flwr.bouquet")

KMEANS_SEED = 43  # [C] sklearn KMeans(random_state=43)
_PRETRAIN_STREAM = 13  # mixed into the seed of the server pretraining's batch order


class FLT(PersonalizedStrategy, PhasedStrategy):
    """FLT over the reachable clients: FCR inside round 1's `configure_train`, then graph-weighted averaging
    of per-client models after every round.

    Under `dp = 'client'` (the aggregate layer): every autoencoder and model a client trains is
    clipped against the one it was sent, the autoencoder's mean and every distinct neighbourhood
    aggregate get Gaussian noise of std σ·C·(the largest weight a client trained this round has in
    it; the held models of the others are earlier releases), and the centroids leave the clients
    clipped and noised (`dp-upload`), so the graph is built from noised centroids only
    (docs/privacy.md). Under `dp = 'sample'` every `train.flt_ae` request carries the DP-SGD
    settings and the autoencoder phase's ledger (`privacy`), the clients train the autoencoder by
    DP-SGD stepped by Adam, and the steps each reply reports are charged to `sample_uploads`
    (`strategies.shared.privacy.UploadLedger`) with the centroids, which leave the clients clipped
    and noised by the `dp-upload` layer; the run's ledger takes both and composes them with the
    classifier's DP-SGD steps (`train.local`, the shared loop). With `dp-target-epsilon` the
    autoencoder's steps stop at the target and a client is asked for centroids only while their
    charge fits it (`_may_upload`)."""

    train_message_type = TRAIN_LOCAL
    private_aggregates = True  # dp='client' runs it under the per-client aggregate layer
    private: Any = None  # that layer's AggregateNoise (set by it)
    sample_uploads: Any = None  # dp='sample': the UploadLedger of train.flt_ae steps and centroids
    sample_training: dict[str, float] | None = None  # dp='sample': PrivacyInstructions' settings

    def __init__(self, num_clients: int, fraction_train: float, settings: FLTSection, *,
                 input_shape: tuple[int, int, int], seed: int = 0,
                 pretrain_images: torch.Tensor | None = None,
                 matrix_storage: ClientMatrixStorage | None = None,
                 initial_autoencoder: dict[str, torch.Tensor] | None = None) -> None:
        super().__init__(num_clients, fraction_train, matrix_storage=matrix_storage)
        check_autoencoder_input(input_shape)
        self.settings = settings
        self.input_shape = input_shape
        self.seed = seed
        self.pretrain_images = pretrain_images
        self.initial_autoencoder = initial_autoencoder  # flt.encoder-checkpoint's weights, else None
        self.models: NeighbourhoodModels | None = None
        self.relatedness: Relatedness | None = None
        self.encoder: ArrayRecord | None = None
        self.fcr_seconds: dict[str, float] = {}
        self.autoencoder_losses: list[float] = []
        self._trained: list[int] = []
        self._report: dict[str, Any] = {}
        self._consensus_mass: tuple[int, float, list[int]] | None = None

    # --- per-client models ----------------------------------------------------------------------
    def bind(self, arrays: ArrayRecord) -> None:
        super().bind(arrays)
        if self.models is None:
            self.models = NeighbourhoodModels(self.layout.row(arrays), self.num_clients)

    def personal_arrays(self, client: int) -> ArrayRecord:
        return self.layout.arrays(self.models.model(client))

    def train_content(self, client: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        return RecordDict({PERSONAL: self.personal_arrays(client), CONFIG: config})

    def hands_out_consensus(self) -> bool:
        """While the structure check has found no groups, the graph is complete: every client
        receives FedAvg's model."""
        return self.relatedness is not None and self.relatedness.complete

    def consensus_mass(self) -> tuple[int, float, list[int]] | None:
        """With `flt.fresh-only` and no groups, the consensus is the weighted mean of the last
        aggregated round's trained models: (that round, Σ n_j, the clients whose replies it
        averaged)."""
        return self._consensus_mass

    def absorb(self, client: int, content: RecordDict) -> None:
        super().absorb(client, content)  # row `client` of the trained-models buffer
        if self.private is not None:  # the model it was sent + clip(its update, C)
            self.personal[client] = self.private.clip(self.personal[client],
                                                      self.models.model(client))
        self._trained.append(client)

    def after_train(self, server_round: int) -> ArrayRecord | None:
        """w_m ← Σ_j Ã_mj n_j w_j / Σ_j Ã_mj n_j for every m (spec §2 [C], Jacobi, stale included);
        `flt.fresh-only`: over the neighbours trained this round only."""
        if self.private is not None and self._trained:
            return self._private_after_train(server_round)
        if self.settings.fresh_only:
            self.models.aggregate_fresh(self.personal, sorted(self._trained), self.num_examples)
            if self._trained and self.hands_out_consensus():  # the trained models' weighted mean
                trained = sorted(set(self._trained))
                self._consensus_mass = (server_round, float(self.num_examples[trained].sum()),
                                        trained)
        else:
            self.models.aggregate(self.personal, sorted(self._trained), self.num_examples)
        self._trained = []
        return None

    def _private_after_train(self, server_round: int) -> None:
        """dp='client': the same aggregation, then each distinct aggregate it formed noised with
        σ·C·(its largest weight on a client trained this round) (`AggregateNoise`); withheld (every
        client keeps its model) when the target does not allow it."""
        private, models = self.private, self.models
        trained, self._trained = sorted(set(self._trained)), []
        sensitive = torch.zeros(self.num_clients, dtype=torch.bool)
        sensitive[trained] = True
        examples = self.num_examples.to(torch.float64)
        if self.settings.fresh_only:
            mass = models.distinct[:, trained].to(torch.float64) * examples[trained]
            total = mass.sum(dim=1)
            reached = total > 0
            weights = torch.zeros(int(reached.sum()), self.num_clients, dtype=torch.float64)
            weights[:, trained] = mass[reached] / total[reached, None]
        else:
            weights = neighbourhood_weights(models.distinct, examples, torch.float64)
        if not private.afford(server_round, private.cost(weights, sensitive)[1]):
            return None
        if self.settings.fresh_only:
            models.aggregate_fresh(self.personal, trained, self.num_examples)
            fresh = models.models[:len(weights)]  # the reached rows come first, in order
        else:
            models.aggregate(self.personal, trained, self.num_examples)
            models.models = models.models * models.scale[:, None]
            models.scale = torch.ones_like(models.scale)
            fresh = models.models
        private.noised(server_round, fresh, weights, sensitive, charge=False)
        return None

    def sample_size(self, online: int) -> int:
        """⌈ρM⌉ clients per round (spec §3 Phase 3), at least one."""
        return max(math.ceil(online * self.fraction_train - 1e-9), 1)

    def before_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                     online: list[int]) -> Steps[None]:
        """Phases 0–2 before the first round (and until some client answered), then the placement
        of clients that were unreachable so far."""
        self.bind(arrays)
        if self.relatedness is None:
            yield from self.form_relatedness(online)
        else:
            yield from self.place_new_clients(online)

    def summary(self) -> None:
        s = self.settings
        threshold = {"relative": f"γ={s.relative_gamma:g}×median distance",
                     "evidence": "γ from the evidence"}.get(s.threshold, f"γ={s.gamma:g}")
        log.info("FLT: %d clients, fraction-train %.2f, k=%d (%s), %s distance, %s, clusters=%d",
                 self.num_clients, self.fraction_train, s.k, s.k_mode, s.distance, threshold,
                 s.clusters)

    # --- phases 0–2 -----------------------------------------------------------------------------
    def form_relatedness(self, online: list[int]) -> Steps[None]:
        """Phases 0–2 (once): autoencoder, then FCR over every reachable client."""
        started = time.perf_counter()
        if self.encoder is None:
            self.encoder = yield from self._train_autoencoder(online)
        phase = time.perf_counter()
        centroids = yield from self._query_centroids(online)
        self.fcr_seconds["embed-round-trip"] = time.perf_counter() - phase
        if not centroids:
            log.warning("FLT: no client answered %s; FCR is retried next round (clients train "
                        "alone until then)", QUERY_FLT_EMBED)
            return
        s = self.settings
        first = "umap" not in sys.modules  # the first fit in a process compiles numba code
        log.info("FLT: fitting UMAP on the centroids of %d clients (expect %s)", len(centroids),
                 "10-30 s: numba compiles UMAP first" if first else "about 1 s")
        self.relatedness = form_client_relatedness(
            centroids, self.num_clients, gamma=s.gamma, distance=s.distance, clusters=s.clusters,
            umap_neighbors=s.umap_neighbors,
            relative_gamma=s.relative_gamma if s.threshold == "relative" else None,
            structure_confidence=s.structure_confidence if s.no_structure == "complete" else None,
            evidence=s.threshold == "evidence",
        )
        self.models.set_graph(self.relatedness.aggregation_graph())
        self.fcr_seconds.update(self.relatedness.seconds)
        self.fcr_seconds["total"] = time.perf_counter() - started  # pretraining included
        rel = self.relatedness
        edges = _edges(rel.adjacency)
        contrast = "undefined" if rel.contrast is None else f"{rel.contrast:.2f}"
        log.info("FLT: FCR placed %d of %d clients, %d edges (structure contrast %s), %.1f s "
                 "(UMAP %.1f s)", len(centroids), self.num_clients, edges, contrast,
                 self.fcr_seconds["total"], self.fcr_seconds.get("umap", 0.0))
        if rel.complete:
            log.info("FLT: %s: no client structure found at confidence %g, averaging over every "
                     "client (flt.no-structure=keep keeps the thresholded graph)",
                     _test_text(rel), s.structure_confidence)
        elif rel.test is not None:
            log.info("FLT: %s: the graph's groups are kept at confidence %g", _test_text(rel),
                     s.structure_confidence)
        self._report = {"flt": {
            "fcr-seconds": dict(self.fcr_seconds), "clients-placed": len(centroids), "edges": edges,
            "structure-contrast": rel.contrast, "complete-graph": rel.complete,
            "autoencoder-loss": list(self.autoencoder_losses),
            **_test_fields(rel),
        }}

    def place_new_clients(self, online: list[int]) -> Steps[None]:
        """Query and place reachable clients that have no row yet (late joiners, earlier failures)."""
        waiting = [c for c in online if c not in self.relatedness.centroids]
        if not waiting:
            return
        centroids = yield from self._query_centroids(waiting)
        for client, mu in centroids.items():
            place_client(self.relatedness, client, mu)
        if centroids and self.relatedness.test is not None:  # the decision is revisited
            if self.relatedness.retest(self.settings.structure_confidence):
                log.info("FLT: with the late clients, %s: %s", _test_text(self.relatedness),
                         "no client structure found, averaging over every client"
                         if self.relatedness.complete else "the graph's groups are kept")
        if centroids:
            self.models.set_graph(self.relatedness.aggregation_graph())
            log.info("FLT: placed late clients %s", sorted(centroids))
            self._report = {"flt": {"placed-late": sorted(centroids)}}

    def _train_autoencoder(self, online: list[int]) -> Steps[ArrayRecord]:
        """Phase 0 (optional server pretraining) and phase 1 (federated rounds); returns the encoder."""
        s = self.settings
        with torch.random.fork_rng():  # leave the global RNG (e.g. dropout of local training) as is
            torch.manual_seed(self.seed)
            model = build_autoencoder(self.input_shape, s.latent_dim)
        if self.initial_autoencoder is not None:  # an encoder from elsewhere (flt.encoder-checkpoint)
            model.load_state_dict(self.initial_autoencoder, strict=False)
            log.info("FLT: the autoencoder starts from %s (%d tensors)", s.encoder_checkpoint,
                     len(self.initial_autoencoder))
        if self.pretrain_images is not None:
            started = time.perf_counter()
            loss = reconstruction_epochs(
                model, self.pretrain_images, epochs=s.pretrain_epochs, batch_size=s.ae_batch_size,
                lr=s.ae_lr,
                generator=torch.Generator().manual_seed(self.seed * 1_000_003 + _PRETRAIN_STREAM),
            )
            self.fcr_seconds["pretrain"] = time.perf_counter() - started
            log.info("FLT: pretrained the autoencoder on %d server-held images, the server's own "
                     "data (flt.pretrain-data), no client's (loss %.4f)",
                     len(self.pretrain_images), loss)
        arrays = ArrayRecord(model.state_dict())
        layout = ParameterLayout.of(arrays)
        started = time.perf_counter()
        for ae_round in range(1, s.ae_rounds + 1):
            arrays = yield from self._autoencoder_round(online, arrays, layout, ae_round)
        self.fcr_seconds["autoencoder-rounds"] = time.perf_counter() - started
        prefix = "encoder."
        return ArrayRecord({key[len(prefix):]: arrays[key] for key in arrays.keys()
                            if key.startswith(prefix)})

    def _autoencoder_round(self, online: list[int], arrays: ArrayRecord, layout: ParameterLayout,
                           ae_round: int) -> Steps[ArrayRecord]:
        """`train.flt_ae` to every reachable client, n-weighted FedAvg of the replies (spec §3 Ph. 1)."""
        s = self.settings
        config = AutoencoderInstructions(
            ae_round=ae_round, epochs=s.ae_epochs, lr=s.ae_lr, batch_size=s.ae_batch_size,
            latent_dim=s.latent_dim, seed=self.seed,
        ).config()
        content = RecordDict({AUTOENCODER: arrays, CONFIG: config})
        if self.sample_training is not None:  # dp='sample': DP-SGD settings and each client's
            # whole ledger so far (a target stops the client's autoencoder steps within it)
            content[PRIVACY] = PrivacyInstructions(**self.sample_training, **ledger_fields(
                {c: self.sample_uploads.history(c) for c in online})).config()
        messages = [Message(content, dst_node_id=c, message_type=TRAIN_FLT_AE)
                    for c in online]
        replies = yield Phase(TRAIN_FLT_AE, messages)
        if self.sample_training is not None:
            replies = self._charge_autoencoder_steps(ae_round, replies)
        if not replies:
            log.warning("FLT: no client answered autoencoder round %d; the autoencoder is unchanged",
                        ae_round)
            return arrays
        metrics = [AutoencoderReply.read(r.content[METRICS]) for _, r in replies]
        rows = torch.stack([layout.row(r.content[AUTOENCODER]) for _, r in replies])
        weights = torch.tensor([float(m.num_examples) for m in metrics])
        loss = sum(m.recon_loss * m.num_examples for m in metrics) / max(float(weights.sum()), 1.0)
        self.autoencoder_losses.append(loss)
        log.info("FLT: autoencoder round %d: %d clients, reconstruction loss %.4f", ae_round,
                 len(replies), loss)
        if self.private is not None:
            return self._private_autoencoder_mean(arrays, layout, replies, rows, weights)
        return layout.arrays(weighted_mean(rows, weights))

    def _charge_autoencoder_steps(self, ae_round: int, replies: list[tuple[int, Message]]
                                  ) -> list[tuple[int, Message]]:
        """dp='sample': charge each reply's DP-SGD steps; a reply without a privacy report (its
        client did not train under DP-SGD) is left out of the mean."""
        kept = []
        for client, reply in replies:
            if PRIVACY not in reply.content:
                log.warning("FLT: autoencoder round %d: client %d's reply carries no privacy "
                            "report; its autoencoder is left out", ae_round, client)
                continue
            report = PrivacyReport.read(reply.content[PRIVACY])
            self.sample_uploads.charge_steps(client, report.entries())
            if report.planned_steps > 0 and sum(report.steps) == 0:  # its target is spent: it sent
                # back the autoencoder it received, which the mean leaves out (as a client that left)
                log.info("FLT: autoencoder round %d: client %d reached dp-target-epsilon; it "
                         "trained no step and is left out of the mean", ae_round, client)
                continue
            kept.append((client, reply))
        return kept

    def _private_autoencoder_mean(self, arrays: ArrayRecord, layout: ParameterLayout,
                                  replies: list[tuple[int, Message]], rows: torch.Tensor,
                                  weights: torch.Tensor) -> ArrayRecord:
        """dp='client': the n-weighted mean of the clipped autoencoders with noise σ·C·(the largest
        weight); the autoencoder stays as it is when the target does not allow it."""
        private, start = self.private, layout.row(arrays)
        rows = torch.stack([private.clip(row, start) for row in rows])
        clients = [client for client, _ in replies]
        share = torch.zeros(1, self.num_clients, dtype=torch.float64)
        share[0, clients] = weights.to(torch.float64) / weights.sum()
        sensitive = torch.zeros(self.num_clients, dtype=torch.bool)
        sensitive[clients] = True
        mean = weighted_mean(rows, weights).unsqueeze(0)
        if not private.noised(private.round + 1, mean, share, sensitive):
            return arrays
        return layout.arrays(mean[0])

    def _query_centroids(self, clients: list[int]) -> Steps[dict[int, np.ndarray]]:
        """`query.flt_embed` to `clients`; returns client → centroids [k_m, e] of valid replies and
        records each client's num-examples n_m."""
        s = self.settings
        if self.sample_uploads is not None and self.private is None:  # dp='sample': within a target
            clients = [c for c in clients if self._may_upload(c)]
        config = EmbedInstructions(k=s.k, k_mode=s.k_mode, kmeans_seed=KMEANS_SEED,
                                   latent_dim=s.latent_dim).config()
        content = RecordDict({ENCODER: self.encoder, CONFIG: config})
        messages = [Message(content, dst_node_id=c, message_type=QUERY_FLT_EMBED) for c in clients]
        private = self.private
        if private is not None:  # dp='client': only within the target
            extra = torch.zeros(self.num_clients, dtype=torch.float64)
            extra[list(clients)] = 1.0 / private.upload_noise_multiplier ** 2
            if not private.affordable(extra):
                private.stop(private.round + 1)  # before the next round trains
                return {}
        # dp='client' or 'sample': the centroids leave each client clipped and noised
        uploads = private if private is not None else self.sample_uploads
        if uploads is not None:
            messages = [Message(RecordDict({ENCODER: self.encoder, CONFIG: config,
                                            DP_UPLOAD: uploads.upload_instructions([CENTROIDS])}),
                                dst_node_id=c, message_type=QUERY_FLT_EMBED) for c in clients]
        found: dict[int, np.ndarray] = {}
        replies = yield Phase(QUERY_FLT_EMBED, messages)
        if uploads is not None:
            uploads.charge_uploads(client for client, _ in replies)
        for client, reply in replies:
            mu = np.asarray(reply.content[CENTROIDS][CENTROIDS_MU].numpy(), dtype=np.float32)
            if mu.ndim != 2 or mu.shape[1] != s.latent_dim or not 1 <= len(mu) <= s.k \
                    or not np.isfinite(mu).all():
                log.warning("FLT: client %d sent centroids of shape %s (expected [1..%d, %d] finite "
                            "floats); it keeps a self-only row", client, mu.shape, s.k, s.latent_dim)
                continue
            found[client] = mu
            self.num_examples[client] = EmbedReply.read(reply.content[METRICS]).num_examples
        return found

    def _may_upload(self, client: int) -> bool:
        """dp='sample' with a target: whether `client`'s noised centroids keep its ε within it; a
        client they would take past it is not asked (it keeps a self-only row, as a client that
        never answered)."""
        if self.sample_uploads.affordable(client, records=1):
            return True
        if self.sample_uploads.withhold(client):
            log.info("FLT: client %d's noised centroids would pass dp-target-epsilon; it is not "
                     "asked for them (a self-only row)", client)
        return False

    # --- reporting ------------------------------------------------------------------------------
    def round_report(self, server_round: int) -> dict[str, Any]:
        report, self._report = self._report, {}
        return report

    def client_graph(self) -> np.ndarray | None:
        """The graph the models are averaged over (`Relatedness.aggregation_graph`: Ã, its clusters,
        or the complete graph when no structure was found); None until FCR has run."""
        return None if self.relatedness is None else self.relatedness.aggregation_graph()

    def report(self, directory: Path, truth: Partition | None) -> dict[str, Any]:
        """The graph the models were averaged over → graph.npy/.png (Ã; with clusters, Ward's
        cluster graph; without structure, the complete graph), Ã itself → thresholded-graph.npy/.png
        where it is not that graph, A → distance.npy/.png (clients grouped by discovered cluster),
        the UMAP embedding → umap.png; with ground truth: ARI and the share of Ã's edges inside true
        clusters. Returns {"flt": {...}} for summary.json."""
        from strategies.shared.reporter import save_matrix

        rel = self.relatedness
        if rel is None:
            return {"flt": {"fcr": "not run: no client answered query.flt_embed"}}
        placed = rel.placed
        true_ids = truth.cluster_ids if truth is not None else None
        labels = self.discovered_clusters(true_ids)
        order = np.lexsort((np.arange(rel.num_clients), labels))
        thresholded = f"FLT Ã: A < γ={rel.gamma:g} (by discovered cluster)"
        if rel.complete:
            contrast = "undefined" if rel.contrast is None else f"{rel.contrast:.2f}"
            save_matrix(directory, "graph", rel.aggregation_graph(), order=order,
                        title="FLT: complete graph (no client structure found)",
                        caption=f"Complete graph: no client structure found ({_test_text(rel)}, "
                                f"flt.structure-confidence {self.settings.structure_confidence:g}), so "
                                "every client averaged over every placed client (FedAvg's "
                                "neighbourhood); the thresholded graph Ã is shown apart")
        elif rel.clusters is not None:
            save_matrix(directory, "graph", rel.aggregation_graph(), order=order,
                        title=f"FLT clusters (Ward, C={rel.num_clusters})",
                        caption=f"Ward's {rel.num_clusters} clusters of Ã (flt.clusters): each "
                                "client averaged over its cluster")
        else:
            save_matrix(directory, "graph", rel.adjacency, order=order, title=thresholded,
                        caption=f"Ã: clients whose centroid sets lie closer than γ={rel.gamma:g}; "
                                "each client averaged over its neighbours in Ã")
        if rel.complete or rel.clusters is not None:
            save_matrix(directory, "thresholded-graph", rel.adjacency, order=order,
                        title=thresholded,
                        caption="Ã, the thresholded graph FCR found (not the graph the models were "
                                "averaged over: " + ("no structure found)" if rel.complete
                                                     else "the clusters were)"))
        save_matrix(directory, "distance", rel.distance, order=order,
                    title=f"FLT A: {rel.distance_mode} distance in UMAP space")
        _plot_embedding(directory / "umap.png", rel, labels, true_ids)
        s = self.settings
        result: dict[str, Any] = {
            "gamma": rel.gamma, "threshold": s.threshold, "distance": rel.distance_mode, "k": s.k,
            "k-mode": s.k_mode,
            "clients-placed": len(placed), "edges": _edges(rel.adjacency),
            "mean-degree": float(rel.adjacency.sum(axis=1).mean() - 1.0),
            "discovered-clusters": int(len(np.unique(labels[placed]))),
            "centroids-per-client": float(np.mean([len(rel.centroids[c]) for c in placed])),
            "uplink-floats-per-client": float(np.mean([rel.centroids[c].size for c in placed])),
            "fcr-seconds": dict(self.fcr_seconds), "autoencoder-loss": list(self.autoencoder_losses),
            "structure-contrast": rel.contrast, "complete-graph": bool(rel.complete),
            **_test_fields(rel),
        }
        if true_ids is not None:
            true_ids = np.asarray(true_ids)
            result["true-clusters"] = int(len(np.unique(true_ids)))
            result["ari"] = adjusted_rand(labels[placed], true_ids[placed])
            result["edges-inside-true-clusters"] = share_inside_groups(rel.adjacency, true_ids)
        return {"flt": result}

    def discovered_clusters(self, true_ids: np.ndarray | None = None) -> np.ndarray:
        """Cluster labels [M] for reports: the configured Ward clusters; else Ward with C = the number
        of true clusters when known; else the connected components of Ã. Unplaced clients: −1."""
        rel = self.relatedness
        placed = rel.placed
        if rel.clusters is not None:
            return rel.clusters.copy()
        sub = rel.adjacency[np.ix_(placed, placed)]
        labels = np.full(rel.num_clients, -1, dtype=np.int64)
        if true_ids is not None:
            labels[placed] = ward_clusters(sub, int(len(np.unique(true_ids))))
        else:
            labels[placed] = connected_components(sub)
        return labels


def _test_fields(rel: Relatedness) -> dict[str, Any]:
    """The structure test's report fields (none under flt.no-structure=keep, which runs no test,
    nor where Ã has no edge or no non-edge: there is nothing to test, `structure-contrast` is null)."""
    if rel.test is None or rel.test.p is None:
        return {}
    return {"structure-code-contrast": rel.test.contrast, "structure-p": rel.test.p,
            "structure-draws": rel.test.draws}


def _test_text(rel: Relatedness) -> str:
    test = rel.test
    if test is None or test.p is None:
        return "no edge to test" if _edges(rel.adjacency) == 0 else "no pair left unlinked"
    return (f"edges' code contrast {test.contrast:.2f}, p = {test.p:.3f} against {test.draws} "
            "federations without groups")


def _edges(adjacency: np.ndarray) -> int:
    """Number of undirected off-diagonal edges of a symmetric binary graph."""
    return int((np.asarray(adjacency).sum() - np.trace(adjacency)) // 2)


def _plot_embedding(path: Path, rel: Relatedness, labels: np.ndarray,
                    true_ids: np.ndarray | None) -> None:
    """The UMAP embedding of all centroids, coloured by discovered cluster; a client's centroids are
    joined by a line; marker = true cluster where known."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    markers = "osD^v<>phX*"
    cmap = plt.get_cmap("tab10" if labels.max(initial=0) < 10 else "tab20")
    fig, ax = plt.subplots(figsize=(6, 5))
    for client in rel.placed:
        pts = rel.points[client]
        colour = cmap(int(labels[client]) % cmap.N)
        marker = markers[int(true_ids[client]) % len(markers)] if true_ids is not None else "o"
        if len(pts) > 1:
            ax.plot(pts[:, 0], pts[:, 1], color=colour, alpha=0.25, linewidth=0.8)
        ax.scatter(pts[:, 0], pts[:, 1], color=colour, marker=marker, s=18)
    ax.set_title("FLT: UMAP of client centroids\n(colour: discovered cluster"
                 + ("; marker: true cluster)" if true_ids is not None else ")"), fontsize=10)
    ax.set_xlabel("UMAP 1")
    ax.set_ylabel("UMAP 2")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- building from the run config -----------------------------------------------------------------
def server_held_images(spec: DataSpec, count: int, seed: int) -> torch.Tensor:
    """Up to `count` images of the data set that no client holds (neither train nor test), a seeded
    choice: the server-held split for phase 0 (spec §4: pretrain on a split not given to clients)."""
    from datasets.federated import load_partition

    source, partition = load_partition(spec)
    held = np.zeros(len(source), dtype=bool)
    held[np.concatenate([*partition.train_indices, *partition.test_indices])] = True
    free = np.flatnonzero(~held)
    if len(free) == 0:
        raise ValueError(
            f"every one of the {len(source)} samples of '{spec.dataset}' is held by a client, so the "
            "server has no split of its own to pretrain on; set max-samples-per-client so that "
            "clients hold fewer samples, or flt.pretrain-samples=0"
        )
    chosen = np.random.default_rng(seed).choice(free, size=min(count, len(free)), replace=False)
    if len(chosen) < count:
        log.warning("FLT: flt.pretrain-samples=%d but only %d samples are held by no client; "
                    "pretraining on those", count, len(chosen))
    return torch.from_numpy(np.ascontiguousarray(source.images[np.sort(chosen)]))


PRETRAIN_UNASSIGNED = "unassigned"  # flt.pretrain-data: the built-in data set's unassigned samples


def server_owned_images(path: str, count: int, input_shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Up to `count` images (a seeded choice) of the server's own .npz (`flt.pretrain-data`): array
    `x` of the run's input shape, float or uint8 (scaled by 1/255); ValueError naming the file and
    what is allowed."""
    from pathlib import Path

    file = Path(path).expanduser()
    allowed = (f"allowed: a .npz on the server with array x [n, {', '.join(map(str, input_shape))}] "
               f"(float, or uint8 scaled by 1/255), or '{PRETRAIN_UNASSIGNED}'")
    if file.suffix.lower() != ".npz" or not file.is_file():
        raise ValueError(f"{str(file)!r} is not an existing .npz file; {allowed}")
    try:
        with np.load(file, allow_pickle=False) as archive:
            x = archive["x"]
    except (KeyError, OSError, ValueError) as err:
        raise ValueError(f"{str(file)!r} could not be read ({err}); {allowed}") from None
    if tuple(x.shape[1:]) != tuple(input_shape) or len(x) == 0:
        raise ValueError(f"{str(file)!r}: x has shape {list(x.shape)}; {allowed}")
    chosen = np.sort(np.random.default_rng(seed).choice(len(x), size=min(count, len(x)),
                                                        replace=False))
    images = x[chosen]
    images = images.astype(np.float32) / np.float32(255.0) if images.dtype == np.uint8 else \
        np.ascontiguousarray(images, dtype=np.float32)
    if len(chosen) < count:
        log.warning("FLT: flt.pretrain-samples=%d but %s holds %d images; pretraining on those",
                    count, file, len(chosen))
    return torch.from_numpy(images)


def pretrain_images(cfg: RunConfig, input_shape: tuple[int, ...]) -> torch.Tensor | None:
    """Phase 0's images: `flt.pretrain-samples` of the server's own data (`flt.pretrain-data`); None
    (logged) when the run gives the server no data of its own."""
    from strategies.shared.settings import ConfigError

    s = cfg.flt
    if s.pretrain_samples == 0:
        return None
    if not s.pretrain_data:
        log.info("FLT: flt.pretrain-samples=%d but flt.pretrain-data is not set: the server has no "
                 "data of its own, so the server pretraining (phase 0) is skipped and the "
                 "autoencoder starts from its seeded initialisation", s.pretrain_samples)
        return None
    try:
        if s.pretrain_data == PRETRAIN_UNASSIGNED:
            return server_held_images(cfg.data_spec, s.pretrain_samples, cfg.seed)
        return server_owned_images(s.pretrain_data, s.pretrain_samples, input_shape, cfg.seed)
    except ValueError as err:
        key, value = (("flt.pretrain-samples", s.pretrain_samples)
                      if s.pretrain_data == PRETRAIN_UNASSIGNED else
                      ("flt.pretrain-data", s.pretrain_data))
        raise ConfigError(f"run config: key '{key}' = {value!r} is invalid: {err}") from None


def build_flt(cfg: RunConfig, storage: ClientMatrixStorage | None = None) -> FLT:
    """FLT from the run config, its client matrix kept by `storage`; fails before any client is
    contacted on an unusable setting."""
    from datasets.sources import SOURCE_INFO
    from strategies.shared.settings import ConfigError

    input_shape, _ = SOURCE_INFO[cfg.dataset]
    try:
        check_autoencoder_input(input_shape)
    except ValueError as err:
        raise ConfigError(f"run config: key 'dataset' = {cfg.dataset!r} is invalid for method "
                          f"'flt': {err}") from None
    images = pretrain_images(cfg, input_shape)
    initial = None
    if cfg.flt.encoder_checkpoint:
        from models.autoencoder import load_autoencoder_checkpoint

        try:
            initial = load_autoencoder_checkpoint(cfg.flt.encoder_checkpoint, input_shape,
                                                  cfg.flt.latent_dim)
        except ValueError as err:
            raise ConfigError(f"run config: key 'flt.encoder-checkpoint' = "
                              f"{cfg.flt.encoder_checkpoint!r} is invalid: {err}") from None
    strategy = FLT(cfg.num_clients, cfg.fraction_train, cfg.flt, input_shape=input_shape,
                   seed=cfg.seed, pretrain_images=images, matrix_storage=storage,
                   initial_autoencoder=initial)
    if cfg.dp == "sample":
        from strategies.shared.privacy import UploadLedger

        strategy.sample_uploads = UploadLedger.of(cfg)
        strategy.sample_training = {"noise_multiplier": cfg.dp_noise_multiplier,
                                    "max_grad_norm": cfg.dp_max_grad_norm, "delta": cfg.dp_delta,
                                    "target_epsilon": cfg.dp_target_epsilon}
    return strategy

