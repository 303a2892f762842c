"""Run one generate item to completion across workers, keeping partial trajectories.

Each attempt streams from a colocated worker or from a PD pair (the same body with
bootstrap fields to both, the decode's stream is the answer). When an attempt ends
without finishing (the control plane drained its worker, the worker died, a prefill
failed while its decode waited), the tokens so far are kept and prompt + partial output
is resubmitted elsewhere with the remaining budget; the client sees one response. Only a
client's own abort, a finished generation, or a worker's rejection of the request end it.
"""
from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Sequence
from urllib.parse import urlparse

from pearl_sglang.aio import gather_settled
from pearl_sglang.core.state import ARRIVING_ACTIVITIES
from pearl_sglang.core.straggler_isolation import Isolation
from pearl_sglang.router.activity import TurnWindows, Window, WorkerActivity
from pearl_sglang.router.admission import AdmissionGate
from pearl_sglang.router.encoded_ids import EncodedIds, as_list
from pearl_sglang.router.errors import ServiceUnavailable, UpstreamFailed
from pearl_sglang.router.generate_request import GenerateItem
from pearl_sglang.router.inflight import EndCause, InFlight, InFlightRegistry
from pearl_sglang.router.load import LoadModel
from pearl_sglang.router.selection import NoRoute, Selector, Target, context_tokens, prefix_key
from pearl_sglang.router.stitch import Stitcher
from pearl_sglang.state_store import StateStore
from pearl_sglang.workers.client import WorkerTransport
from pearl_sglang.workers.errors import WorkerError, WorkerFailed, WorkerStalled, WorkerUnavailable


def _held(ids: Sequence[int] | None) -> Sequence[int] | None:
    """The prompt as the dispatcher keeps and sends it: ids still in their JSON text stay
    so (a worker body writes them back as that text), others become a list."""
    if ids is None or isinstance(ids, EncodedIds):
        return ids
    return list(ids)


ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


class RouteAborted(Exception):
    """A client's abort ended a request while it waited for a route."""


@dataclass(frozen=True)
class DispatchConfig:
    max_attempts: int = 8
    internal_stream_interval: int = 16
    route_wait_s: float = 60.0
    # While the control plane brings a worker up (joining, or relaunching in a new role), a
    # request with no route waits for it this long instead of ``route_wait_s``: the gap is
    # of PEARL's own making (a change that keeps no old path serving), not a lost cluster.
    arriving_wait_s: float = 600.0
    prefill_grace_s: float = 30.0

    def validate(self) -> None:
        if self.max_attempts < 1 or self.internal_stream_interval < 1:
            raise ValueError("max_attempts and internal_stream_interval must be >= 1")
        if not 0 < self.route_wait_s <= self.arriving_wait_s:
            raise ValueError("route_wait_s must be > 0 and at most arriving_wait_s")


@dataclass(frozen=True)
class Completed:
    """What telemetry and metrics learn from a finished item (times: event-loop clock)."""

    item: GenerateItem
    trajectory: str | None
    turn: int | None
    key: tuple[int, ...]
    prompt_ids: Sequence[int] | None
    final: dict[str, Any]
    target: Target | None
    attempts: int
    started: float
    first_chunk_at: float | None
    ended: float
    first_chunk_tokens: int  # generated tokens its first chunk carried (SGLang sends the first at once)
    # What the workers did meanwhile (``activity``): the prefill tokens the prefix holder
    # finished while this item waited for its first chunk, and what its decode worker
    # decoded and prefilled from the first chunk to the end (None when the item moved
    # between workers or never streamed).
    queued_prefill_tokens: int = 0
    decode_window: Window | None = None


def attempt_rid(rid: str, attempt: int) -> str:
    """The rid the workers see for ``attempt`` (1-based) of client request ``rid``: the
    first keeps the client's rid, later ones get ``~n`` (SGLang would abort a resubmission
    reusing the rid of a stream that ended less than 2 s before)."""
    return rid if attempt <= 1 else f"{rid}~{attempt}"


def _finish_reason(chunk: dict[str, Any]) -> dict[str, Any] | None:
    return (chunk.get("meta_info") or {}).get("finish_reason")


