"""The e2e tests' WebSocket peers, both from the `websockets` library (not written here).

  wsclient.py echo-server
      Serves WebSockets on 127.0.0.1 (a free port, printed as the first line). Each connection
      is first sent one text message, a JSON object of what its opening said (path, the
      headers a backend would look at, and how many connections came before it), then every
      message it sends is sent back.

  wsclient.py client URL [--send TEXT | --send-bytes N | --header NAME:VALUE]... [--wait-close]
                        [--no-compression]
      Opens URL (offering permessage-deflate unless --no-compression), reads the backend's first message, sends each message in turn and reads its
      echo; then closes (or with --wait-close waits for the server to close). Prints one JSON
      object: {"hello": ..., "echoes": [...], "close_code": N, "close_reason": "..."}, or
      {"status": N, "headers": {...}} when the opening was refused.

  wsclient.py talk URL [--send TEXT | --send-bytes N | --send-raw HEX | --recv N | --abort]...
      Opens URL (no compression), prints {"opened": true} (or {"status": N, ...} when refused),
      then does each step in turn: send a text or binary message, send raw bytes (a frame
      written as it is, masked or not, for what a library refuses to send), receive N
      messages (10 s each), or drop the connection without a close. At the end (or when the
      server closes) it closes and prints {"received": [...], "close_code": N,
      "close_reason": "..."}; a binary message received is {"bytes": LENGTH}.

  wsclient.py hold URL N
      Opens N connections to URL at once, prints {"opened": n, "errors": [...]} when they are
      open (the kinds of failure, if any), then waits
      (up to 60 s) for the server to close them and prints {"codes": {"CODE": count, ...}}.
"""

import asyncio
import json
import sys

import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus


async def echo_server():
    served = 0

    async def handler(ws):
        nonlocal served
        before = served
        served += 1
        req = ws.request
        names = ["x-user", "x-forwarded-for", "x-forwarded-proto", "authorization", "cookie", "host", "sec-websocket-protocol"]
        await ws.send(json.dumps({
            "path": req.path,
            "headers": {n: req.headers.get(n) for n in names},
            "before": before,
        }))
        try:
            async for message in ws:
                await ws.send(message)
        except ConnectionClosed:
            pass

    # (A backlog for a thousand openings at once: the default 100 drops SYNs under load, and a
    # dropped SYN is retried after a second, past the server's connect timeout.)
    async with websockets.serve(handler, "127.0.0.1", 0, max_size=None, backlog=4096) as server:
        port = server.sockets[0].getsockname()[1]
        print(port, flush=True)
        await asyncio.Future()


async def client(url, sends, wait_close, compression, headers):
    try:
        async with websockets.connect(url, max_size=None, open_timeout=10, compression=compression,
                                      additional_headers=headers) as ws:
            # The backend's greeting comes first, unless the server closes the connection
            # before it is relayed (a shutdown right after the opening): then no greeting.
            hello = None
            echoes = []
            try:
                hello = json.loads(await ws.recv())
                for kind, value in sends:
                    await ws.send(value)
                    got = await asyncio.wait_for(ws.recv(), 10)
                    echoes.append(got if kind == "text" else len(got))
                if wait_close:
                    await asyncio.wait_for(ws.wait_closed(), 30)
            except ConnectionClosed:
                pass
            await ws.close()
            print(json.dumps({
                "extensions": ws.response.headers.get("sec-websocket-extensions"),
                "hello": hello,
                "echoes": echoes,
                "close_code": ws.close_code,
                "close_reason": ws.close_reason,
            }))
    except InvalidStatus as e:
        print(json.dumps({
            "status": e.response.status_code,
            "headers": dict(e.response.headers.raw_items()),
            "body": e.response.body.decode("utf-8", "replace") if e.response.body else "",
        }))


async def talk(url, steps):
    try:
        ws = await websockets.connect(url, max_size=None, open_timeout=10, compression=None)
    except InvalidStatus as e:
        print(json.dumps({
            "status": e.response.status_code,
            "headers": dict(e.response.headers.raw_items()),
            "body": e.response.body.decode("utf-8", "replace") if e.response.body else "",
        }), flush=True)
        return
    print(json.dumps({"opened": True, "headers": dict(ws.response.headers.raw_items())}), flush=True)
    received = []
    try:
        for kind, value in steps:
            if kind == "text":
                await ws.send(value)
            elif kind == "bytes":
                await ws.send(value)
            elif kind == "raw":
                ws.transport.write(bytes.fromhex(value))
            elif kind == "recv":
                for _ in range(value):
                    got = await asyncio.wait_for(ws.recv(), 10)
                    received.append(got if isinstance(got, str) else {"bytes": len(got)})
            elif kind == "abort":
                ws.transport.abort()
                print(json.dumps({"received": received, "aborted": True}), flush=True)
                return
        await ws.close()
    except ConnectionClosed:
        pass
    except asyncio.TimeoutError:
        received.append("timeout")
    try:
        await asyncio.wait_for(ws.wait_closed(), 10)
    except asyncio.TimeoutError:
        pass
    print(json.dumps({
        "received": received,
        "close_code": ws.close_code,
        "close_reason": ws.close_reason,
    }), flush=True)


async def hold(url, n):
    async def one():
        ws = await websockets.connect(url, open_timeout=30)
        await ws.recv()
        return ws

    sockets = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    opened = [ws for ws in sockets if not isinstance(ws, Exception)]
    errors = sorted({repr(e) for e in sockets if isinstance(e, Exception)})
    print(json.dumps({"opened": len(opened), "errors": errors[:5]}), flush=True)

    async def closed(ws):
        try:
            await asyncio.wait_for(ws.wait_closed(), 60)
        except asyncio.TimeoutError:
            return "open"
        return str(ws.close_code)

    codes = {}
    for code in await asyncio.gather(*(closed(ws) for ws in opened)):
        codes[code] = codes.get(code, 0) + 1
    print(json.dumps({"codes": codes}), flush=True)


def main():
    if sys.argv[1] == "echo-server":
        asyncio.run(echo_server())
        return
    if sys.argv[1] == "talk":
        steps, args = [], sys.argv[3:]
        while args:
            flag = args.pop(0)
            if flag == "--send":
                steps.append(("text", args.pop(0)))
            elif flag == "--send-bytes":
                steps.append(("bytes", bytes(i % 251 for i in range(int(args.pop(0))))))
            elif flag == "--send-raw":
                steps.append(("raw", args.pop(0)))
            elif flag == "--recv":
                steps.append(("recv", int(args.pop(0))))
            elif flag == "--abort":
                steps.append(("abort", None))
            else:
                sys.exit(f"unknown argument {flag}")
        asyncio.run(talk(sys.argv[2], steps))
        return
    if sys.argv[1] == "hold":
        asyncio.run(hold(sys.argv[2], int(sys.argv[3])))
        return
    url, sends, wait_close, compression, headers = sys.argv[2], [], False, "deflate", []
    args = sys.argv[3:]
    while args:
        flag = args.pop(0)
        if flag == "--send":
            sends.append(("text", args.pop(0)))
        elif flag == "--send-bytes":
            sends.append(("bytes", bytes(i % 251 for i in range(int(args.pop(0))))))
        elif flag == "--wait-close":
            wait_close = True
        elif flag == "--no-compression":
            compression = None
        elif flag == "--header":
            name, value = args.pop(0).split(":", 1)
            headers.append((name, value))
        else:
            sys.exit(f"unknown argument {flag}")
    asyncio.run(client(url, sends, wait_close, compression, headers))


main()
