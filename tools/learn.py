"""What a campaign learns about the twin from what it measures: a correction per plan item, with its uncertainty.

The twin predicts every configuration; the campaign measures some. For each experiment e measured at the judged
level on the plan's workload (without failures), the twin's error is y_e = log(measured_e / predicted_e), and

    y_e = b0 + sum of b_i over the plan items i that e's configuration holds + noise_e,   noise_e ~ N(0, s^2 / n_e)

- b0 ~ N(0, B0_SD^2): the twin's error common to every configuration on this target (its host, its GPU, its
  engine version): what one measured/predicted ratio per campaign used to correct;
- b_i ~ N(0, tau_i^2): how far the twin is off about item i. The twin's prediction is the prior mean (b_i = 0) and
  tau_i^2 = TAU0^2 + (KAPPA * log effect_i)^2, effect_i the twin's predicted effect of the item alone on the base
  configuration: the twin can be wrong by a few % about anything, and by up to its whole claim about what it says
  matters;
- s: the campaign's run-to-run standard deviation (pooled over repeated runs), at least S_MIN; n_e the runs.

A configuration holds item i when applying the item changes nothing in it and changes the base configuration.
The posterior is Gaussian and exact (a solve of the items' size), so every prediction the search ranks by carries
an interval: the corrected change of a candidate c against the best configuration b is

    (twin(c) / twin(b)) * exp(sum_{i in c} b_i - sum_{i in b} b_i) - 1

with the variance of that difference of sums. An item measured at no effect twice, where the twin said +16%, has
b_i near log(1 / 1.16), and every later combination that holds it carries that.

Why this model and not a Gaussian process over item-indicator vectors with the twin as its mean: a campaign
measures 5 to 20 configurations of 5 to 20 items, and a GP with an additive kernel over indicators is this model;
the interactions a richer kernel would add cannot be told from noise with that many points (each pair would need a
configuration with one member and not the other, at least twice the launches the campaign spends). The linear
model is exact in closed form, costs microseconds, and each term reads as a statement the summary can make ("03:
predicted +5.1%, measured no effect"). Interactions the twin models (a cap that only pays with a larger KV pool)
stay in the twin's own prediction of each configuration; the learnt terms correct it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from agent import models as m

B0_SD = 0.5  # the prior sd of the common log error (the twin off by a factor 1.6 either way)
TAU0 = 0.03  # the prior sd of any item's log error: a few % about anything
KAPPA = 1.0  # and up to its whole predicted effect about what the twin says matters
SUSPECT_SD = 1.0  # the prior sd of a suspect's log error: free to carry a whole miss (tools/search.py: probes)
S_MIN = 0.005  # the run-to-run sd is at least 0.5% (the noise model never trusts one run fully)


@dataclass(frozen=True)
class Observation:
    """One measured experiment as the model sees it: the items its configuration holds and the twin's log error."""

    experiment_id: int
    number: int
    items: frozenset[str]
    log_error: float  # log(measured / predicted)
    runs: int
    measured: float
    predicted: float