class Dispatcher:
    def __init__(self, *, transport: WorkerTransport, store: StateStore, selector: Selector,
                 inflight: InFlightRegistry, gate: AdmissionGate,
                 config: DispatchConfig, unavailable: Callable[[], set[int]] = set,
                 on_worker_failure: Callable[[int], None] = lambda slot: None,
                 on_worker_stalled: Callable[[int], None] = lambda slot: None,
                 on_complete: Callable[[Completed], None] = lambda c: None,
                 loads: LoadModel | None = None, activity: WorkerActivity | None = None,
                 wait_for_workers: bool = True,
                 on_turn_start: Callable[[str, float], None] = lambda trajectory, now: None,
                 on_turn_end: Callable[[str, int | None, float], None] = lambda trajectory, slot, now: None,
                 isolation: Callable[[str | None, float], Isolation | None] = lambda trajectory, now: None) -> None:
        self.transport = transport
        self.loads = loads if loads is not None else LoadModel(inflight)
        # What each worker decoded and prefilled, for the turns' telemetry windows.
        self.activity = activity if activity is not None else WorkerActivity(
            lambda: asyncio.get_running_loop().time())
        self.store = store
        self.selector = selector
        self.inflight = inflight
        self.gate = gate
        self.config = config
        self.unavailable = unavailable
        self.on_worker_failure = on_worker_failure
        self.on_worker_stalled = on_worker_stalled
        self.on_complete = on_complete
        # Without a control plane nothing brings a dead worker back before a client gives
        # up: refuse at once instead of holding every request for ``route_wait_s``. An
        # empty pool is still waited for: the worker API may register a worker any time.
        self.wait_for_workers = wait_for_workers
        # A named trajectory's turns, for its critical-path estimate: sent, and ended
        # (however they end, with the worker that generated last); and the straggler
        # isolation placement applies to its turn (None: plain placement).
        self.on_turn_start = on_turn_start
        self.on_turn_end = on_turn_end
        self.isolation = isolation
        self.migrations = 0

    async def run(self, item: GenerateItem, *, trajectory: str | None = None, turn: int | None = None,
                  client_stream_interval: int | None = None) -> AsyncIterator[dict[str, Any]]:
        """Yield stitched cumulative chunks; the last one carries ``finish_reason``. A client
        that does not stream (``client_stream_interval`` None) gets only the last."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        stitcher = Stitcher(item.rid, _held(item.input_ids))
        # In flight from here: an abort (a client's, a pause, the router stopping) reaches
        # it while it is still held or waiting for a route, not only once it is sent.
        entry = self.inflight.open(item.rid)
        if not self.gate.is_open:
            # Held while a reconfiguration finishes; released in the order of the request's
            # ``priority`` (higher first, as SGLang's default), so stragglers go first.
            priority = item.extra.get("priority")
            try:
                admitted = await self._admitted(entry, priority if type(priority) is int else 0)
            except BaseException:
                self.inflight.close(item.rid)
                raise
            if not admitted:
                self.inflight.close(item.rid)
                yield self._final(stitcher, item, started, ABORTED)
                return
        first_chunk_at: float | None = None
        windows = TurnWindows(self.activity)
        key = prefix_key(item.input_ids, item.text)
        context = context_tokens(item.input_ids, item.text)
        # This trajectory's next turn is here: it is running work now, no longer owed.
        self.loads.turn_started(trajectory, key)
        if trajectory is not None:
            self.on_turn_start(trajectory, started)
        failed: set[int] = set()
        target: Target | None = None
        finished = False
        try:
            while True:
                if entry.cause is EndCause.CLIENT_ABORT:
                    finished = True
                    yield self._final(stitcher, item, started, ABORTED)
                    return
                remaining = item.max_new_tokens - stitcher.generated
                if stitcher.generated and remaining <= 0:
                    finished = True
                    yield self._final(stitcher, item, started,
                                      {"type": "length", "length": item.max_new_tokens})
                    return
                try:
                    target = await self.route(key, trajectory=trajectory, exclude=failed, what=item.rid,
                                              context=context if not stitcher.generated
                                              else context + stitcher.generated, rid=item.rid,
                                              aborted=entry.aborted)
                except RouteAborted:
                    continue  # the client's abort came while it waited: answered above
                main = target.main
                self.inflight.assign(entry, target.slots, tuple(
                    w.endpoint for w in (target.worker, target.prefill, target.decode) if w),
                    worker_rid=attempt_rid(item.rid, stitcher.attempts))
                windows.sent(target.prefix_holder.slot)
                entry.cause = None if entry.cause is EndCause.MIGRATE else entry.cause
                body = self._body(item, stitcher, remaining, client_stream_interval)
                body["rid"] = entry.worker_rid
                final: dict[str, Any] | None = None
                try:
                    async for chunk in self._attempt(target, body, item,
                                                     every_chunk=client_stream_interval is not None):
                        stitcher.update(chunk)
                        if first_chunk_at is None:
                            first_chunk_at = loop.time()
                            self._first_chunk(windows, item.rid, target, chunk, context, stitcher.generated)
                        if _finish_reason(chunk) is not None:
                            final = chunk
                        elif client_stream_interval is not None:  # a client that waits reads only the last
                            yield self._with_prompt_ids(stitcher.merged(), stitcher, item)
                except (WorkerUnavailable, WorkerFailed) as e:
                    slot = int(e.worker_id)
                    failed.add(slot)
                    if isinstance(e, WorkerStalled):
                        # Hung: out of routing at once. Every other request it holds stalls
                        # within the same bound and moves the same way.
                        self.on_worker_stalled(slot)
                    elif isinstance(e, WorkerUnavailable):
                        # Only an unreachable worker is suspect; one that answered 5xx to
                        # this request is alive and must stay in routing for everyone else.
                        self.on_worker_failure(slot)
                if final is not None:
                    reason = _finish_reason(final)
                    # PEARL's own abort of a request still waiting for its KV transfer comes
                    # back from SGLang's decode as status 500 ("Decode transfer failed ...
                    # Aborted by AbortReq"): a move like any other, not a failure.
                    moved = entry.cause is EndCause.MIGRATE
                    if (reason.get("type") != "abort" or entry.cause is EndCause.CLIENT_ABORT
                            or (not moved and (reason.get("status_code") or 0) >= 400)):
                        finished = True
                        out = self._final(stitcher, item, started, None)
                        # The bookkeeping runs once this answer is on its way (the loop's next
                        # turn), before anything else the loop takes up.
                        loop.call_soon(self.on_complete, Completed(
                            item=item, trajectory=trajectory, turn=turn, key=key,
                            prompt_ids=stitcher.prompt_ids, final=out, target=target,
                            attempts=stitcher.attempts, started=started, first_chunk_at=first_chunk_at,
                            ended=loop.time(), first_chunk_tokens=windows.first_chunk_tokens,
                            queued_prefill_tokens=windows.queued_prefill, decode_window=windows.decode_window()))
                        yield out
                        return
                elif entry.cause is EndCause.CLIENT_ABORT:
                    continue
                if stitcher.attempts >= self.config.max_attempts:
                    raise UpstreamFailed(
                        f"request {item.rid} did not finish after {stitcher.attempts} attempts; "
                        f"{stitcher.generated} tokens were generated")
                stitcher.next_attempt()
                windows.stop(moved=True)
                self.migrations += 1
                # Off the old workers at once: a drain waiting for them must not wait for
                # this request while it looks for a new home.
                self.inflight.assign(entry, (), ())
        finally:
            self.inflight.close(item.rid)
            self.loads.prefill_done(item.rid)
            windows.stop()
            if trajectory is not None:
                self.on_turn_end(trajectory, target.main.slot if target is not None else None, loop.time())
            if not finished:
                # The client went away or the request failed: free the workers' slots.
                for url in entry.urls:
                    asyncio.ensure_future(self.transport.abort(url=url, rid=entry.worker_rid))

    def _first_chunk(self, windows: TurnWindows, rid: str, target: Target, chunk: dict[str, Any],
                     context: int, generated: int) -> None:
        """``rid``'s prefill is done: off its holder's queue, counted as computed there (what
        a colocated worker reports; a PD decode reports no cache hits, so the routing
        estimate), and its decode starts."""
        done = self.loads.prefill_done(rid)
        meta = chunk.get("meta_info") or {}
        prompt, cached = meta.get("prompt_tokens"), meta.get("cached_tokens")
        if not target.is_pd and type(prompt) is int and type(cached) is int:
            computed = prompt - cached
        else:
            computed = done[1] if done is not None else 0
        windows.first_chunk(target.prefix_holder.slot, target.main.slot, computed,
                            prompt if type(prompt) is int else context, generated)

    async def _admitted(self, entry: InFlight, priority: int) -> bool:
        """Through the closed admission gate; False if the client's abort came first."""
        admit = asyncio.ensure_future(self.gate.admit(priority))
        try:
            await asyncio.wait((admit, entry.aborted()), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not admit.done():
                admit.cancel()
                await gather_settled(admit)
        if admit.cancelled():
            return False
        admit.result()  # the gate's own 503s
        return True

    async def route(self, key: tuple[int, ...], *, trajectory: str | None, exclude: set[int],
                    what: str, context: int | None = None, rid: str | None = None,
                    remember: bool = True, aborted: Callable[[], asyncio.Future[None]] | None = None) -> Target:
        """Pick a target from the current table, waiting (bounded) while none is routable.
        ``exclude`` holds workers that failed this request; it is cleared when nothing else
        is left, so one bad call never strands a request. With ``rid``, the prefill it sends
        counts as queued on its worker until its first chunk. Without a control plane
        (``wait_for_workers`` false) no route because of open circuits is a 503 at once.
        ``remember`` false: a side call (tokenizing a prompt) that must not count as placing
        the request there. ``aborted``: the request's abort future (made only if it has to
        wait); a wait it ends raises ``RouteAborted``."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        while True:
            try:
                now = loop.time()
                target = self.selector.choose(self.store.table, loads=self.loads.snapshot(now), key=key,
                                              context=context, trajectory=trajectory,
                                              exclude=exclude | self.unavailable(),
                                              isolation=self.isolation(trajectory, now) if remember else None)
            except NoRoute:
                if exclude:
                    exclude.clear()
                    continue
                arriving = self.wait_for_workers and any(
                    w.activity in ARRIVING_ACTIVITIES for w in self.store.table.rollout_workers())
                wait_s = self.config.arriving_wait_s if arriving else self.config.route_wait_s
                left = started + wait_s - loop.time()
                if not self.wait_for_workers and self.unavailable():
                    raise ServiceUnavailable(
                        f"no worker can take {what}: none is active with a closed circuit "
                        f"(open circuits: {sorted(self.unavailable()) or 'none'})", kind="no_worker") from None
                if left <= 0:
                    raise ServiceUnavailable(
                        f"no active worker could take {what} within {wait_s:.0f}s"
                        + (" (workers were still on their way)" if arriving else ""),
                        kind="no_worker") from None
                if aborted is None:
                    await self.store.wait_changed(min(left, 1.0))
                    continue
                changed = asyncio.ensure_future(self.store.wait_changed(min(left, 1.0)))
                try:
                    await asyncio.wait((changed, aborted()), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
                if aborted().done():
                    raise RouteAborted(what) from None
                continue
            if remember:
                self.selector.remember(target, key, trajectory)
            if rid is not None:
                self.loads.prefill_sent(rid, target.prefix_holder.slot, target.prefill_tokens)
            return target

    def _body(self, item: GenerateItem, stitcher: Stitcher, remaining: int,
              client_interval: int | None) -> dict[str, Any]:
        body: dict[str, Any] = {k: v for k, v in item.extra.items() if k != "return_prompt_token_ids"}
        sampling = dict(item.sampling)
        sampling["max_new_tokens"] = remaining
        if "min_new_tokens" in sampling:
            sampling["min_new_tokens"] = max(0, int(sampling["min_new_tokens"]) - stitcher.generated)
        sampling["stream_interval"] = client_interval or self.config.internal_stream_interval
        body["sampling_params"] = sampling
        body["rid"] = item.rid
        if stitcher.generated == 0:
            if item.text is not None:
                body["text"] = item.text
                body["return_prompt_token_ids"] = True
            else:
                body["input_ids"] = _held(item.input_ids) or []
        elif stitcher.prompt_ids is not None:
            body["input_ids"] = as_list(stitcher.prompt_ids) + stitcher.generated_ids
        else:
            raise UpstreamFailed(f"request {item.rid} lost its worker before its prompt ids were known")
        return body

    def _final(self, stitcher: Stitcher, item: GenerateItem, started: float,
               reason: dict[str, Any] | None) -> dict[str, Any]:
        out = stitcher.merged(e2e_latency=asyncio.get_running_loop().time() - started)
        if reason is not None:
            out["meta_info"]["finish_reason"] = reason
        return self._with_prompt_ids(out, stitcher, item)

    @staticmethod
    def _with_prompt_ids(out: dict[str, Any], stitcher: Stitcher, item: GenerateItem) -> dict[str, Any]:
        if item.extra.get("return_prompt_token_ids") and stitcher.prompt_ids is not None:
            out["prompt_token_ids"] = stitcher.prompt_ids
        return out

    def _attempt(self, target: Target, body: dict[str, Any], item: GenerateItem, *,
                 every_chunk: bool) -> AsyncIterator[dict[str, Any]]:
        """The worker's chunks; without ``every_chunk`` (a client that waits for the end)
        the transport may leave out those between the first and the last (``WorkerTransport``)."""
        if not target.is_pd:
            w = target.worker
            return self.transport.stream_generate(slot=w.slot, url=w.endpoint, body=body, every_chunk=every_chunk)
        return self._pd_attempt(target, body, item, every_chunk=every_chunk)

    async def _pd_attempt(self, target: Target, body: dict[str, Any], item: GenerateItem, *,
                          every_chunk: bool) -> AsyncIterator[dict[str, Any]]:
        prefill, decode = target.prefill, target.decode
        pd_body = {**body, "bootstrap_host": urlparse(prefill.endpoint).hostname,
                   "bootstrap_port": prefill.bootstrap_port, "bootstrap_room": secrets.randbits(63)}
        prefill_call = asyncio.ensure_future(self.transport.post_json(
            slot=prefill.slot, url=prefill.endpoint, path="/generate", body={**pd_body, "stream": False}))
        chunks = self.transport.stream_generate(slot=decode.slot, url=decode.endpoint, body=pd_body,
                                                every_chunk=every_chunk).__aiter__()
        next_chunk = asyncio.ensure_future(chunks.__anext__())
        try:
            while True:
                waiting = {next_chunk} if prefill_call.done() else {next_chunk, prefill_call}
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if prefill_call in done and prefill_call.exception() is not None:
                    raise prefill_call.exception()
                if next_chunk not in done:
                    continue
                try:
                    chunk = next_chunk.result()
                except StopAsyncIteration:
                    return
                if _finish_reason(chunk) is not None and item.return_logprob:
                    chunk = await self._merge_input_logprobs(chunk, prefill_call)
                yield chunk
                next_chunk = asyncio.ensure_future(chunks.__anext__())
        except WorkerError as e:
            if e.worker_id == str(prefill.slot):
                # The decode would wait for KV that never comes: free it now, never hang.
                await self.transport.abort(url=decode.endpoint, rid=body["rid"])
            else:
                await self.transport.abort(url=prefill.endpoint, rid=body["rid"])
            raise
        finally:
            for task in (next_chunk, prefill_call):
                if not task.done():
                    task.cancel()
            await gather_settled(next_chunk, prefill_call)
            await chunks.aclose()

    async def _merge_input_logprobs(self, chunk: dict[str, Any], prefill_call: asyncio.Future) -> dict[str, Any]:
        try:
            reply = await asyncio.wait_for(asyncio.shield(prefill_call), self.config.prefill_grace_s)
        except (asyncio.TimeoutError, WorkerError):
            return chunk
        pre = (reply or {}).get("meta_info", {}).get("input_token_logprobs") if isinstance(reply, dict) else None
        if not pre:
            return chunk
        meta = dict(chunk["meta_info"])
        meta["input_token_logprobs"] = list(pre) + list(meta.get("input_token_logprobs") or [])
        return {**chunk, "meta_info": meta}
