/* tools/loom/http_client.h — a small HTTP/1.1 client over POSIX sockets, and the two
 * incremental decoders a streaming LLM client needs (chunked transfer-encoding and
 * server-sent events), for `loom bench serve`.
 *
 * Plain HTTP only: there is no TLS (an https:// URL is refused with a message saying
 * so). One request per connection ("Connection: close"), as a load generator that
 * opens a connection per request would; host names go through getaddrinfo (IPv4 and
 * IPv6). The response body reaches a callback as the bytes arrive, already unframed
 * (Content-Length, chunked or close-delimited), so a caller can time each SSE event.
 * The decoders keep their state between calls: input may be split at any byte.
 * Errors are returned as -1 with a one-line message in a caller buffer; nothing is
 * printed. Every function here may run concurrently on different objects.
 */
#ifndef LOOM_CLI_HTTP_CLIENT_H
#define LOOM_CLI_HTTP_CLIENT_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

enum { HTTP_ERR_MAX = 512 }; /* size of the error buffers below, bytes */

/* ---- URLs --------------------------------------------------------------------------- */
enum { HTTP_ADDRS_MAX = 8 };

typedef struct http_url {
    char host[256];  /* a name or an address; an IPv6 literal without its brackets */
    char port[8];    /* decimal, "80" when the URL has none */
    char path[1024]; /* without a trailing '/': "" for the root, "/prefix" otherwise */
    int naddrs;      /* addresses from http_url_resolve; 0: resolve at every request */
    struct sockaddr_storage addrs[HTTP_ADDRS_MAX];
    socklen_t addr_lens[HTTP_ADDRS_MAX];
} http_url;

/* Parses "http://HOST[:PORT][/PATH]" (HOST may be "[IPv6]"). Rejects https:// ("TLS is
 * not supported; use http://"), other schemes, user info, queries, fragments, empty
 * hosts and ports outside 1..65535. Returns 0, or -1 with err filled. */
int http_url_parse(const char *text, http_url *url, char *err, size_t errlen);
/* Looks the host up once (getaddrinfo, which no timeout bounds), so that requests
 * connect without a name lookup in their timings. Returns 0, or -1 with err filled:
 * "cannot resolve host 'x': ...". */
int http_url_resolve(http_url *url, char *err, size_t errlen);
/* "host:port", with brackets around an IPv6 literal, for messages. */
void http_url_authority(const http_url *url, char *buf, size_t size);

/* ---- requests ------------------------------------------------------------------------ */
/* Receives n > 0 bytes of unframed body. Returns 0 to continue, 1 to stop reading (the
 * request then succeeds) or -1 to fail it (the caller keeps its own message). */
typedef int (*http_body_fn)(void *user, const char *data, size_t n);

typedef struct http_request {
    const http_url *url;
    const char *method;       /* "GET", "POST" */
    const char *path;         /* appended to url->path, e.g. "/v1/models" */
    const char *headers;      /* extra header lines, each ending in "\r\n"; may be NULL */
    const char *body;         /* may be NULL; sent with Content-Length (and a JSON type) */
    size_t body_len;
    double timeout_s;         /* limit on the whole exchange (connect to last byte); <= 0: none */
    volatile sig_atomic_t *cancel; /* when non-NULL and set, the exchange stops within ~0.1 s */
} http_request;

typedef struct http_response {
    int status;               /* e.g. 200; 0 until the status line has arrived */
    char content_type[128];   /* the Content-Type header, "" when absent */
    int chunked;              /* 1 when the body is chunked */
    int64_t content_length;   /* -1 when absent (chunked or close-delimited) */
    int64_t body_bytes;       /* unframed body bytes delivered so far */
} http_response;

/* Connects, sends the request and reads the response, passing the body to body_fn
 * (may be NULL to discard it); resp is filled before the first body byte. Returns 0
 * when the response was complete (or body_fn stopped it), -1 otherwise with err
 * naming the problem: "cannot resolve host 'x': ...", "connection refused by
 * HOST:PORT", "timed out after S s ...", "connection closed by HOST:PORT in the
 * middle of the response ...", "malformed chunked encoding: ...", "cancelled", or
 * "stopped by the body callback" when body_fn returned -1. */
int http_send(const http_request *req, http_response *resp, http_body_fn body_fn, void *user, char *err,
              size_t errlen);

/* ---- chunked transfer-encoding (RFC 9112 7.1) --------------------------------------- */
typedef struct http_chunked {
    int state;          /* where the decoder is in the framing (http_client.c) */
    uint64_t remaining; /* data bytes left in the current chunk */
    char line[256];     /* the chunk-size line or trailer line being read */
    size_t line_len;    /* bytes in line (longer lines are kept only in part) */
    int line_long;      /* 1 when the current line overflowed line */
} http_chunked;

void http_chunked_init(http_chunked *c);
/* Decodes data[0..n): payload bytes go to fn (which may stop as http_body_fn says).
 * *used receives the bytes consumed. Returns 0 when more input is needed, 1 when the
 * last chunk and the trailers have been read (or fn returned 1), -1 on malformed
 * framing (err) or when fn returned -1 ("stopped by the body callback"). CRLF and bare
 * LF line ends are both accepted; chunk extensions and trailers are skipped. */
int http_chunked_feed(http_chunked *c, const char *data, size_t n, size_t *used, http_body_fn fn, void *user,
                      char *err, size_t errlen);

/* ---- server-sent events (WHATWG HTML, "event stream interpretation") ---------------- */
/* One complete event: event is its "event:" field ("" when absent), data the "data:"
 * lines joined by '\n' (NUL-terminated, len bytes). A non-standard "error:" line (what
 * llama.cpp's server sends on a failure mid-stream) makes an event named "error".
 * Returns 0 to continue; anything else stops the reader, which returns it. */
typedef int (*sse_event_fn)(void *user, const char *event, const char *data, size_t len);

typedef struct sse_reader {
    char *line;      /* [line_cap] the line being read (no terminator) */
    size_t line_len, line_cap;
    char *data;      /* [data_cap] data lines of the pending event, each followed by '\n' */
    size_t data_len, data_cap;
    char event[64];  /* the pending event's type */
    int has_data;    /* 1 once the pending event has a data field */
    int after_cr;    /* 1 when the last byte was '\r' (its '\n' belongs to the same end) */
} sse_reader;

void sse_reader_init(sse_reader *r);
void sse_reader_deinit(sse_reader *r);
/* Feeds n bytes: lines end at CRLF, LF or CR, comments (":...") are skipped, a blank
 * line dispatches the pending event to fn. Returns 0, fn's non-zero result, or -1 when
 * a line exceeds 16 MiB or memory runs out. An event not ended by a blank line before
 * the stream ends is never dispatched (as the standard says). */
int sse_reader_feed(sse_reader *r, const char *buf, size_t n, sse_event_fn fn, void *user);

#endif
