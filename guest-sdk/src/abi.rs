//! Tern guest ABI v1: the one definition of the contract between the server and its guests.
//!
//! The server (compiled for the host) and guests (compiled for `wasm32-wasip1`) both use this
//! module, so import names, error codes and limits cannot drift apart. `ABI.md` and
//! `include/tern.h` describe the same contract for other languages; a server test checks both
//! against the constants here.

/// Version of this ABI. Bumped on any incompatible change.
pub const VERSION: u32 = 1;

/// Wasm import module that holds every Tern host function.
pub const IMPORT_MODULE: &str = "tern";

/// The export the server calls once per request: the module's WASI command entry point.
pub const HANDLER_EXPORT: &str = "_start";

/// Export the server reads and writes guest memory through.
pub const MEMORY_EXPORT: &str = "memory";

/// Names of the host functions in [`IMPORT_MODULE`], with their Wasm signatures.
pub mod func {
    /// `(buf: i32, buf_len: i32) -> i32`: copy the request method; returns its full length.
    pub const REQUEST_METHOD: &str = "request_method";
    /// `(buf: i32, buf_len: i32) -> i32`: copy the request target (path and query); returns its full length.
    pub const REQUEST_URI: &str = "request_uri";
    /// `(buf: i32, buf_len: i32) -> i32`: copy every request header as `name NUL value NUL`
    /// pairs; returns the full length.
    pub const REQUEST_HEADERS: &str = "request_headers";
    /// `(buf: i32, buf_len: i32) -> i32`: read the next bytes of the request body;
    /// returns how many were written, `0` at the end of the body.
    pub const REQUEST_BODY_READ: &str = "request_body_read";
    /// `(status: i32) -> i32`: set the response status (100-999); `0` on success.
    pub const RESPONSE_SET_STATUS: &str = "response_set_status";
    /// `(name: i32, name_len: i32, value: i32, value_len: i32) -> i32`: append a response header.
    pub const RESPONSE_HEADER_APPEND: &str = "response_header_append";
    /// `(buf: i32, buf_len: i32) -> i32`: append bytes to the response body; returns `buf_len`.
    pub const RESPONSE_BODY_WRITE: &str = "response_body_write";
    /// `(key: i32, buf: i32, buf_len: i32) -> i32`: copy one value of the request's context
    /// (a [`super::info`] key); returns its full length.
    pub const REQUEST_INFO: &str = "request_info";

    /// `(method, method_len, backend, backend_len, url, url_len) -> handle`: start an outbound
    /// request to a named backend (`url` is then a path and query) or, with an empty backend,
    /// to an absolute URL.
    pub const OUTBOUND_REQUEST: &str = "outbound_request";
    /// `(handle, name, name_len, value, value_len) -> i32`: add a header before sending.
    pub const OUTBOUND_HEADER_APPEND: &str = "outbound_header_append";
    /// `(handle, buf, buf_len) -> i32`: write body bytes (buffered before `outbound_send`,
    /// streamed after it with [`super::OUTBOUND_STREAM_BODY`]); returns `buf_len`.
    pub const OUTBOUND_BODY_WRITE: &str = "outbound_body_write";
    /// `(handle, flags) -> i32`: send the request.
    pub const OUTBOUND_SEND: &str = "outbound_send";
    /// `(handle) -> i32`: end a streamed request body.
    pub const OUTBOUND_BODY_FINISH: &str = "outbound_body_finish";
    /// `(handle) -> i32`: wait for the response head; returns its status.
    pub const OUTBOUND_RESPONSE_STATUS: &str = "outbound_response_status";
    /// `(handle, buf, buf_len) -> i32`: copy the response headers as `name NUL value NUL`
    /// pairs; returns the full length.
    pub const OUTBOUND_RESPONSE_HEADERS: &str = "outbound_response_headers";
    /// `(handle, buf, buf_len) -> i32`: read the next bytes of the response body; `0` at
    /// its end.
    pub const OUTBOUND_RESPONSE_BODY_READ: &str = "outbound_response_body_read";
    /// `(handle) -> i32`: end the request (abandoning what is unread).
    pub const OUTBOUND_CLOSE: &str = "outbound_close";
    /// `(buf, buf_len) -> i32`: copy the message of the last outbound call that failed;
    /// returns the full length.
    pub const OUTBOUND_LAST_ERROR: &str = "outbound_last_error";
    /// `(handle) -> i32`: the request (not sent yet) takes the incoming request's headers
    /// (but `host`, `content-length` and the hop-by-hop ones) and, when sent, its body,
    /// streamed from the client by the server.
    pub const OUTBOUND_FORWARD_REQUEST: &str = "outbound_forward_request";
    /// `(handle) -> i32`: the request's response (its head waited for) becomes the guest's:
    /// status, headers and a body the server streams to the client after the guest ends.
    pub const RESPONSE_FORWARD: &str = "response_forward";

