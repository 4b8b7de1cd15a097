/* {{name}}: a Tern request handler in C (tern.h is Tern's ABI v1 for C). */
#include <string.h>
#include "tern.h"

static int write_str(const char *s) { return tern_response_body_write(s, strlen(s)); }

int main(void) {
    static const char name[] = "content-type";
    static const char value[] = "text/plain; charset=utf-8";
    char path[1024];
    int32_t n = tern_request_uri(path, sizeof path - 1);
    if (n < 0) return 1;
    path[n < (int32_t)sizeof path - 1 ? n : (int32_t)sizeof path - 1] = '\0';

    if (tern_response_header_append(name, strlen(name), value, strlen(value)) < 0) return 1;
    if (write_str("Hello from {{name}}! You asked for ") < 0) return 1;
    if (write_str(path) < 0 || write_str("\n") < 0) return 1;
    return 0;
}
