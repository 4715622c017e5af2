"""A continuous-batching scheduler in virtual time, after SGLang's: prefill first, then decode, KV-capped.

One benchmark level is simulated request by request: the client keeps `max_concurrency` requests in
flight (arrivals are immediate, or Poisson at a finite request rate); the server admits waiting
requests into a prefill batch (up to the chunked-prefill size, the max-prefill-tokens budget, the
running-request cap and the KV pool), and otherwise runs one decode step for every running request.
The prefill step yields a request's first token; each decode step yields one more. When the KV pool
cannot hold the next decode step, the request with the most output left is retracted and re-queued,
as SGLang does.

KV admission, as SGLang 0.5.23's PrefillAdder does it (managers/schedule_policy.py): a candidate
needs its prompt rounded up to whole pages, its whole remaining output and one page of allocation
slack; every running request holds back its remaining output times `new_token_ratio` (0.7, decaying to
0.7 * 0.14 over 600 decode steps, reset on retraction and when the server goes idle). SGLang 0.5.23
itself uses a ratio of 1.0 for requests sent with `ignore_eos` ("fixed-length requests cannot benefit
from the early-EOS estimate"), which bench_serving sends; the seeds' table was measured on an earlier
build and cannot be reproduced with that rule (2048 requests never run at once in a 419k-token pool, so
the measured peak of 7,216 tok/s is out of reach), so the twin keeps the ratio for them unless
`SchedulerLimits.full_reservation_for_ignore_eos` is set. For the same reason a request admitted in a
prefill step holds back ratio x its output from that step on; SGLang (0.5.23 and earlier builds alike)
charges its whole output (and a page of slack) until the next step (`full_reservation_when_admitted`),
which admits fewer per step once the pool is nearly full, so prefill comes in trickles: at 2048 the twin
loses 8% of its output tok/s with that rule, and refitted with it (scripts/calibrate_twin.py) still ends
13% under the seeds' table there, against 3.5% with the ratio.
The pool is allocated in pages of `page_size` tokens (64 for DSA models such as GLM-5 on CUDA), so a
request holds ceil(tokens / page_size) pages and the usage SGLang reports counts whole pages.
Every token's time comes from the cost model, and the per-request timelines go through the same
metrics code as a real benchmark (tools/metrics.py).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from agent.errors import Interrupted, PivotError
from tools.engines.sim.costmodel import CostModel, StepCost
from tools.metrics import RequestRecord
from tools.profiles import Fault

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
STEPS_PER_TOKEN_BOUND = 20  # a level ends within this many steps per token of its workload (plus STEPS_SLACK)
STEPS_SLACK = 10_000
CHECK_EVERY = 64  # steps (and records) between two calls of a level's `check` (a signal, a stopped deployment)


class SimulationStuck(PivotError):
    """The scheduler cannot make progress with these limits: the level would never end."""


class SimulationStopped(Interrupted):
    """The level was stopped before it finished (pivot got SIGTERM or SIGINT, or the deployment was stopped)."""


@dataclass(frozen=True)
class SchedulerLimits:
    """What caps the scheduler: requests, KV tokens and prefill budgets (resolved from the flags)."""

    max_running_requests: int
    kv_capacity_tokens: int
    chunked_prefill_size: int  # -1: no chunking (one prefill batch is capped by max_prefill_tokens only)
    max_prefill_tokens: int
    schedule_conservativeness: float = 1.0
    page_size: int = 1
    # SGLang 0.5.23 reserves the whole remaining output of ignore_eos requests; the seeds' measurements (an
    # earlier build) follow the decaying new_token_ratio for them too, which is the twin's default: see below.
    full_reservation_for_ignore_eos: bool = False
    # SGLang charges a request admitted in a prefill step its whole output until the next step; the twin's
    # default charges ratio x output from the start, for the same reason: see below.
    full_reservation_when_admitted: bool = False


@dataclass
class Req:
    """A request inside the engine."""

    rid: int
    input_len: int
    output_len: int
    generated: int = 0
    prefilled: int = 0  # prompt tokens already prefilled (chunked prefill)
    join_index: int = 0  # decode steps done when it (re)joined the running batch
    residue: int = 0  # (tokens at join - join_index) mod page_size: which decode steps open a new page for it
    segments: list[tuple[int, int]] = field(default_factory=list)  # decode-step index ranges it took part in
    prefill_token_steps: list[int] = field(default_factory=list)  # prefill steps (by number) that gave it a token

    @property
    def prompt_now(self) -> int:
        """Tokens to prefill: the prompt, plus what it generated before a retraction."""
        return self.input_len + self.generated


@dataclass
class Step:
    """What one engine step did: its kind and duration, who got a token, who finished, who was pushed back."""

    kind: str  # "prefill" | "decode"
    duration_s: float
    cost: StepCost
    batch_size: int
    prefill_tokens: int = 0
    token_rids: list[int] = field(default_factory=list)  # prefill steps: the requests that got a token
    finished: list[int] = field(default_factory=list)
    retracted: list[int] = field(default_factory=list)
    token_usage: float = 0.0
    queue: int = 0
    fault: Fault | None = None


class EngineCore:
    """SGLang-like continuous batching over a cost model, one step at a time (time is the caller's).

    Prefill has priority: waiting requests are admitted while the running-request cap, the prefill
    token budget (chunked-prefill size and max-prefill-tokens) and the KV pool allow (see the module
    docstring for the reservation). Otherwise every running request decodes one token. When the pool
    cannot hold the next decode step, the request with the most output left is retracted.

    KV is counted in pages: `pages` is what running requests hold; a running request's tokens grow by
    one per decode step, so it opens a new page on the steps where its token count is a multiple of the
    page size, which depends only on its residue class; `page_counts[c]` counts running requests of
    class c, so the pages the next step needs are known without visiting every request.
    """

    def __init__(self, cost: CostModel, limits: SchedulerLimits, *, noise: float = 0.0, seed: int = 0,
                 fault: Fault | None = None, ignore_eos: bool = True) -> None:  # fmt: skip
        self.cost, self.limits, self.fault, self.noise = cost, limits, fault, noise
        self.ignore_eos = ignore_eos
        self.page = max(int(limits.page_size), 1)
        self.pages = 0
        self.page_counts = [0] * self.page
        self.rng = np.random.default_rng(seed)
        self.run_factor = float(np.clip(1.0 + noise * self.rng.standard_normal(), 0.5, 1.5)) if noise > 0 else 1.0
        self.waiting: deque[Req] = deque()
        self.running: list[tuple[int, int]] = []  # heap of (decode index at which it finishes, rid)
        self.live: dict[int, Req] = {}
        self.decode_index = 0
        self.prefill_index = 0
        self.init_ratio = INIT_NEW_TOKEN_RATIO * limits.schedule_conservativeness
        self.min_ratio = self.init_ratio * MIN_NEW_TOKEN_RATIO_FACTOR
        self.decay = (self.init_ratio - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.ratio = self.init_ratio
        self.sum_ctx = 0  # prompt + generated at join, over running requests
        self.sum_join = 0  # join_index over running requests
        self.sum_rem_join = 0  # output still owed at join, over running requests
        self.busy_s = 0.0
        self.tensor_s = 0.0
        self.memory_s = 0.0
        self.breakdown_s = {"expert_gemm": 0.0, "dense_gemm": 0.0, "attention": 0.0, "communication": 0.0,
                            "host_overhead": 0.0}  # fmt: skip
        self.max_usage = 0.0
        self.retractions = 0
        self.dead = False

    # ---- state

    def add(self, req: Req) -> None:
        self.waiting.append(req)

    @property
    def has_work(self) -> bool:
        return not self.dead and bool(self.waiting or self.running)

    def running_ctx(self) -> int:
        """KV tokens of running requests: prompt + generated, where generated grows by one per decode step."""
        return self.sum_ctx + len(self.running) * self.decode_index - self.sum_join

    def used_slots(self) -> int:
        """KV slots running requests hold: whole pages."""
        return self.pages * self.page

    def pages_next_decode(self) -> int:
        """New pages the next decode step allocates: running requests whose token count is a page multiple."""
        return self.page_counts[-self.decode_index % self.page]

    def running_rids(self) -> list[int]:
        return [rid for _, rid in self.running]

    def token_usage(self) -> float:
        return self.used_slots() / self.limits.kv_capacity_tokens

    def _ceil_pages(self, tokens: int) -> int:
        return -(-tokens // self.page)

    def _scaled(self, cost: StepCost) -> float:
        jitter = 1.0 + 0.5 * self.noise * float(self.rng.standard_normal()) if self.noise > 0 else 1.0
        scale = max(self.run_factor * jitter, 0.2)
        self.busy_s += cost.busy_s * scale
        self.tensor_s += cost.tensor_s
        self.memory_s += cost.memory_s
        for key, value in cost.breakdown().items():
            self.breakdown_s[key] = self.breakdown_s.get(key, 0.0) + value * scale
        return cost.total_s * scale

    def _join(self, r: Req) -> None:
        r.join_index = self.decode_index
        r.residue = (r.prompt_now - self.decode_index) % self.page
        self.page_counts[r.residue] += 1
        self.pages += self._ceil_pages(r.prompt_now)
        heapq.heappush(self.running, (self.decode_index + (r.output_len - r.generated), r.rid))
        self.live[r.rid] = r
        self.sum_ctx += r.prompt_now
        self.sum_join += self.decode_index
        self.sum_rem_join += r.output_len - r.generated

    def _leave(self, r: Req) -> None:
        self.page_counts[r.residue] -= 1
        self.pages -= self._ceil_pages(r.prompt_now + self.decode_index - r.join_index)
        del self.live[r.rid]
        self.sum_ctx -= r.prompt_now
        self.sum_join -= r.join_index
        self.sum_rem_join -= r.output_len - r.generated
        r.segments.append((r.join_index, self.decode_index))

    # ---- one step

    def step(self) -> Step | None:
        """Run the next step (a prefill if anything can be admitted, else a decode); None when idle."""
        if not self.has_work:
            return None
        return self._prefill() or self._decode()

    def _prefill(self) -> Step | None:
        limits = self.limits
        if not self.waiting or len(self.running) >= limits.max_running_requests:
            return None  # nothing can be admitted (the loop below would not run)
        budget = limits.max_prefill_tokens
        if limits.chunked_prefill_size > 0:
            budget = min(budget, limits.chunked_prefill_size)
        owed = self.sum_rem_join - (len(self.running) * self.decode_index - self.sum_join)
        ratio = 1.0 if (self.ignore_eos and self.limits.full_reservation_for_ignore_eos) else self.ratio
        free = limits.kv_capacity_tokens - self.used_slots() - ratio * owed
        batch: list[Req] = []
        tokens = 0
        while self.waiting and len(self.running) + len(batch) < limits.max_running_requests and tokens < budget:
            r = self.waiting[0]
            left = r.prompt_now - r.prefilled
            need = self._ceil_pages(left) * self.page + (r.output_len - r.generated) + self.page
            if need >= free and (self.running or batch):
                break
            take = min(left, budget - tokens)
            if take < left and limits.chunked_prefill_size <= 0:
                break
            r.prefilled += take
            tokens += take
            if limits.full_reservation_when_admitted:  # SGLang's _update_prefill_budget
                free -= self._ceil_pages(take) * self.page + self.page
                if r.prefilled == r.prompt_now:
                    free -= r.output_len - r.generated
            else:
                free -= self._ceil_pages(take) * self.page + ratio * (r.output_len - r.generated)
            batch.append(r)
            if r.prefilled < r.prompt_now:
                break  # chunked: this request goes on in the next prefill step
            self.waiting.popleft()
        if not batch:
            return None
        pairs = sum(r.prefilled * r.prefilled / 2.0 for r in batch)
        cost = self.cost.prefill(tokens, pairs, len(batch))
        self.prefill_index += 1
        step = Step("prefill", self._scaled(cost), cost, len(batch), prefill_tokens=tokens, queue=len(self.waiting))
        for r in batch:
            if r.prefilled < r.prompt_now:
                continue
            r.generated += 1
            r.prefill_token_steps.append(self.prefill_index)
            step.token_rids.append(r.rid)
            if r.generated >= r.output_len:
                step.finished.append(r.rid)
            else:
                self._join(r)
        step.token_usage = self.token_usage()
        return step

    def _decode(self) -> Step | None:
        retracted = []
        while self.running and (self.pages + self.pages_next_decode()) * self.page > self.limits.kv_capacity_tokens:
            if len(self.running) == 1:
                break
            victim = max(
                (self.live[rid] for _, rid in self.running),
                key=lambda q: q.output_len - q.generated - (self.decode_index - q.join_index),
            )
            self.running = [(f, rid) for f, rid in self.running if rid != victim.rid]
            heapq.heapify(self.running)
            self._leave(victim)
            victim.generated += victim.segments[-1][1] - victim.segments[-1][0]
            victim.prefilled = 0
            self.waiting.appendleft(victim)
            retracted.append(victim.rid)
            self.retractions += 1
            self.ratio = self.init_ratio
        if not self.running:
            return None
        batch = len(self.running)
        ctx = self.running_ctx()
        opened = self.pages_next_decode()
        usage = (self.pages + opened) * self.page / self.limits.kv_capacity_tokens
        self.max_usage = max(self.max_usage, usage)
        if self.fault is not None and batch >= int(self.fault.when.get("min_running_requests", 0)):
            self.dead = True
            return Step("decode", 0.0, StepCost(0.0), batch, retracted=retracted, fault=self.fault, token_usage=usage)
        cost = self.cost.decode(batch, ctx)
        step = Step("decode", self._scaled(cost), cost, batch, retracted=retracted, token_usage=usage,
                    queue=len(self.waiting))  # fmt: skip
        self.pages += opened
        self.decode_index += 1
        self.ratio = max(self.min_ratio, self.ratio - self.decay)
        while self.running and self.running[0][0] <= self.decode_index:
            _, rid = heapq.heappop(self.running)
            r = self.live[rid]
            self._leave(r)
            r.generated = r.output_len
            step.finished.append(rid)
        return step


@dataclass
class LevelSimulation:
    """What one simulated level produced: request records, step costs, KV usage, and any fault."""

    records: list[RequestRecord]
    busy_s: float
    wall_s: float
    breakdown_s: dict[str, float]
    max_token_usage: float
    decode_steps: int
    prefill_steps: int
    retractions: int
    fault: Fault | None = None
    fault_at_s: float | None = None
    tensor_s: float = 0.0  # per GPU: the level's FLOPs at the tensor cores' peak rate
    memory_s: float = 0.0  # per GPU: the level's bytes read at the memory's peak bandwidth
    clock: float = 1.0  # the SM clock share it ran at (below 1 under a power limit)


def simulate_level(
    cost: CostModel,
    limits: SchedulerLimits,
    *,
    max_concurrency: int,
    input_lens: np.ndarray,
    output_lens: np.ndarray,
    arrivals_s: np.ndarray | None = None,
    seed: int = 0,
    noise: float = 0.0,
    fault: Fault | None = None,
    ignore_eos: bool = True,
    check: Callable[[], None] | None = None,
) -> LevelSimulation:
    """Simulate one benchmark level in virtual time: the client keeps `max_concurrency` requests in flight,
    each sent when it is due (`arrivals_s`, all at once by default) and a slot is free.

    Bounded: limits under which nothing can ever be admitted raise SimulationStuck at once, and a level that
    has not ended after STEPS_PER_TOKEN_BOUND steps per token of its workload raises it too. `check` is called
    every CHECK_EVERY steps and records; it raises (SimulationStopped) to end the level early."""
    n = len(input_lens)
    max_steps = STEPS_PER_TOKEN_BOUND * int(np.sum(input_lens) + np.sum(output_lens)) + STEPS_SLACK
    steps = 0
    core = EngineCore(cost, limits, noise=noise, seed=seed, fault=fault, ignore_eos=ignore_eos)
    arrivals = np.zeros(n) if arrivals_s is None else np.asarray(arrivals_s, dtype=np.float64)
    reqs = _requests(input_lens, output_lens, check)
    send = np.zeros(n)
    end = np.full(n, np.nan)
    errors: dict[int, str] = {}
    decode_ends: list[float] = []
    prefill_ends: list[float] = []
    pending: list[tuple[float, int]] = []
    t = 0.0
    next_to_send = in_flight = done = 0
    fault_at = None

    def release(now: float) -> None:
        nonlocal next_to_send, in_flight
        while next_to_send < n and in_flight < max_concurrency:
            send[next_to_send] = max(now, float(arrivals[next_to_send]))
            heapq.heappush(pending, (send[next_to_send], next_to_send))
            next_to_send += 1
            in_flight += 1

    release(0.0)
    while done < n:
        while pending and pending[0][0] <= t:
            core.add(reqs[heapq.heappop(pending)[1]])
        if not core.has_work:
            if not pending:
                break
            t = pending[0][0]
            continue
        steps += 1
        if check is not None and steps % CHECK_EVERY == 0:
            check()
        if steps > max_steps:
            raise SimulationStuck(
                f"the twin's scheduler did not finish the level at concurrency {max_concurrency} in {max_steps:,} "
                f"steps (limits {limits}): it cannot simulate this configuration"
            )
        step = core.step()
        if step is None:
            if pending and pending[0][0] > t:
                t = pending[0][0]
                continue
            raise SimulationStuck(
                f"the twin's scheduler cannot admit any request with {limits}: it cannot simulate this configuration"
            )
        if step.fault is not None:
            fault_at = t
            _fail_unfinished(step.fault, t, next_to_send, send, end, errors)
            break
        t += step.duration_s
        (prefill_ends if step.kind == "prefill" else decode_ends).append(t)
        for rid in step.finished:
            end[rid] = t
            done += 1
            in_flight -= 1
        if step.finished:
            release(t)

    records = _records(reqs, np.asarray(decode_ends), np.asarray(prefill_ends), send, end, errors, t, check)
    wall = float(np.nanmax(end) - send.min()) if n and not np.all(np.isnan(end)) else 0.0
    return LevelSimulation(
        records=records,
        busy_s=core.busy_s,
        tensor_s=core.tensor_s,
        memory_s=core.memory_s,
        wall_s=max(wall, 1e-9),
        breakdown_s=core.breakdown_s,
        max_token_usage=min(core.max_usage, 1.0),
        decode_steps=core.decode_index,
        prefill_steps=core.prefill_index,
        retractions=core.retractions,
        fault=fault if fault_at is not None else None,
        fault_at_s=fault_at,
    )


def _requests(input_lens: np.ndarray, output_lens: np.ndarray, check: Callable[[], None] | None) -> list[Req]:
    """One Req per benchmark request, in send order."""
    reqs = []
    for i, (a, b) in enumerate(zip(input_lens.tolist(), output_lens.tolist(), strict=True)):
        if check is not None and i % CHECK_EVERY == 0:
            check()
        reqs.append(Req(i, int(a), int(b)))
    return reqs


def _fail_unfinished(
    fault: Fault, t: float, next_to_send: int, send: np.ndarray, end: np.ndarray, errors: dict[int, str]
) -> None:
    """A fault at `t`: every unfinished request fails, those not yet sent find the server down."""
    for i in range(len(end)):
        if np.isnan(end[i]):
            if i >= next_to_send:
                send[i], errors[i] = t, "connection refused (server is down)"
            else:
                errors[i] = f"server crashed: {fault.log}"
            end[i] = max(t, send[i])


def _records(
    reqs: list[Req],
    dec: np.ndarray,
    pre: np.ndarray,
    send: np.ndarray,
    end: np.ndarray,
    errors: dict[int, str],
    t: float,
    check: Callable[[], None] | None,
) -> list[RequestRecord]:
    """Each request's record: its token times from the prefill and decode steps that produced them."""
    records = []
    for r in reqs:
        if check is not None and r.rid % CHECK_EVERY == 0:
            check()
        if r.prefill_token_steps:
            parts = [pre[np.asarray(r.prefill_token_steps) - 1], *(dec[a:b] for a, b in r.segments)]
            times = np.concatenate(parts)
            if len(parts) > 2 or len(r.prefill_token_steps) > 1:
                times = np.sort(times)
        else:
            times = np.empty(0)
        failed = errors.get(r.rid)
        records.append(
            RequestRecord(
                start_s=float(send[r.rid]),
                prompt_len=r.input_len,
                chunk_times_s=times,
                chunk_tokens=np.ones(times.size, dtype=np.int64),
                output_len=None if failed else r.output_len,
                end_s=float(end[r.rid]) if not np.isnan(end[r.rid]) else t,
                error=failed,
            )
        )
    return records