    /// `(name, name_len) -> handle`: open a key-value store the tenant is granted.
    pub const KV_OPEN: &str = "kv_open";
    /// `(store, key, key_len, buf, buf_len) -> i32`: copy the key's value; returns its full
    /// length, or `NOT_FOUND`.
    pub const KV_GET: &str = "kv_get";
    /// `(store, key, key_len, value, value_len) -> i32`: set the key's value.
    pub const KV_SET: &str = "kv_set";
    /// `(store, key, key_len) -> i32`: remove the key (a missing key is no error).
    pub const KV_DELETE: &str = "kv_delete";
    /// `(store, key, key_len) -> i32`: `1` if the key has a value, else `0`.
    pub const KV_EXISTS: &str = "kv_exists";
    /// `(store, key, key_len, delta) -> i32`: add the signed 64-bit little-endian integer at
    /// `delta` to the key's value (decimal text; missing is 0) and write the new value there.
    pub const KV_INCREMENT: &str = "kv_increment";
    /// `(store, key, key_len, old, old_len, new, new_len, flags) -> i32`: set the key to `new`
    /// if its value is `old` (with [`super::KV_CAS_ABSENT`]: if it has none); `1` if it did.
    pub const KV_COMPARE_AND_SWAP: &str = "kv_compare_and_swap";
    /// `(store, cursor, cursor_len, buf, buf_len) -> i32`: copy the keys after `cursor`
    /// (every key with an empty one), each a 16-bit little-endian length and its bytes, as
    /// many whole keys as fit; returns the bytes written, `0` past the last key.
    pub const KV_LIST: &str = "kv_list";
    /// `(buf, buf_len) -> i32`: copy the message of the last key-value call that failed;
    /// returns the full length.
    pub const KV_LAST_ERROR: &str = "kv_last_error";

    /// `(name, name_len, buf, buf_len) -> i32`: copy the value of the tenant's variable
    /// `name`; returns its full length, or `NOT_FOUND`.
    pub const CONFIG_GET: &str = "config_get";

    /// `(backend, backend_len) -> i32`: the guest's answer hands the client's WebSocket to
    /// `backend`, one of the tenant's backends (the answer's other headers go to it with the
    /// client's request); `UNAVAILABLE` when the request opens no WebSocket, `DENIED` for a
    /// backend the tenant does not have (`outbound_last_error` says why).
    pub const HANDOFF_WEBSOCKET: &str = "handoff_websocket";
    /// `(publish, publish_len) -> i32`: publish to the tenant's events-mode WebSocket
    /// connections, on this server and every other replica of a fleet: `publish` is JSON in
    /// Pushpin's publish format, as the admin API's `POST /admin/v1/tenants/{name}/publish`
    /// takes it (`{"items": [{"channel": "room", "formats": {"ws-message": {"content":
    /// "hi"}}}]}`; `connection` instead of `channel` for one connection). Returns how many
    /// connections on this server the messages were queued for; `INVALID_ARGUMENT` for a
    /// publish that is not valid, `UNAVAILABLE` when the tenant's WebSockets are not in events
    /// mode, `LIMIT_EXCEEDED` past 100 publishes in one request (`websocket_last_error` says
    /// why).
    pub const WEBSOCKET_PUBLISH: &str = "websocket_publish";
    /// `(buf, buf_len) -> i32`: copy the message of the last `websocket_publish` that failed;
    /// returns the full length.
    pub const WEBSOCKET_LAST_ERROR: &str = "websocket_last_error";