@dataclass
class Belief:
    """The posterior over the twin's common error and its error about each item."""

    items: list[str]
    mean: np.ndarray  # [b0, b_1 .. b_k]
    cov: np.ndarray
    prior_sd: dict[str, float]
    sigma: float  # the run-to-run sd the observations were weighted with (relative)
    observations: list[Observation] = field(default_factory=list)

    def _vector(self, held: Iterable[str], sign: float = 1.0, into: np.ndarray | None = None) -> np.ndarray:
        v = np.zeros(len(self.items) + 1) if into is None else into
        for i in held:
            if i in self.index:
                v[self.index[i]] += sign
        return v

    @property
    def index(self) -> dict[str, int]:
        return {i: k + 1 for k, i in enumerate(self.items)}

    @property
    def common(self) -> tuple[float, float]:
        """The twin's log error common to every configuration: (mean, sd)."""
        return float(self.mean[0]), float(math.sqrt(max(self.cov[0, 0], 0.0)))

    def item(self, item_id: str) -> tuple[float, float]:
        """The twin's log error about one item: (mean, sd); (0, its prior sd) for an item never measured."""
        k = self.index.get(item_id)
        if k is None:
            return 0.0, self.prior_sd.get(item_id, TAU0)
        return float(self.mean[k]), float(math.sqrt(max(self.cov[k, k], 0.0)))

    def difference(self, held: Iterable[str], against: Iterable[str]) -> tuple[float, float]:
        """(mean, sd) of the log correction of a configuration holding `held` against one holding `against`: the
        common error cancels, the items both hold cancel."""
        held, against = set(held), set(against)
        d = self._vector(held - against)
        d = self._vector(against - held, -1.0, d)
        extra = sum(self.prior_sd.get(i, TAU0) ** 2 for i in (held ^ against) if i not in self.index)
        return float(d @ self.mean), float(math.sqrt(max(float(d @ self.cov @ d) + extra, 0.0)))

    def measured_items(self, item_id: str) -> list[Observation]:
        """The observations that hold the item."""
        return [o for o in self.observations if item_id in o.items]


class CampaignModel:
    """The model for one reading of a campaign's ledger: its observations at the judged `level` (the twin's value
    of a configuration from `predicted`), the items' priors, a belief per suspect, and what a configuration holds."""

    def __init__(
        self,
        method,
        level: int,
        predicted: Callable[[m.ServerConfig], float | None],
        ids: list[str],
        best_config: m.ServerConfig,
    ) -> None:
        self.method, self.level, self.predicted, self.ids, self.best_config = method, level, predicted, ids, best_config
        self._beliefs: dict[str | None, Belief] = {}
        self._observations: list[Observation] | None = None
        self._priors: dict[str, float] = {}
        self._held: dict[str, frozenset[str]] = {}

    def belief(self, suspect: str | None = None) -> Belief:
        """What the measurements say about the twin's errors, per item; with `suspect`, the same measurements read
        as if that item alone could be arbitrarily wrong (its prior left open): the hypothesis that it is the member
        a combined step that fell short hides."""
        if suspect not in self._beliefs:
            method = self.method
            if self._observations is None:
                base = method.base_config()
                b = self.predicted(base)
                effects: dict[str, float | None] = {}
                for i in self.ids:
                    v = self.predicted(method.plan.item(i).apply(base))
                    effects[i] = v / b if v and b else None
                self._observations = observe(method, self.level, self.predicted, self.ids)
                self._priors = prior_sds(effects)
            sd, noise = method.run_sd_pct(), method.noise_pct()
            # the pooled run-to-run sd; else the baseline's noise (about two sd of its mean); else a guess of 2%
            sigma = sd / 100 if sd is not None else noise / 200 if noise is not None else 0.02
            priors = {**self._priors, **({suspect: SUSPECT_SD} if suspect else {})}
            self._beliefs[suspect] = fit(self._observations, priors, sigma)
        return self._beliefs[suspect]

    def held(self, config: m.ServerConfig) -> frozenset[str]:
        """The plan items a configuration holds (held_items)."""
        key = config.model_dump_json()
        if key not in self._held:
            self._held[key] = held_items(self.method.plan, config, self.method.base_config(), self.ids)
        return self._held[key]

    def corrected(
        self, config: m.ServerConfig, v: float, b: float, suspect: str | None = None
    ) -> tuple[float, float, float, float]:
        """(the corrected prediction of `config`, of the best configuration, the change in %, its sd in %) from the
        twin's values `v` and `b` of them (`suspect`: under the hypothesis that the twin is wrong about it)."""
        belief = self.belief(suspect)
        common, _ = belief.common
        mine, best = self.held(config), self.held(self.best_config)
        d, sd = belief.difference(mine, best)
        ref = b * math.exp(common + belief.difference(best, ())[0])
        tok = ref * (v / b) * math.exp(d)
        return tok, ref, (tok - ref) / ref * 100, (tok / ref) * sd * 100

    def learnt(self, config: m.ServerConfig) -> str:
        """What the measurements taught that changes this configuration's prediction against the best, in words."""
        belief = self.belief()
        mine, best = self.held(config), self.held(self.best_config)
        parts = []
        for i in sorted(mine ^ best, key=self.method.plan.item_ids().index):
            mean, sd = belief.item(i)
            if belief.measured_items(i) and abs(mean) >= 0.005:
                parts.append(f"{'' if i in mine else 'without '}{i} {factor_text(mean, sd)}")
        return f"; learnt from the measurements: {', '.join(parts)}" if parts else ""


