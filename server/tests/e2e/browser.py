"""Drives headless Chromium (Debian's) through its DevTools protocol, for what a page does
after it has loaded (a WebSocket's messages), which `--dump-dom` does not wait for.

  browser.py URL EXPRESSION [CHROMIUM FLAG]...
      Starts Chromium with its own profile, opens URL, waits for the page to load, evaluates
      EXPRESSION in it (a promise is awaited, up to 60 s) and prints one JSON object:
      {"value": ..., "protocol": "h2" | "http/1.1" | ...} (the page's own protocol), or
      {"error": "..."}. The DevTools connection uses the `websockets` library.
"""

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import websockets


async def drive(port, url, expression):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
        pages = [t for t in json.load(r) if t["type"] == "page"]
    async with websockets.connect(pages[0]["webSocketDebuggerUrl"], max_size=None) as cdp:
        ids = iter(range(1, 1 << 30))

        async def call(method, **params):
            n = next(ids)
            await cdp.send(json.dumps({"id": n, "method": method, "params": params}))
            while True:
                reply = json.loads(await cdp.recv())
                if reply.get("id") == n:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply["result"]

        async def evaluate(expr, timeout):
            r = await asyncio.wait_for(
                call("Runtime.evaluate", expression=expr, awaitPromise=True, returnByValue=True),
                timeout,
            )
            if "exceptionDetails" in r:
                raise RuntimeError(json.dumps(r["exceptionDetails"]))
            return r["result"].get("value")

        await call("Page.navigate", url=url)
        deadline = time.monotonic() + 30
        while await evaluate("document.readyState", 10) != "complete":
            if time.monotonic() > deadline:
                raise RuntimeError("the page did not load in 30 s")
            await asyncio.sleep(0.05)
        protocol = await evaluate(
            "performance.getEntriesByType('navigation')[0]?.nextHopProtocol ?? null", 10)
        value = await evaluate(expression, 60)
        return {"value": value, "protocol": protocol}


def main():
    url, expression, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        chromium = subprocess.Popen(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", *flags, "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            active = os.path.join(profile, "DevToolsActivePort")
            deadline = time.monotonic() + 30
            while not (os.path.exists(active) and open(active).read().count("\n") >= 1):
                if time.monotonic() > deadline or chromium.poll() is not None:
                    raise RuntimeError("Chromium did not start its DevTools server")
                time.sleep(0.05)
            port = int(open(active).read().split("\n")[0])
            result = asyncio.run(drive(port, url, expression))
        except Exception as e:  # noqa: BLE001 - every failure is the test's to read
            result = {"error": f"{type(e).__name__}: {e}"}
        finally:
            # Chromium and every process it started (they write to the profile until gone).
            os.killpg(chromium.pid, signal.SIGKILL)
            chromium.wait()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