    /// `(key, key_len, headers, headers_len, flags) -> handle`: look up the entry `key` for
    /// the request headers `headers` (`name NUL value NUL` pairs); with
    /// [`super::CACHE_TRANSACTION`], a miss waits for another request inserting it, or makes
    /// this request the one to insert it.
    pub const CACHE_LOOKUP: &str = "cache_lookup";
    /// `(handle) -> flags`: what the entry is ([`super::CACHE_FOUND`], [`super::CACHE_STALE`],
    /// [`super::CACHE_MUST_INSERT`]).
    pub const CACHE_STATE: &str = "cache_state";
    /// `(handle, buf, buf_len) -> i32`: copy the entry's bytes; returns their full length, or
    /// `NOT_FOUND`.
    pub const CACHE_BODY: &str = "cache_body";
    /// `(handle) -> i32`: seconds since the entry was inserted, or `NOT_FOUND`.
    pub const CACHE_AGE: &str = "cache_age";
    /// `(handle, body, body_len, max_age, stale_while_revalidate, tags, tags_len, vary,
    /// vary_len) -> i32`: keep `body` under the entry's key for `max_age` seconds, with its
    /// tags and the request headers it varies on (each list comma- or space-separated).
    pub const CACHE_INSERT: &str = "cache_insert";
    /// `(handle) -> i32`: free the handle (a turn to insert that was not used is given up).
    pub const CACHE_CLOSE: &str = "cache_close";
    /// `(tag, tag_len, flags) -> i32`: drop (with [`super::CACHE_PURGE_SOFT`]: make stale) what
    /// the tenant's cache holds with the tag; returns how many keys it named.
    pub const CACHE_PURGE_TAG: &str = "cache_purge_tag";
    /// `(buf, buf_len) -> i32`: copy the message of the last cache call that failed; returns
    /// the full length.
    pub const CACHE_LAST_ERROR: &str = "cache_last_error";

    /// `(counter, counter_len, entry, entry_len, delta, window, limit, penalty_box,
    /// penalty_box_len, ttl) -> i32`: `1` (blocked) when `entry` is in the penalty box, or when
    /// `delta` added to its count makes its rate over `window` seconds more than `limit` per
    /// second (it then goes in the box for `ttl` seconds); else `0`.
    pub const RATE_CHECK: &str = "rate_check";
    /// `(counter, counter_len, entry, entry_len, delta) -> i32`: add `delta` to `entry`'s
    /// count; returns `0`.
    pub const RATE_INCREMENT: &str = "rate_increment";
    /// `(counter, counter_len, entry, entry_len, window) -> i32`: `entry`'s rate over the last
    /// `window` seconds, in requests per second.
    pub const RATE_LOOKUP: &str = "rate_lookup";
    /// `(counter, counter_len, entry, entry_len, duration) -> i32`: `entry`'s count over the
    /// last `duration` seconds.
    pub const RATE_COUNT: &str = "rate_count";
    /// `(penalty_box, penalty_box_len, entry, entry_len, ttl) -> i32`: put `entry` in the box
    /// for `ttl` seconds; returns `0`.
    pub const PENALTY_ADD: &str = "penalty_add";
    /// `(penalty_box, penalty_box_len, entry, entry_len) -> i32`: `1` if `entry` is in the
    /// box, else `0`.
    pub const PENALTY_HAS: &str = "penalty_has";
    /// `(buf, buf_len) -> i32`: copy the message of the last rate counter or penalty box call
    /// that failed; returns the full length.
    pub const RATE_LAST_ERROR: &str = "rate_last_error";

