/* tern.h: Tern guest ABI v1 for C (see ABI.md; one definition in guest-sdk/src/abi.rs).
 *
 * A Tern guest is a WASI preview1 command module (its `main` runs once per request, in a
 * fresh instance). Build with: clang --target=wasm32-wasi -O2 -I guest-sdk/include ...
 *
 * Every function returns a non-negative result or one of the negative TERN_E* codes.
 * A pointer/length pair outside the guest's memory traps the guest.
 */
#ifndef TERN_H
#define TERN_H

#include <stddef.h>
#include <stdint.h>

#define TERN_ABI_VERSION 1

/* Error codes. */
#define TERN_EINVALID_ARGUMENT (-1) /* malformed status, header name or value */
#define TERN_EHEADERS_SENT (-2)     /* the body is already streaming: head is fixed */
#define TERN_ELIMIT_EXCEEDED (-3)   /* too many headers or too large a body */
#define TERN_EIO (-4)               /* the client went away or its body failed */
#define TERN_EUNAVAILABLE (-5)      /* this request has no such value (tern_request_info) */
#define TERN_EDENIED (-6)           /* outbound request not allowed for this tenant */
#define TERN_ETIMEOUT (-7)          /* outbound request past a backend timeout */
#define TERN_ENOT_FOUND (-8)        /* a key-value store has no value for the key */
#define TERN_EUNKNOWN_OUTCOME (-9)  /* a key-value write sent, never answered: maybe applied */

/* Keys of tern_request_info: the request's context. Every value is text. */
#define TERN_INFO_CLIENT_IP 0     /* "203.0.113.7" or "2001:db8::1" */
#define TERN_INFO_CLIENT_PORT 1   /* decimal */
#define TERN_INFO_REQUEST_ID 2    /* also the x-request-id response header */
#define TERN_INFO_ROUTE_PREFIX 3  /* where the tenant is mounted, e.g. "/api"; "" at "/" */
#define TERN_INFO_PATH_INFO 4     /* the path below the prefix: "" or "/..." (no query) */
#define TERN_INFO_SCHEME 5        /* "http" or "https" */
#define TERN_INFO_HOST 6          /* the host asked for, with its port if given */
#define TERN_INFO_URL 7           /* scheme://host/path?query */
#define TERN_INFO_HTTP_VERSION 8  /* "HTTP/1.0", "HTTP/1.1", "HTTP/2" */
#define TERN_INFO_TLS_PROTOCOL 9  /* e.g. "TLSv1.3"; TERN_EUNAVAILABLE over plain HTTP */
#define TERN_INFO_TLS_SNI 10      /* the TLS server name; TERN_EUNAVAILABLE over plain HTTP */
#define TERN_INFO_TENANT 11       /* the tenant's name */
#define TERN_INFO_TRACEPARENT 12  /* the guest's span, W3C; TERN_EUNAVAILABLE without tracing */

/* Response bodies up to this size are buffered and sent complete; larger ones stream. */
#define TERN_STREAM_THRESHOLD 65536

#define TERN_IMPORT(name) __attribute__((import_module("tern"), import_name(name)))

/* Copy the request method into buf (at most len bytes); returns its full length. */
TERN_IMPORT("request_method") int32_t tern_request_method(char *buf, size_t len);
/* Copy the request target (path and query); returns its full length. */
TERN_IMPORT("request_uri") int32_t tern_request_uri(char *buf, size_t len);
/* Copy every request header as "name\0value\0" pairs; returns the full length. */
TERN_IMPORT("request_headers") int32_t tern_request_headers(char *buf, size_t len);
/* Read the next bytes of the request body; returns the count, 0 at the end. */
TERN_IMPORT("request_body_read") int32_t tern_request_body_read(char *buf, size_t len);
/* Set the response status (100-999); returns 0. */
TERN_IMPORT("response_set_status") int32_t tern_response_set_status(int32_t status);
/* Append a response header; returns 0. */
TERN_IMPORT("response_header_append")
int32_t tern_response_header_append(const char *name, size_t name_len, const char *value,
                                    size_t value_len);
