# A wasi:http handler in Python, built with componentize-py: what a Python user deploys to
# Tern. The e2e tests build it (bindings for wasi:http/proxy generated at build time) and
# serve it; loadtest/ reuses it.
#
# Every request is answered with its method, path and the number of body bytes read;
# `/raise` raises, as a handler with a bug does.
from componentize_py_types import Err, Ok
from wit_world import exports
from wit_world.imports.types import (
    Fields,
    IncomingRequest,
    OutgoingBody,
    OutgoingResponse,
    ResponseOutparam,
)


class IncomingHandler(exports.IncomingHandler):
    def handle(self, request: IncomingRequest, response_out: ResponseOutparam) -> None:
        path = request.path_with_query() or "/"
        if path.rsplit("/", 1)[-1] == "raise":
            raise RuntimeError("raised on purpose")
        body = request.consume()
        stream = body.stream()
        read = 0
        while True:
            try:
                read += len(stream.blocking_read(65536))
            except Err:
                break
        stream.__exit__(None, None, None)
        method = type(request.method()).__name__.removeprefix("Method_").upper()
        text = f"hello from python: {method} {path} read={read}\n"
        headers = Fields.from_list(
            [("content-type", b"text/plain"), ("x-toolchain", b"componentize-py")]
        )
        response = OutgoingResponse(headers)
        response.set_status_code(200)
        out_body = response.body()
        ResponseOutparam.set(response_out, Ok(response))
        out = out_body.write()
        out.blocking_write_and_flush(text.encode())
        out.__exit__(None, None, None)
        OutgoingBody.finish(out_body, None)
