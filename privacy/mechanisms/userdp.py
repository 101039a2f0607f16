"""``userdp``: user-level DP by DP-FedAvg (McMahan et al. 2018), as PRIVACY.md specifies.

Per round: Poisson-sample users with probability ``q_user`` (each user by its own coin); each sampled
user starts from the global weights, takes ``local_steps`` SGD steps on its own sentences (batches in
the order of its own stream) and returns its model delta; the delta (not the gradients) is clipped to
``clip`` in L2 over all trainable parameters, weighted by ``w_u = min(n_u / weight_cap, 1)`` (the user's
own data only) and summed; Gaussian noise with standard deviation ``sigma = z * clip * 1`` is added
once to the sum; the server divides by the fixed ``q_user * N`` and applies its optimizer (sgd with the
server learning rate, momentum or Adam: :mod:`privacy.mechanisms.server_optimizer`; post-processing).
N is a public or DP count of users (:mod:`privacy.population`), never the exact one.

Sensitivity: adding or removing one user moves the weighted sum by at most ``max(w) * clip``; the
weight ceiling 1 is used as ``max(w)``, not the largest weight in this dataset, because the added user
may be the one that reaches it. Accounting: the DP count (if any), then ``rounds``-fold
``PoissonSampled(q_user, Gaussian(z))``.

Adaptive clipping (``adaptive_clip``; Andrew, Thakkar, McMahan, Ramaswamy, NeurIPS 2021): round t clips
to ``C_t`` (``clip`` is ``C_1``) and adds noise ``z_Delta * C_t``; each sampled user also reports whether
its unclipped delta had norm <= ``C_t`` (a user with nothing to train on: a zero delta, yes; a non-finite
delta: no), and the server releases the count of those, centred and noised (std ``quantile_noise``), to
move the clip toward the ``target_quantile`` of the norms (:class:`privacy.mechanisms.fedavg.AdaptiveClip`).
Sensitivity of the count: each sampled user adds ``b_u - 1/2``, within 1/2 of the 0 an absent user adds:
1/2 under add/remove (one user more or less), and 1/2 in dp_accounting's REPLACE_ONE terms too (uedp-bounded:
a changed user's term flips by at most 1, twice 1/2, as a clipped delta moves by up to twice the clip it is
accounted at). Both queries see the same sampled users, so a round is one Gaussian of noise multiplier z
with ``z^-2 = z_Delta^-2 + (quantile_noise / (1/2))^-2`` (:func:`privacy.accounting.events.delta_noise_multiplier`):
the z a run is given or calibrates is that z, its round event unchanged, and adaptive clipping costs no
epsilon beyond it. The clips are functions of released noisy counts: public, and named in the statement.

Randomness: sampling, noise and every user's batch order come from the run's
:class:`privacy.randomness.Randomness` (secret OS randomness unless the run is seeded); the count's noise
from its own stream of the round (``clip-noise``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import dp_accounting
import torch

from uedp.privacy.accounting.calibration import check_delta, resolve_noise_multiplier
from uedp.privacy.accounting.events import (
    MIN_NOISE_MULTIPLIER,
    Adjacency,
    delta_noise_multiplier,
    epsilon_after,
    poisson_gaussian_round,
)
from uedp.privacy.accounting.rounds import RoundAccountant
from uedp.privacy.layer_randomness import dropout_switched_off
from uedp.privacy.mechanisms.base import (
    NO_CHECKPOINT,
    Checkpointer,
    HostUnits,
    LossFn,
    OnRound,
    SamplesUnits,
    TrainData,
    Trained,
)
from uedp.privacy.mechanisms.fedavg import COUNT_SENSITIVITY, WEIGHT_CEILING, AdaptiveClip, LocalTrainer, user_weights
from uedp.privacy.mechanisms.loop import RoundLoop, RoundOutput, planned_epsilon, private_statement
from uedp.privacy.mechanisms.params import UserDpParams
from uedp.privacy.mechanisms.server_optimizer import ServerOptimizer
from uedp.privacy.mechanisms.vectorized import VectorizedLocalTrainer
from uedp.privacy.population import Population
from uedp.privacy.primitives import assign_flat_, flatten, noise_ahead
from uedp.privacy.randomness import Randomness, RoundRandomness
from uedp.privacy.signal import NoiseToSignal

__all__ = [
    "Selection",
    "UserDp",
    "UserDpParams",
    "make_local_trainer",
    "server_notes",
    "server_optimizer",
    "server_state",
]


@dataclass(frozen=True)
class Selection:
    """What DP-FedAvg's rounds train on, chosen before the first round, with what the statement adds
    about the choice and the sampler the audit asks (uedp-bounded: the holders kept). Returned from
    :meth:`UserDp.select` and carried through training, never left on the mechanism."""

    data: TrainData
    sampling: SamplesUnits
    extra: dict[str, float] = field(default_factory=dict)
    public: tuple[str, ...] = ()


class UserDp:
    """DP-FedAvg. Subclasses change what it trains on (:meth:`select`) and the round's privacy event and
    adjacency (:meth:`round_event`)."""

    name = "userdp"
    unit = UserDpParams.unit_words
    adjacency: Adjacency = "add_remove"
    noise_floor = MIN_NOISE_MULTIPLIER  # the least z a calibration searches (see calibrate_noise_multiplier)

    def __init__(self, params: UserDpParams, population: Population | None, randomness: Randomness | None = None):
        self.params = params
        self.population = population  # None: the number of users is public by the adjacency (read at train)
        self.randomness = randomness or Randomness.secure()
        self.noise_multiplier = resolve_noise_multiplier(
            self.name, params.noise_multiplier, params.target_epsilon, self.round_event, params.rounds,
            params.delta, params.accountant, self.adjacency, initial=self.initial_event(), floor=self.noise_floor)

    def round_event(self, noise_multiplier: float) -> dp_accounting.DpEvent:
        """One round: users Poisson-sampled with ``q_user``, one Gaussian of std ``z`` times the sensitivity."""
        return poisson_gaussian_round(self.params.q_user, noise_multiplier)

    def initial_event(self) -> dp_accounting.DpEvent | None:
        return self.population.event() if self.population is not None else None

    def epsilon(self, rounds: int | None = None) -> float:
        """Epsilon after ``rounds`` (default: all), as the run would report it."""
        p = self.params
        return epsilon_after(self.round_event(self.noise_multiplier), p.rounds if rounds is None else rounds, p.delta,
                             p.accountant, self.adjacency, initial=self.initial_event())

    def run_accountant(self) -> RoundAccountant:
        """The run's accountant: the DP count of the users (when counted), then one sampled Gaussian per round."""
        p = self.params
        return RoundAccountant(self.round_event(self.noise_multiplier), p.delta, p.accountant, self.adjacency,
                               initial=self.initial_event())

    def planned_epsilon(self) -> float:
        """The epsilon this run will state if it runs its planned rounds (or up to its budget stop)."""
        return planned_epsilon(self.run_accountant(), self.params.rounds, self.params.max_epsilon)

    def select(self, data: TrainData) -> Selection:
        """What the rounds train on (userdp: every sentence, users sampled by their own coins)."""
        return Selection(data, sampling=self)

    def denominator_for(self, population: Population) -> float:
        """``q_user * N``: the expected number of sampled users, fixed before training."""
        return self.params.q_user * population.value

    def noise_split(self, population: Population) -> tuple[float, float | None]:
        """``(z_Delta, sigma_b)``: the update's noise multiplier and the std of the clip count's noise, for
        ``population`` users (the public or DP count). A fixed clip: ``(z, None)``. Adaptive clipping: the
        two share z (:func:`privacy.accounting.events.delta_noise_multiplier`); refused, before anything is
        trained, when the count's noise alone would not leave room for the update's."""
        p, z = self.params, self.noise_multiplier
        if not p.adaptive_clip:
            return z, None
        count_noise = p.quantile_noise if p.quantile_noise is not None else p.q_user * population.value / 20
        if not count_noise / COUNT_SENSITIVITY > z:
            raise ValueError(
                f"{self.name} with adaptive_clip: quantile_noise {count_noise:.4g} over the count's sensitivity 1/2 "
                f"must exceed the noise multiplier z = {z:.4g} (the two releases together are one Gaussian of "
                "multiplier z): give a larger quantile_noise (its default, q_user * N / 20, grows with q_user and "
                "the users), a smaller noise_multiplier or a larger target_epsilon, or no adaptive_clip")
        return delta_noise_multiplier(z, count_noise / COUNT_SENSITIVITY), count_noise

    def adaptive_clip_lines(self, population: Population) -> tuple[str, ...]:
        """What ``uedp epsilon`` adds about adaptive clipping (nothing with a fixed clip)."""
        p = self.params
        z_delta, count_noise = self.noise_split(population)
        if count_noise is None:
            return ()
        return (f"  adaptive clipping: the clip (from {p.clip:g}) follows a DP estimate of the {p.target_quantile:g} "
                f"quantile of the users' update norms (clip_lr {p.clip_lr:g}); the update's noise multiplier "
                f"z_Delta = {z_delta:.4g} and the count's noise std sigma_b = {count_noise:.4g} (sensitivity 1/2) "
                f"are together z = {self.noise_multiplier:.4g}, the z accounted",)

    def train(self, model: torch.nn.Module, data: TrainData, loss_fn: LossFn, device: torch.device,
              on_round: OnRound, checkpoint: Checkpointer = NO_CHECKPOINT) -> Trained:
        p, z = self.params, self.noise_multiplier
        selection = self.select(data)
        data = selection.data
        population = self.population or Population.public_by_adjacency(len(data.by_user))
        denominator = self.denominator_for(population)
        check_delta(p.delta, round(population.value))
        z_delta, count_noise = self.noise_split(population)
        adaptive = None if count_noise is None else AdaptiveClip(p.clip, p.target_quantile, p.clip_lr, count_noise,
                                                                 denominator)
        accountant = self.run_accountant()
        weights = user_weights(data, p.weight_cap)
        params = [q for q in model.parameters() if q.requires_grad]
        user_ids = list(data.by_user)
        user_sequences = list(data.by_user.values())
        with dropout_switched_off(model) as dropout:  # layers' own draws would be shared by all users
            trainer = self.local_trainer(model, loss_fn, device, data.pad_id, data.max_len)

            def one_round(_: int, rng: RoundRandomness) -> RoundOutput:
                clip = p.clip if adaptive is None else adaptive.value  # C_t: public (earlier rounds' releases)
                sampled = rng.poisson_sample("sample-users", user_ids, p.q_user)
                streams = [rng.stream("local-batches", user_ids[i]) for i in sampled]
                theta = flatten(params)
                sigma = z_delta * clip * WEIGHT_CEILING
                pending = noise_ahead([theta], sigma, rng.stream("noise"))  # drawn while the users train
                summed = trainer.clipped_sum_with_count(theta, [user_sequences[i] for i in sampled],
                                                        weights[sampled].tolist(), streams, clip)
                noise = pending.result()[0]
                # the released average (total + noise) / denominator, then the server's step, in place
                step = server.step_(summed.total.add_(noise).div_(denominator))
                update_norm = float(step.norm())  # of the step the released average gave: public, watched
                assign_flat_(params, step.add_(theta))
                if adaptive is not None:
                    adaptive.update(summed.within_clip, len(sampled), rng.stream("clip-noise"))
                # neither the local losses nor the number of sampled users is released; the update's norm is
                # given in units of the first clip: an adapting clip scales the noise, which is no divergence
                return RoundOutput(update_norm=update_norm * p.clip / clip)

            server = server_optimizer(p)
            loop = RoundLoop(self.name, p.rounds, accountant, self.randomness, p.delta, p.max_epsilon,
                             state={"model": model, **({"clip": adaptive} if adaptive is not None else {}),
                                    **server_state(server)})
            model.train()
            outcome = loop.run(one_round, on_round, checkpoint)
        clip_extra, clip_notes = self._clip_statement(z_delta, adaptive)
        statement = private_statement(
            self.name, self.unit, accountant, outcome, delta=p.delta, accountant=p.accountant, noise_multiplier=z,
            sampling_probability=p.q_user, randomness=self.randomness, population=population,
            extra={**clip_extra, "denominator": denominator, **selection.extra}, dropout_switched_off=dropout,
            notes=(*clip_notes, *server_notes(server, p, data.max_len)))
        return Trained(replace(statement, public=(*statement.public, *selection.public)), sampling=selection.sampling)

    def _clip_statement(self, z_delta: float, adaptive: AdaptiveClip | None) -> tuple[dict[str, float], tuple[str, ...]]:
        """What the statement says about the clip: its noise with a fixed clip; with adaptive clipping the
        first and last clip (public: functions of released noisy counts), both noises and a note."""
        p = self.params
        if adaptive is None:
            return {"noise_std": z_delta * p.clip * WEIGHT_CEILING, "sensitivity": p.clip * WEIGHT_CEILING}, ()
        extra = {"clip_start": adaptive.start, "clip_final": adaptive.value, "update_noise_multiplier": z_delta,
                 "quantile_noise": adaptive.count_noise, "target_quantile": adaptive.target_quantile}
        return extra, (f"adaptive clipping (Andrew et al. 2021): the clip followed a DP estimate of the "
                       f"{adaptive.target_quantile:g} quantile of the users' update norms, from {adaptive.start:g} to "
                       f"{adaptive.value:.4g}; each round's update (noise {z_delta:.4g} times its clip) and count of "
                       f"users within the clip (noise std {adaptive.count_noise:.4g}, sensitivity 1/2) are together "
                       f"one Gaussian of noise multiplier z = {self.noise_multiplier:.4g}, the z accounted; every "
                       "clip is a function of released noisy counts, hence public",)

    def noise_to_signal(self, units: float) -> NoiseToSignal:
        """The averaged update's noise beside its signal, for ``units`` users (the public or DP count). With
        adaptive clipping the update's noise multiplier is z_Delta (the clip count takes the rest of z), and
        noise and signal both scale with the moving clip, so the ratio does not depend on it."""
        p = self.params
        z_update, _ = self.noise_split(Population.declared(max(1, round(units))))
        return NoiseToSignal(self.name, z_update * p.clip * WEIGHT_CEILING, p.clip, p.q_user * units, "server-sgd",
                             fixed_noise=p.target_epsilon is None)

    def rounds_with(self, units: HostUnits, rounds: range) -> int:
        """Rounds of ``rounds`` that sample one of ``units.users`` (audit canaries)."""
        return int(self.randomness.sampled_in("sample-users", rounds, units.users, self.params.q_user).sum())

    def local_trainer(self, model: torch.nn.Module, loss_fn: LossFn, device: torch.device, pad_id: int,
                      max_len: int = 0) -> LocalTrainer:
        return make_local_trainer(self.params, model, loss_fn, device, pad_id, max_len)