/* Append bytes to the response body; returns len. */
TERN_IMPORT("response_body_write") int32_t tern_response_body_write(const char *buf, size_t len);
/* Copy one value of the request's context (a TERN_INFO_* key); returns its full length,
 * TERN_EUNAVAILABLE, or TERN_EINVALID_ARGUMENT for a key this server does not know. */
TERN_IMPORT("request_info") int32_t tern_request_info(int32_t key, char *buf, size_t len);

/* For a backend with `cache = true`: what the tenant's cache does with this request, as an
 * outgoing header the server takes off before the backend sees it: "pass" (neither looked up
 * nor stored), "ttl=SECONDS" (stored that long whatever the answer says), "tag=NAME" (a tag
 * to purge it by), comma-separated. A value the server cannot read fails the request with
 * TERN_EINVALID_ARGUMENT, from the first call that waits for its response (nothing is sent;
 * tern_outbound_last_error says why). */
#define TERN_CACHE_HEADER "tern-cache"

/* Outbound requests (see ABI.md): to a named backend (url = path and query) or, with
 * backend_len 0, to an absolute http:// or https:// URL; returns a handle. */
TERN_IMPORT("outbound_request")
int32_t tern_outbound_request(const char *method, size_t method_len, const char *backend,
                              size_t backend_len, const char *url, size_t url_len);
/* Add a header before sending; returns 0. */
TERN_IMPORT("outbound_header_append")
int32_t tern_outbound_header_append(int32_t handle, const char *name, size_t name_len,
                                    const char *value, size_t value_len);
/* Append body bytes (before send: sent whole; after a streaming send: sent now); returns len. */
TERN_IMPORT("outbound_body_write")
int32_t tern_outbound_body_write(int32_t handle, const char *buf, size_t len);
/* Send; flags TERN_OUTBOUND_STREAM_BODY streams the body from later writes. Returns 0. */
#define TERN_OUTBOUND_STREAM_BODY 1
TERN_IMPORT("outbound_send") int32_t tern_outbound_send(int32_t handle, int32_t flags);
/* End a streamed body; returns 0. */
TERN_IMPORT("outbound_body_finish") int32_t tern_outbound_body_finish(int32_t handle);
/* Wait for the response head; returns its status. */
TERN_IMPORT("outbound_response_status") int32_t tern_outbound_response_status(int32_t handle);
/* Copy the response headers as "name\0value\0" pairs; returns the full length. */
TERN_IMPORT("outbound_response_headers")
int32_t tern_outbound_response_headers(int32_t handle, char *buf, size_t len);
/* Read the next bytes of the response body; returns the count, 0 at the end. */
TERN_IMPORT("outbound_response_body_read")
int32_t tern_outbound_response_body_read(int32_t handle, char *buf, size_t len);
/* End the request and free its handle; returns 0. */
TERN_IMPORT("outbound_close") int32_t tern_outbound_close(int32_t handle);
/* Copy the message of the last outbound call that failed; returns the full length. */
TERN_IMPORT("outbound_last_error") int32_t tern_outbound_last_error(char *buf, size_t len);
/* Give the request (not sent yet) the client's headers (but Host, Content-Length and the
 * hop-by-hop ones) and, once sent, the client's body, streamed by the server; returns 0. */
TERN_IMPORT("outbound_forward_request") int32_t tern_outbound_forward_request(int32_t handle);
/* Make the request's response (its head waited for) this request's answer: status, headers and
 * a body the server streams to the client after the guest ends; returns 0. */
TERN_IMPORT("response_forward") int32_t tern_response_forward(int32_t handle);
/* Hand the client's WebSocket to the tenant's backend `backend` once the guest has answered
 * (the answer's headers go to the backend with the client's request); returns 0,
 * TERN_EUNAVAILABLE when the request opens no WebSocket, or TERN_EDENIED. */