    /// Every host function with its number of `i32` parameters; each returns one `i32`.
    pub const SIGNATURES: [(&str, usize); 48] = [
        (REQUEST_METHOD, 2),
        (REQUEST_URI, 2),
        (REQUEST_HEADERS, 2),
        (REQUEST_BODY_READ, 2),
        (RESPONSE_SET_STATUS, 1),
        (RESPONSE_HEADER_APPEND, 4),
        (RESPONSE_BODY_WRITE, 2),
        (REQUEST_INFO, 3),
        (OUTBOUND_REQUEST, 6),
        (OUTBOUND_HEADER_APPEND, 5),
        (OUTBOUND_BODY_WRITE, 3),
        (OUTBOUND_SEND, 2),
        (OUTBOUND_BODY_FINISH, 1),
        (OUTBOUND_RESPONSE_STATUS, 1),
        (OUTBOUND_RESPONSE_HEADERS, 3),
        (OUTBOUND_RESPONSE_BODY_READ, 3),
        (OUTBOUND_CLOSE, 1),
        (OUTBOUND_LAST_ERROR, 2),
        (OUTBOUND_FORWARD_REQUEST, 1),
        (RESPONSE_FORWARD, 1),
        (KV_OPEN, 2),
        (KV_GET, 5),
        (KV_SET, 5),
        (KV_DELETE, 3),
        (KV_EXISTS, 3),
        (KV_INCREMENT, 4),
        (KV_COMPARE_AND_SWAP, 8),
        (KV_LIST, 5),
        (KV_LAST_ERROR, 2),
        (CONFIG_GET, 4),
        (CACHE_LOOKUP, 5),
        (CACHE_STATE, 1),
        (CACHE_BODY, 3),
        (CACHE_AGE, 1),
        (CACHE_INSERT, 9),
        (CACHE_CLOSE, 1),
        (CACHE_PURGE_TAG, 3),
        (CACHE_LAST_ERROR, 2),
        (RATE_CHECK, 10),
        (RATE_INCREMENT, 5),
        (RATE_LOOKUP, 5),
        (RATE_COUNT, 5),
        (PENALTY_ADD, 5),
        (PENALTY_HAS, 4),
        (RATE_LAST_ERROR, 2),
        (HANDOFF_WEBSOCKET, 2),
        (WEBSOCKET_PUBLISH, 2),
        (WEBSOCKET_LAST_ERROR, 2),
    ];

    /// Every host function name, for checks that list them.
    pub const ALL: [&str; 48] = [
        REQUEST_METHOD,
        REQUEST_URI,
        REQUEST_HEADERS,
        REQUEST_BODY_READ,
        RESPONSE_SET_STATUS,
        RESPONSE_HEADER_APPEND,
        RESPONSE_BODY_WRITE,
        REQUEST_INFO,
        OUTBOUND_REQUEST,
        OUTBOUND_HEADER_APPEND,
        OUTBOUND_BODY_WRITE,
        OUTBOUND_SEND,
        OUTBOUND_BODY_FINISH,
        OUTBOUND_RESPONSE_STATUS,
        OUTBOUND_RESPONSE_HEADERS,
        OUTBOUND_RESPONSE_BODY_READ,
        OUTBOUND_CLOSE,
        OUTBOUND_LAST_ERROR,
        OUTBOUND_FORWARD_REQUEST,
        RESPONSE_FORWARD,
        KV_OPEN,
        KV_GET,
        KV_SET,
        KV_DELETE,
        KV_EXISTS,
        KV_INCREMENT,
        KV_COMPARE_AND_SWAP,
        KV_LIST,
        KV_LAST_ERROR,
        CONFIG_GET,
        CACHE_LOOKUP,
        CACHE_STATE,
        CACHE_BODY,
        CACHE_AGE,
        CACHE_INSERT,
        CACHE_CLOSE,
        CACHE_PURGE_TAG,
        CACHE_LAST_ERROR,
        RATE_CHECK,
        RATE_INCREMENT,
        RATE_LOOKUP,
        RATE_COUNT,
        PENALTY_ADD,
        PENALTY_HAS,
        RATE_LAST_ERROR,
        HANDOFF_WEBSOCKET,
        WEBSOCKET_PUBLISH,
        WEBSOCKET_LAST_ERROR,
    ];
}

