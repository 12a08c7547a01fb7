"""Group commit: concurrent single-report submissions share one transaction.

Each request waits on a future; one task drains everything queued so far and charges it with
:meth:`dp_governor.pipeline.ingest.Ingestor.submit_group` in a worker thread, then answers
every request. While a group commits, the next one gathers, so groups grow with the load and a lone
request waits for nobody. A request is answered 202 only after its group committed; a failing
group fails all of its requests and writes nothing. A policy change during a commit is not such
a failure: only the changed use case's requests answer 409
(:class:`dp_governor.pipeline.ingest.PolicyChanged`), and the rest of the group is committed without
them.
"""

from __future__ import annotations

import asyncio
import contextlib

import anyio.to_thread

from dp_governor.budget import Clock, Decision
from dp_governor.pipeline.ingest import Ingestor, SubmitRequest

__all__ = ["GroupCommitter"]


class GroupCommitter:
    """Queues submissions and commits them in groups of at most ``max_group``."""

    def __init__(self, ingestor: Ingestor, clock: Clock, max_group: int = 1000) -> None:
        self.ingestor = ingestor
        self.clock = clock
        self.max_group = max_group
        self._pending: list[tuple[SubmitRequest, asyncio.Future[Decision]]] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the draining task on the running loop."""
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Answer what is queued, then stop."""
        if self._task is None:
            return
        while self._pending:
            await asyncio.sleep(0.01)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def submit(self, request: SubmitRequest) -> Decision:
        """Queue one submission; return its decision or raise its error."""
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        self._wakeup.set()
        return await future

    def _commit(self, requests: list[SubmitRequest]) -> list[Decision | Exception]:
        return self.ingestor.submit_group(requests, now=self.clock.now())

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                group = self._pending[: self.max_group]
                del self._pending[: self.max_group]
                requests = [r for r, _ in group]
                try:
                    results = await anyio.to_thread.run_sync(self._commit, requests)
                except Exception as exc:  # the whole group rolled back
                    for _, future in group:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), result in zip(group, results, strict=True):
                    if future.done():
                        continue
                    if isinstance(result, Exception):
                        future.set_exception(result)
                    else:
                        future.set_result(result)