TERN_IMPORT("handoff_websocket")
int32_t tern_handoff_websocket(const char *backend, size_t backend_len);

/* Key-value stores (see ABI.md): open one the tenant is granted by name; returns a handle. */
TERN_IMPORT("kv_open") int32_t tern_kv_open(const char *name, size_t name_len);
/* Copy the key's value; returns its full length, or TERN_ENOT_FOUND. */
TERN_IMPORT("kv_get")
int32_t tern_kv_get(int32_t store, const char *key, size_t key_len, char *buf, size_t len);
/* Set the key's value; returns 0. */
TERN_IMPORT("kv_set")
int32_t tern_kv_set(int32_t store, const char *key, size_t key_len, const char *value,
                    size_t value_len);
/* Remove the key (a missing key is no error); returns 0. */
TERN_IMPORT("kv_delete") int32_t tern_kv_delete(int32_t store, const char *key, size_t key_len);
/* 1 if the key has a value, else 0. */
TERN_IMPORT("kv_exists") int32_t tern_kv_exists(int32_t store, const char *key, size_t key_len);
/* Add *delta to the key's integer value (decimal text; missing is 0) and store the new value
 * in *delta, atomically; returns 0. */
TERN_IMPORT("kv_increment")
int32_t tern_kv_increment(int32_t store, const char *key, size_t key_len, int64_t *delta);
/* Set the key to new if its value is old (flags TERN_KV_CAS_ABSENT: if it has none),
 * atomically; returns 1 if it did, 0 if not. */
#define TERN_KV_CAS_ABSENT 1
TERN_IMPORT("kv_compare_and_swap")
int32_t tern_kv_compare_and_swap(int32_t store, const char *key, size_t key_len, const char *old,
                                 size_t old_len, const char *new_value, size_t new_len,
                                 int32_t flags);
/* Copy the keys after cursor (all with cursor_len 0), each a 16-bit little-endian length and
 * its bytes, as many whole keys as fit; returns the bytes written, 0 past the last key. */
TERN_IMPORT("kv_list")
int32_t tern_kv_list(int32_t store, const char *cursor, size_t cursor_len, char *buf, size_t len);
/* Copy the message of the last key-value call that failed; returns the full length. */
TERN_IMPORT("kv_last_error") int32_t tern_kv_last_error(char *buf, size_t len);

/* The tenant's variables and secrets (see ABI.md): copy the value of the variable name; returns
 * its full length, TERN_ENOT_FOUND if it has none, TERN_EUNAVAILABLE if this server cannot
 * open the tenant's secrets. */
TERN_IMPORT("config_get")
int32_t tern_config_get(const char *name, size_t name_len, char *buf, size_t len);

/* The guest's own entries in its tenant's cache (see ABI.md): look up the entry key for the
 * request headers headers (name NUL value NUL pairs: those its variants are told apart by);
 * returns a handle whatever was found. Flags TERN_CACHE_TRANSACTION: a miss waits for another
 * request inserting it, or makes this request the one to insert it. */
#define TERN_CACHE_TRANSACTION 1
TERN_IMPORT("cache_lookup")
int32_t tern_cache_lookup(const char *key, size_t key_len, const char *headers,
                          size_t headers_len, int32_t flags);
/* What the entry is: TERN_CACHE_FOUND, TERN_CACHE_STALE, TERN_CACHE_MUST_INSERT (or'ed). */
#define TERN_CACHE_FOUND 1
#define TERN_CACHE_STALE 2
#define TERN_CACHE_MUST_INSERT 4
TERN_IMPORT("cache_state") int32_t tern_cache_state(int32_t handle);
/* Copy the entry's bytes; returns their full length, or TERN_ENOT_FOUND. */
TERN_IMPORT("cache_body") int32_t tern_cache_body(int32_t handle, char *buf, size_t len);
/* Seconds since the entry was inserted, or TERN_ENOT_FOUND. */
TERN_IMPORT("cache_age") int32_t tern_cache_age(int32_t handle);
/* Keep body under the entry's key for max_age seconds (then stale_while_revalidate more,
 * found stale), with tags and the request headers it varies on (each list comma- or
 * space-separated); returns 0. */