/// Keys of `request_info`: what the guest can learn about the request beyond its message. Every
/// value is text (UTF-8). New keys may be added to ABI v1; a server that does not know a key
/// answers `INVALID_ARGUMENT`.
pub mod info {
    /// The client's IP address, e.g. `203.0.113.7` or `2001:db8::1` (no brackets).
    pub const CLIENT_IP: i32 = 0;
    /// The client's TCP port, in decimal.
    pub const CLIENT_PORT: i32 = 1;
    /// The id Tern gave the request (also its `x-request-id` response header).
    pub const REQUEST_ID: i32 = 2;
    /// The path prefix the tenant is mounted at, as the request spelled it, without a trailing
    /// slash: `/api` for a tenant at `/api`; empty for a tenant at `/`.
    pub const ROUTE_PREFIX: i32 = 3;
    /// The request path below [`ROUTE_PREFIX`]: empty or starting with `/`, without the query.
    /// `ROUTE_PREFIX` followed by `PATH_INFO` is the whole path.
    pub const PATH_INFO: i32 = 4;
    /// `http` or `https`.
    pub const SCHEME: i32 = 5;
    /// The host the client asked for (`Host` header or the target's authority), with its port
    /// if it gave one. `UNAVAILABLE` for an HTTP/1.0 request without one.
    pub const HOST: i32 = 6;
    /// The full URL: scheme, host, path and query. `UNAVAILABLE` without a host.
    pub const URL: i32 = 7;
    /// The HTTP version: `HTTP/1.0`, `HTTP/1.1` or `HTTP/2`.
    pub const HTTP_VERSION: i32 = 8;
    /// The TLS version of the client's connection, e.g. `TLSv1.3`; `UNAVAILABLE` over plain
    /// HTTP.
    pub const TLS_PROTOCOL: i32 = 9;
    /// The server name the client sent in its TLS handshake (SNI); `UNAVAILABLE` over plain
    /// HTTP or when the client sent none.
    pub const TLS_SNI: i32 = 10;
    /// The tenant's name.
    pub const TENANT: i32 = 11;
    /// The W3C `traceparent` of the guest's own span (`00-<trace id>-<span id>-<flags>`) when
    /// the server exports traces; `UNAVAILABLE` when it does not. (The request's headers are
    /// as the client sent them: its `traceparent`, if any, names the client's span.)
    pub const TRACEPARENT: i32 = 12;

    /// Every key with its name, for checks that list them.
    pub const ALL: [(&str, i32); 13] = [
        ("CLIENT_IP", CLIENT_IP),
        ("CLIENT_PORT", CLIENT_PORT),
        ("REQUEST_ID", REQUEST_ID),
        ("ROUTE_PREFIX", ROUTE_PREFIX),
        ("PATH_INFO", PATH_INFO),
        ("SCHEME", SCHEME),
        ("HOST", HOST),
        ("URL", URL),
        ("HTTP_VERSION", HTTP_VERSION),
        ("TLS_PROTOCOL", TLS_PROTOCOL),
        ("TLS_SNI", TLS_SNI),
        ("TENANT", TENANT),
        ("TRACEPARENT", TRACEPARENT),
    ];
}

