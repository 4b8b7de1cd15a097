// A JavaScript fetch handler answering JSON, as most JavaScript users write one for an edge
// (componentize-js, StarlingMonkey): it reads the request's URL, headers and body and answers
// a small JSON document. Built by `bash loadtest/bench.sh kinds`; any path is answered.
addEventListener("fetch", (event) => event.respondWith(handle(event.request)));

async function handle(request) {
  const url = new URL(request.url);
  const body = await request.text();
  const answer = {
    ok: true,
    method: request.method,
    path: url.pathname,
    query: Object.fromEntries(url.searchParams),
    agent: request.headers.get("user-agent"),
    bodyBytes: body.length,
    items: [1, 2, 3].map((n) => ({ id: n, name: `item ${n}`, price: n * 9.99 })),
    served: new Date(0).toISOString(),
  };
  return new Response(JSON.stringify(answer), {
    headers: { "content-type": "application/json" },
  });
}
