// A wasi:http handler in JavaScript, built with componentize-js (StarlingMonkey): what a
// JavaScript user deploys to Tern. The e2e tests build it and serve it.
//
// - `/hello`: 200 with a greeting naming the method and path.
// - `/echo`: the request body's length.
// - `/throw`: throws, as handlers do: StarlingMonkey then sets a 500 response and returns
//   without finishing its body.
// - `/fetch?url=U`: fetch(U); the backend's status and body, or 502 with the error.
addEventListener("fetch", (event) => event.respondWith(handle(event.request)));

async function handle(request) {
  const url = new URL(request.url);
  const route = "/" + url.pathname.split("/").pop();
  const text = (status, body) =>
    new Response(body, {
      status,
      headers: { "content-type": "text/plain", "x-toolchain": "componentize-js" },
    });
  switch (route) {
    case "/hello":
      return text(200, `hello from javascript: ${request.method} ${url.pathname}\n`);
    case "/echo": {
      const body = await request.arrayBuffer();
      return text(200, `read ${body.byteLength} bytes\n`);
    }
    case "/throw":
      throw new Error("thrown on purpose");
    case "/fetch":
      try {
        const r = await fetch(url.searchParams.get("url"));
        return text(200, `backend said ${r.status}: ${await r.text()}`);
      } catch (e) {
        return text(502, `fetch failed: ${e}\n`);
      }
    default:
      return text(404, "no such path\n");
  }
}
