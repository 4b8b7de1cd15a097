/* ratelimit.c: a handler in C that keeps each client to its share (tern.h's tern_rate_*;
 * the tenant declares the counter and the box it uses):
 *
 *   [[tenant.rate_counter]]
 *   name = "clients"
 *   [[tenant.penalty_box]]
 *   name = "slow-down"
 *
 * A client (by address) sending more than 2 requests a second over 10 seconds is answered 429
 * and kept out for a minute; the others are told how many requests they sent in the last 10 s.
 *
 * Build (Debian: clang lld wasi-libc libclang-rt-14-dev-wasm32):
 *   clang --target=wasm32-wasi -O2 -I guest-sdk/include -o ratelimit-c.wasm guest-sdk/examples/c/ratelimit.c
 */
#include <stdio.h>
#include <string.h>
#include "tern.h"

#define COUNTER "clients"
#define BOX "slow-down"

static int fail(void) {
    char why[256];
    int32_t n = tern_rate_last_error(why, sizeof why);
    if (n < 0 || n > (int32_t)sizeof why) n = 0;
    tern_response_set_status(500);
    tern_response_body_write(why, (size_t)n);
    return 0;
}

int main(void) {
    char client[64];
    int32_t len = tern_request_info(TERN_INFO_CLIENT_IP, client, sizeof client);
    if (len < 0 || len > (int32_t)sizeof client) return 1;

    int32_t blocked = tern_rate_check(COUNTER, strlen(COUNTER), client, (size_t)len,
                                      1, 10, 2, BOX, strlen(BOX), 60);
    if (blocked < 0) return fail();
    if (blocked) {
        tern_response_set_status(429);
        tern_response_header_append("retry-after", 11, "60", 2);
        tern_response_body_write("slow down\n", 10);
        return 0;
    }
    int32_t count = tern_rate_count(COUNTER, strlen(COUNTER), client, (size_t)len, 10);
    if (count < 0) return fail();
    char text[128];
    int n = snprintf(text, sizeof text, "%d requests from %.*s in the last 10 s\n", count,
                     (int)len, client);
    tern_response_body_write(text, (size_t)n);
    return 0;
}
