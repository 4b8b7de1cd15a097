#!/usr/bin/env python3
"""An OTLP/HTTP endpoint that accepts every export and keeps nothing: what `bench.sh cpu`
exports traces to, so that Tern's side of tracing is measured alone.

Usage: python3 loadtest/otlp-sink.py PORT
"""
import http.server
import sys


class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
