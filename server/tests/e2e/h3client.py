"""An HTTP/3 client on aioquic (PyPI), for the e2e suite: sends requests over one QUIC
connection, all at once, and prints one JSON line per answer (in the order sent).

    python3 h3client.py --connect 127.0.0.1:8443 --authority hello.test --path / [--count N]
        [--method POST] [--header name:value]... [--body-bytes N (byte i is i % 251) | --body TEXT]
        [--cafile ca.pem] [--timeout S]

A line: {"status", "headers" (name -> value, last wins), "body_bytes", "body_sha256", "body"
(the first 4096 bytes as text), "tail_sha256" (of the body's last as many bytes as were sent),
"sent_sha256"} or {"error": "..."} for a stream the server reset. Exits 1 if
the connection could not be made.
"""

import argparse
import asyncio
import hashlib
import json
import ssl
import sys

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, StreamReset


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.http = H3Connection(self._quic)
        self.pending = {}

    def quic_event_received(self, event):
        if isinstance(event, StreamReset) and event.stream_id in self.pending:
            answer = self.pending.pop(event.stream_id)
            answer["future"].set_result({"error": f"reset with code {event.error_code}"})
            return
        if isinstance(event, ConnectionTerminated):
            for answer in self.pending.values():
                if not answer["future"].done():
                    answer["future"].set_result(
                        {"error": f"connection closed: {event.error_code} {event.reason_phrase}"}
                    )
            self.pending.clear()
            return
        for ev in self.http.handle_event(event):
            answer = self.pending.get(ev.stream_id)
            if answer is None:
                continue
            if isinstance(ev, HeadersReceived):
                if answer["status"] is None:
                    for name, value in ev.headers:
                        if name == b":status":
                            answer["status"] = int(value)
                        else:
                            answer["headers"][name.decode()] = value.decode()
            elif isinstance(ev, DataReceived):
                answer["body"].extend(ev.data)
            if getattr(ev, "stream_ended", False):
                self.pending.pop(ev.stream_id)
                answer["future"].set_result(answer)

    async def request(self, method, authority, path, headers, body):
        stream_id = self._quic.get_next_available_stream_id()
        fields = [
            (b":method", method.encode()),
            (b":scheme", b"https"),
            (b":authority", authority.encode()),
            (b":path", path.encode()),
        ] + [(k.encode(), v.encode()) for k, v in headers]
        future = asyncio.get_running_loop().create_future()
        self.pending[stream_id] = {
            "status": None,
            "headers": {},
            "body": bytearray(),
            "future": future,
        }
        self.http.send_headers(stream_id, fields, end_stream=not body)
        if body:
            self.http.send_data(stream_id, body, end_stream=True)
        self.transmit()
        return await future


def render(answer, sent):
    if "error" in answer:
        return answer
    body = bytes(answer["body"])
    return {
        "status": answer["status"],
        "headers": answer["headers"],
        "body_bytes": len(body),
        "body_sha256": hashlib.sha256(body).hexdigest(),
        "body": body[:4096].decode("utf-8", "replace"),
        # What an echo sent back last, against what was sent.
        "tail_sha256": hashlib.sha256(body[len(body) - len(sent):]).hexdigest(),
        "sent_sha256": hashlib.sha256(sent).hexdigest(),
    }


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--connect", required=True)
    p.add_argument("--authority", required=True)
    p.add_argument("--path", default="/")
    p.add_argument("--method", default="GET")
    p.add_argument("--header", action="append", default=[])
    p.add_argument("--body")
    p.add_argument("--body-bytes", type=int)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--cafile")
    p.add_argument("--timeout", type=float, default=30)
    a = p.parse_args()
    host, port = a.connect.rsplit(":", 1)
    config = QuicConfiguration(
        is_client=True,
        alpn_protocols=H3_ALPN,
        server_name=a.authority.split(":")[0],
        max_stream_data=16 << 20,
        max_data=64 << 20,
        idle_timeout=a.timeout,
    )
    if a.cafile:
        config.load_verify_locations(a.cafile)
    else:
        config.verify_mode = ssl.CERT_NONE
    body = b""
    if a.body is not None:
        body = a.body.encode()
    elif a.body_bytes:
        body = bytes(i % 251 for i in range(a.body_bytes))
    headers = [tuple(h.split(":", 1)) for h in a.header]
    try:
        async with connect(
            host, int(port), configuration=config, create_protocol=Client
        ) as client:
            tasks = [
                client.request(a.method, a.authority, a.path, headers, body)
                for _ in range(a.count)
            ]
            answers = await asyncio.wait_for(asyncio.gather(*tasks), a.timeout)
    except Exception as e:  # the connection itself failed
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        sys.exit(1)
    for answer in answers:
        print(json.dumps(render(answer, body)))


asyncio.run(main())