def held_items(plan: m.Plan, config: m.ServerConfig, base: m.ServerConfig, ids: Iterable[str]) -> frozenset[str]:
    """The items of `ids` that `config` holds: applying one changes nothing in it, and changes `base`."""
    out = set()
    for i in ids:
        item = plan.item(i)
        if item.apply(config) == config and item.apply(base) != base:
            out.add(i)
    return frozenset(out)


def fit(observations: list[Observation], prior_sd: dict[str, float], sigma: float) -> Belief:
    """The posterior of the model in the module docstring for these observations and priors."""
    items = sorted({i for o in observations for i in o.items} | set(prior_sd))
    k = len(items) + 1
    index = {i: n + 1 for n, i in enumerate(items)}
    prior_precision = np.diag([1 / B0_SD**2] + [1 / max(prior_sd.get(i, TAU0), 1e-6) ** 2 for i in items])
    x = np.zeros((len(observations), k))
    y = np.zeros(len(observations))
    w = np.zeros(len(observations))
    s = max(sigma, S_MIN)
    for r, o in enumerate(observations):
        x[r, 0] = 1.0
        for i in o.items:
            x[r, index[i]] = 1.0
        y[r] = o.log_error
        w[r] = max(o.runs, 1) / s**2
    precision = prior_precision + (x.T * w) @ x
    cov = np.linalg.inv(precision)
    mean = cov @ (x.T @ (w * y))
    return Belief(items, mean, cov, dict(prior_sd), s, list(observations))


def prior_sds(effects: dict[str, float | None]) -> dict[str, float]:
    """tau_i from each item's predicted effect alone (a ratio, e.g. 1.16 for +16%; None: not predicted)."""
    return {
        i: math.sqrt(TAU0**2 + (KAPPA * math.log(r)) ** 2) if r is not None and r > 0 else TAU0
        for i, r in effects.items()
    }


def observe(
    method,
    level: int,
    predicted: Callable[[m.ServerConfig], float | None],
    ids: list[str],
    exclude: Callable[[m.Experiment], bool] = lambda e: False,
) -> list[Observation]:
    """The experiments measured at `level` on the plan's workload without failures, with the twin's prediction of
    their configuration (`predicted`: the objective's predicted value, None when it has none)."""
    key = method.plan.workload.workload_key()
    base = method.base_config()
    out = []
    for e in method.experiments:
        if e.workload.workload_key() != key or e.verdict in ("crashed", "ruled_out", "predicted") or exclude(e):
            continue
        runs = method.ok_values(e).get(level)
        if not runs or method.failed_levels(e):
            continue
        value = sum(runs) / len(runs)
        p = predicted(e.config)
        if not p or p <= 0 or value <= 0:
            continue
        held = held_items(method.plan, e.config, base, ids)
        out.append(Observation(e.id or 0, e.number or 0, held, math.log(value / p), len(runs), value, p))
    return out


def factor_text(log_mean: float, log_sd: float) -> str:
    """A log correction as a factor with its interval, in words: "x0.92 (0.89-0.95)"."""
    lo, hi = math.exp(log_mean - 2 * log_sd), math.exp(log_mean + 2 * log_sd)
    return f"x{math.exp(log_mean):.3f} ({lo:.2f}-{hi:.2f})"
