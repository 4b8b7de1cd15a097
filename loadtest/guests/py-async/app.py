# A Python wasi:http handler written the way componentize-py's own HTTP example is: an
# `async` handler run by an asyncio event loop whose only source of events is `wasi:io/poll`,
# reading the request body and writing the response through that loop, answering JSON.
# Built with componentize-py by `bash loadtest/bench.sh kinds`; any path is answered.
import asyncio
import collections
import json
import time

from componentize_py_types import Err, Ok
from wit_world import exports
from wit_world.imports import poll
from wit_world.imports.streams import StreamError_Closed
from wit_world.imports.types import (
    Fields,
    IncomingRequest,
    OutgoingBody,
    OutgoingResponse,
    ResponseOutparam,
)


class WasiLoop(asyncio.AbstractEventLoop):
    """The smallest asyncio loop a handler needs: ready callbacks, and futures resolved when
    a `wasi:io/poll` pollable is ready."""

    def __init__(self):
        self._ready = collections.deque()
        self._pollables = []  # (pollable, future)
        self._running = False

    def call_soon(self, callback, *args, context=None):
        handle = asyncio.Handle(callback, args, self, context)
        self._ready.append(handle)
        return handle

    def create_future(self):
        return asyncio.Future(loop=self)

    def create_task(self, coro, *, name=None, context=None):
        return asyncio.Task(coro, loop=self, name=name, context=context)

    def ready(self, pollable):
        """A future resolved once `pollable` is ready (the pollable is dropped then)."""
        future = self.create_future()
        self._pollables.append((pollable, future))
        return future

    def run_until_complete(self, coro):
        task = self.create_task(coro)
        self._running = True
        asyncio.events._set_running_loop(self)
        try:
            while not task.done():
                while self._ready:
                    handle = self._ready.popleft()
                    if not handle._cancelled:
                        handle._run()
                if task.done():
                    break
                if not self._pollables:
                    raise RuntimeError("the handler waits on nothing")
                waiting, self._pollables = self._pollables, []
                done = set(poll.poll([p for p, _ in waiting]))
                for i, (pollable, future) in enumerate(waiting):
                    if i in done:
                        pollable.__exit__(None, None, None)
                        future.set_result(None)
                    else:
                        self._pollables.append((pollable, future))
        finally:
            asyncio.events._set_running_loop(None)
            self._running = False
        return task.result()

    def is_running(self):
        return self._running

    def is_closed(self):
        return False

    def close(self):
        pass

    def get_debug(self):
        return False

    def time(self):
        return time.monotonic()

    def call_exception_handler(self, context):
        print(context.get("message"), context.get("exception"))


async def read_all(loop, stream):
    chunks = []
    while True:
        try:
            data = stream.read(65536)
        except Err as e:
            if isinstance(e.value, StreamError_Closed):
                return b"".join(chunks)
            raise
        if data:
            chunks.append(data)
        else:
            await loop.ready(stream.subscribe())


async def write_all(loop, stream, data):
    while data:
        room = stream.check_write()
        if room == 0:
            await loop.ready(stream.subscribe())
            continue
        stream.write(data[:room])
        data = data[room:]
    stream.flush()
    await loop.ready(stream.subscribe())


async def handle_async(request: IncomingRequest, response_out: ResponseOutparam):
    loop = asyncio.get_running_loop()
    path = request.path_with_query() or "/"
    body = request.consume()
    stream = body.stream()
    data = await read_all(loop, stream)
    stream.__exit__(None, None, None)
    headers = dict(request.headers().entries())
    route, _, query = path.partition("?")
    answer = {
        "ok": True,
        "method": type(request.method()).__name__.removeprefix("Method_").upper(),
        "path": route,
        "query": dict(kv.partition("=")[::2] for kv in query.split("&") if kv),
        "agent": headers.get("user-agent", b"").decode(),
        "body_bytes": len(data),
        "items": [{"id": n, "name": f"item {n}", "price": n * 9.99} for n in (1, 2, 3)],
    }
    response = OutgoingResponse(Fields.from_list([("content-type", b"application/json")]))
    response.set_status_code(200)
    out_body = response.body()
    ResponseOutparam.set(response_out, Ok(response))
    out = out_body.write()
    await write_all(loop, out, json.dumps(answer).encode())
    out.__exit__(None, None, None)
    OutgoingBody.finish(out_body, None)


class IncomingHandler(exports.IncomingHandler):
    def handle(self, request: IncomingRequest, response_out: ResponseOutparam) -> None:
        WasiLoop().run_until_complete(handle_async(request, response_out))