def server_optimizer(p: UserDpParams) -> ServerOptimizer:
    """The server optimizer a configuration asks for (post-processing of the released averages)."""
    return ServerOptimizer(p.server_optimizer, p.server_lr, p.server_beta1, p.server_beta2, p.server_tau)


def server_state(server: ServerOptimizer) -> dict[str, ServerOptimizer]:
    """The loop state a server optimizer adds: its moments (sgd has none, and its checkpoints stay as they were)."""
    return {} if server.kind == "sgd" else {"server": server}


def server_notes(server: ServerOptimizer, p: UserDpParams, max_len: int = 0) -> tuple[str, ...]:
    """What the statement says about the update rule: user-level DP-SGD where each user returns a gradient,
    what one update read when a user's sentences were packed into chunks (at most ``max_len`` tokens each),
    and the server optimizer (sgd, the paper's rule, goes without saying)."""
    pieces = (f"chunks (at most {max_len} tokens) of its consecutive sentences" if p.user_text == "chunks"
              else "its own sentences")
    gradient = (f"user-level DP-SGD: each sampled user returned the gradient of one batch of at most "
                f"{p.local_batch_size} {pieces}, clipped to the user clip as a DP-FedAvg delta is",)
    chunks = (f"each sampled user's sentences were packed, in its own order, into chunks of at most {max_len} tokens; "
              f"its update read at most {p.local_steps * p.local_batch_size} of them, drawn by its own stream",)
    return (*(gradient if p.local_update == "gradient" else ()),
            *(chunks if p.user_text == "chunks" and p.local_update != "gradient" else ()),
            *(() if server.kind == "sgd" else (server.describe(),)))


def make_local_trainer(p: UserDpParams, model: torch.nn.Module, loss_fn: LossFn, device: torch.device,
                       pad_id: int, max_len: int = 0) -> LocalTrainer:
    """The local-update engine of userdp and uedp: sequential or vectorized over users (same results);
    with ``user_text=chunks`` it packs each user's sentences into chunks of at most ``max_len`` tokens."""
    if p.user_text == "chunks" and max_len < 1:
        raise ValueError("user_text=chunks packs a user's sentences up to the model's max_len: the data gives none")
    cls = VectorizedLocalTrainer if p.vectorize_users else LocalTrainer
    return cls(model, loss_fn, device, pad_id, p.clip, p.local_steps, p.local_batch_size, p.local_lr,
               chunk_tokens=max_len if p.user_text == "chunks" else 0)
