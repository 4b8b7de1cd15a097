/* hello.c: Tern's hello-world handler in C, using include/tern.h.
 *
 * Build (Debian: clang lld wasi-libc libclang-rt-14-dev-wasm32):
 *   clang --target=wasm32-wasi -O2 -I guest-sdk/include -o hello-c.wasm guest-sdk/examples/c/hello.c
 */
#include <string.h>
#include "tern.h"

int main(void) {
    static const char name[] = "content-type";
    static const char value[] = "text/plain";
    static const char body[] = "Hello from C on Tern!\n";

    if (tern_response_set_status(200) < 0) return 1;
    if (tern_response_header_append(name, strlen(name), value, strlen(value)) < 0) return 1;
    if (tern_response_body_write(body, strlen(body)) < 0) return 1;
    return 0;
}
