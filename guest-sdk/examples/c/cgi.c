/* A CGI program in C with wasi-libc (no Tern header): the request arrives in the
 * environment (RFC 3875) and on stdin, the response leaves on stdout.
 *
 *   clang --target=wasm32-wasi -O2 -o cgi.wasm cgi.c
 *
 * GET answers with the method, path and query; POST counts the body's bytes as they stream in. */
#include <stdio.h>
#include <stdlib.h>

static const char *var(const char *name) {
    const char *v = getenv(name);
    return v ? v : "";
}

int main(void) {
    char buf[16384];
    size_t n, total = 0;
    while ((n = fread(buf, 1, sizeof buf, stdin)) > 0) {
        total += n;
    }
    printf("Content-Type: text/plain\r\n");
    printf("X-Program: cgi.c\r\n\r\n");
    printf("Hello from C over CGI on Tern!\n");
    printf("method=%s script=%s path=%s query=%s\n", var("REQUEST_METHOD"), var("SCRIPT_NAME"),
           var("PATH_INFO"), var("QUERY_STRING"));
    printf("body=%zu bytes\n", total);
    return 0;
}