TERN_IMPORT("cache_insert")
int32_t tern_cache_insert(int32_t handle, const char *body, size_t body_len, int32_t max_age,
                          int32_t stale_while_revalidate, const char *tags, size_t tags_len,
                          const char *vary, size_t vary_len);
/* Free the handle (a turn to insert not used is given up); returns 0. */
TERN_IMPORT("cache_close") int32_t tern_cache_close(int32_t handle);
/* Drop (flags TERN_CACHE_PURGE_SOFT: make stale) what the tenant's cache holds with the tag on
 * this server; returns how many keys it named. */
#define TERN_CACHE_PURGE_SOFT 1
TERN_IMPORT("cache_purge_tag")
int32_t tern_cache_purge_tag(const char *tag, size_t tag_len, int32_t flags);
/* Copy the message of the last cache call that failed; returns the full length. */
TERN_IMPORT("cache_last_error") int32_t tern_cache_last_error(char *buf, size_t len);

/* Rate counters and penalty boxes the tenant declares (see ABI.md): 1 (blocked) when entry is
 * in the penalty box (then not counted), or when delta added to its count in counter makes its
 * rate over the last window seconds (1-60) more than limit per second: it then goes in the box
 * for ttl seconds (1-86400); else 0. */
TERN_IMPORT("rate_check")
int32_t tern_rate_check(const char *counter, size_t counter_len, const char *entry,
                        size_t entry_len, int32_t delta, int32_t window, int32_t limit,
                        const char *penalty_box, size_t penalty_box_len, int32_t ttl);
/* Add delta to entry's count; returns 0. */
TERN_IMPORT("rate_increment")
int32_t tern_rate_increment(const char *counter, size_t counter_len, const char *entry,
                            size_t entry_len, int32_t delta);
/* Entry's rate over the last window seconds (1-60), in requests per second. */
TERN_IMPORT("rate_lookup")
int32_t tern_rate_lookup(const char *counter, size_t counter_len, const char *entry,
                         size_t entry_len, int32_t window);
/* Entry's count over the last duration seconds (1-60). */
TERN_IMPORT("rate_count")
int32_t tern_rate_count(const char *counter, size_t counter_len, const char *entry,
                        size_t entry_len, int32_t duration);
/* Put entry in the penalty box for ttl seconds (a longer stay it has is kept); returns 0. */
TERN_IMPORT("penalty_add")
int32_t tern_penalty_add(const char *penalty_box, size_t penalty_box_len, const char *entry,
                         size_t entry_len, int32_t ttl);
/* 1 if entry is in the penalty box, else 0. */
TERN_IMPORT("penalty_has")
int32_t tern_penalty_has(const char *penalty_box, size_t penalty_box_len, const char *entry,
                         size_t entry_len);
/* Copy the message of the last rate counter or penalty box call that failed; returns the full
 * length. */
TERN_IMPORT("rate_last_error") int32_t tern_rate_last_error(char *buf, size_t len);

/* WebSocket channels (see ABI.md): publish JSON in Pushpin's format, e.g.
 * {"items":[{"channel":"room","formats":{"ws-message":{"content":"hi"}}}]}, to the tenant's
 * events-mode connections on every replica; returns how many on this server it was queued for,
 * TERN_EINVALID_ARGUMENT, TERN_EUNAVAILABLE (not in events mode) or TERN_ELIMIT_EXCEEDED. */
TERN_IMPORT("websocket_publish")
int32_t tern_websocket_publish(const char *publish, size_t publish_len);
/* Copy the message of the last publish that failed; returns the full length. */
TERN_IMPORT("websocket_last_error") int32_t tern_websocket_last_error(char *buf, size_t len);

#endif /* TERN_H */