/// Negative return values of the host functions. Non-negative values are results.
///
/// A pointer/length pair outside the guest's memory is not an error code: it traps the guest.
pub mod errno {
    /// An argument is malformed: a status outside 100-999, an invalid header name or value.
    pub const INVALID_ARGUMENT: i32 = -1;
    /// The response head was already sent (the body started streaming), so the status and
    /// headers can no longer change.
    pub const HEADERS_SENT: i32 = -2;
    /// A per-request limit was hit: too many response headers or too large a response body.
    pub const LIMIT_EXCEEDED: i32 = -3;
    /// The client went away or its request body failed mid-stream.
    pub const IO: i32 = -4;
    /// The value does not exist for this request (e.g. TLS details of a plain HTTP request).
    pub const UNAVAILABLE: i32 = -5;
    /// An outbound request the tenant may not send: an unknown backend, a host not allowed, a
    /// non-public address, or a request loop.
    pub const DENIED: i32 = -6;
    /// An outbound request took longer than its backend's timeouts.
    pub const TIMEOUT: i32 = -7;
    /// A key-value store has no value for the key.
    pub const NOT_FOUND: i32 = -8;
    /// A key-value write was sent to its store and no answer came (the connection was lost,
    /// the answer was late): it may have been applied or not. (`IO` means it was refused
    /// before it was sent: nothing was written.)
    pub const UNKNOWN_OUTCOME: i32 = -9;

    /// Every error code with its name, for checks that list them.
    pub const ALL: [(&str, i32); 9] = [
        ("INVALID_ARGUMENT", INVALID_ARGUMENT),
        ("HEADERS_SENT", HEADERS_SENT),
        ("LIMIT_EXCEEDED", LIMIT_EXCEEDED),
        ("IO", IO),
        ("UNAVAILABLE", UNAVAILABLE),
        ("DENIED", DENIED),
        ("TIMEOUT", TIMEOUT),
        ("NOT_FOUND", NOT_FOUND),
        ("UNKNOWN_OUTCOME", UNKNOWN_OUTCOME),
    ];

    /// The name of error code `code` (`"UNKNOWN"` for one this SDK does not know).
    pub fn name(code: i32) -> &'static str {
        ALL.iter()
            .find(|(_, c)| *c == code)
            .map_or("UNKNOWN", |(n, _)| n)
    }
}

/// `outbound_send` flag: send the head now and stream the body from later
/// `outbound_body_write` calls (chunked), ended by `outbound_body_finish`. Without it the body
/// written before the send goes whole, with a `Content-Length`.
pub const OUTBOUND_STREAM_BODY: i32 = 1;

/// `kv_compare_and_swap` flag: swap only if the key has no value (`old` is ignored).
pub const KV_CAS_ABSENT: i32 = 1;

/// `cache_lookup` flag: a transactional lookup. A miss waits while another request inserts
/// the entry, then finds it, or becomes the request that inserts it ([`CACHE_MUST_INSERT`]).
pub const CACHE_TRANSACTION: i32 = 1;
/// `cache_state` flag: the entry was found (fresh, or stale within its
/// `stale-while-revalidate`).
pub const CACHE_FOUND: i32 = 1;
/// `cache_state` flag: the entry found is stale.
pub const CACHE_STALE: i32 = 2;
/// `cache_state` flag: this request is to insert the entry (`cache_insert`) or give it up
/// (`cache_close`); the same transactional lookups of other requests wait for it.
pub const CACHE_MUST_INSERT: i32 = 4;
/// `cache_purge_tag` flag: make the tagged entries stale instead of dropping them.
pub const CACHE_PURGE_SOFT: i32 = 1;

/// Response bodies up to this many bytes are buffered, so the response is sent complete, with a
/// `Content-Length` and the full `Server-Timing`; past it the head is sent and the body streams.
pub const STREAM_THRESHOLD: usize = 64 * 1024;
