#!/usr/bin/env python3
"""A live log reader that stops reading: opens `GET /admin/v1/tenants/NAME/logs?follow=1`
through a socket with a 4 KiB receive buffer, reads nothing for STALL seconds, then reads
until the stream has been quiet for 2 s; prints "records dropped" (what it got, and the
dropped counts the stream told it). Used by `bash loadtest/bench.sh logs`.

Usage: stalled-tailer.py ADMIN_PORT TENANT TOKEN STALL_SECONDS
"""
import json
import socket
import sys
import time

port, tenant, token, stall = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.connect(("127.0.0.1", port))
s.sendall(
    f"GET /admin/v1/tenants/{tenant}/logs?follow=1 HTTP/1.1\r\nHost: admin\r\n"
    f"Authorization: Bearer {token}\r\n\r\n".encode()
)
print("attached", flush=True)
time.sleep(stall)
s.settimeout(2)
data = b""
try:
    while True:
        chunk = s.recv(1 << 20)
        if not chunk:
            break
        data += chunk
except socket.timeout:
    pass
head, _, body = data.partition(b"\r\n\r\n")
records = dropped = 0
# Chunked framing: size lines and the NDJSON lines they carry; the size lines are skipped as
# lines that are not JSON objects.
for line in body.split(b"\n"):
    line = line.strip()
    if not line.startswith(b"{"):
        continue
    v = json.loads(line)
    if "request_id" in v:
        records += 1
    dropped += v.get("dropped", 0)
print(records, dropped, flush=True)
