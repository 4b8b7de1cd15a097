/* cache.c: a handler in C that keeps what it renders in its tenant's cache (tern.h's
 * tern_cache_*; the tenant needs [tenant.cache] enabled = true).
 *
 * The page for a path is rendered once a minute whatever the number of clients: the first
 * request to miss renders it and inserts it, the requests asking meanwhile wait for it
 * (a transactional lookup), the rest find it. Its variants follow the client's
 * Accept-Language. The answer says whether it was found ("x-cache: found") or rendered.
 *
 * Build (Debian: clang lld wasi-libc libclang-rt-14-dev-wasm32):
 *   clang --target=wasm32-wasi -O2 -I guest-sdk/include -o cache-c.wasm guest-sdk/examples/c/cache.c
 */
#include <stdio.h>
#include <string.h>
#include "tern.h"

static char uri[2048];
static char headers[16384];
static char page[65536];

static int fail(const char *what) {
    char why[256];
    int32_t n = tern_cache_last_error(why, sizeof why);
    if (n < 0 || n > (int32_t)sizeof why) n = 0;
    tern_response_set_status(500);
    tern_response_body_write(what, strlen(what));
    tern_response_body_write(": ", 2);
    tern_response_body_write(why, (size_t)n);
    return 0;
}

int main(void) {
    int32_t uri_len = tern_request_uri(uri, sizeof uri);
    int32_t headers_len = tern_request_headers(headers, sizeof headers);
    if (uri_len < 0 || uri_len > (int32_t)sizeof uri) return 1;
    /* Headers that do not fit are not given: the entry then varies on nothing. */
    if (headers_len < 0 || headers_len > (int32_t)sizeof headers) headers_len = 0;

    /* The path is the key; the request's headers tell the variants apart. */
    int32_t entry = tern_cache_lookup(uri, (size_t)uri_len, headers, (size_t)headers_len,
                                      TERN_CACHE_TRANSACTION);
    if (entry < 0) return fail("lookup");
    int32_t state = tern_cache_state(entry);
    const char *how = "found";
    int32_t len;
    if (state & TERN_CACHE_MUST_INSERT) {
        /* This request's turn: render the page and keep it for 60 s (and 30 s more stale). */
        len = snprintf(page, sizeof page, "page %.*s, rendered once\n", (int)uri_len, uri);
        static const char tags[] = "pages";
        static const char vary[] = "accept-language";
        if (tern_cache_insert(entry, page, (size_t)len, 60, 30, tags, strlen(tags), vary,
                              strlen(vary)) < 0)
            return fail("insert");
        how = "rendered";
    } else {
        len = tern_cache_body(entry, page, sizeof page);
        if (len < 0 || len > (int32_t)sizeof page) return fail("body");
    }
    tern_cache_close(entry);

    static const char name[] = "x-cache";
    tern_response_set_status(200);
    tern_response_header_append(name, strlen(name), how, strlen(how));
    tern_response_body_write(page, (size_t)len);
    return 0;
}
