/* tools/loom/http_client.c — the HTTP/1.1 client, chunked decoder and SSE reader of
 * http_client.h.
 *
 * The socket is non-blocking from connect on; every wait is a poll() bounded by the
 * request's deadline and sliced into 100 ms steps when a cancel flag is given, so a
 * Ctrl-C or a timeout ends a request promptly whatever the server does. Reads are
 * 16 KiB; response headers may take up to 64 KiB. Both decoders are byte-driven state
 * machines, so where read() happens to split the stream never changes the result.
 */
#include "http_client.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { HEADER_MAX = 64 * 1024, READ_SIZE = 16 * 1024, SSE_LINE_MAX = 16 * 1024 * 1024 };

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- URLs --------------------------------------------------------------------------- */

int http_url_parse(const char *text, http_url *url, char *err, size_t errlen) {
    memset(url, 0, sizeof *url);
    const char *sep = strstr(text, "://");
    if (!sep) {
        snprintf(err, errlen, "URL '%s' must start with http:// (e.g. http://127.0.0.1:8000)", text);
        return -1;
    }
    size_t slen = (size_t)(sep - text);
    if (slen == 5 && strncasecmp(text, "https", 5) == 0) {
        snprintf(err, errlen, "URL '%s': TLS is not supported; use http:// (plain HTTP only)", text);
        return -1;
    }
    if (slen != 4 || strncasecmp(text, "http", 4) != 0) {
        snprintf(err, errlen, "URL '%s': unsupported scheme '%.*s' (expected http://)", text, (int)slen, text);
        return -1;
    }
    const char *auth = sep + 3, *end = auth + strcspn(auth, "/?#");
    if (memchr(auth, '@', (size_t)(end - auth))) {
        snprintf(err, errlen, "URL '%s': user information (user@host) is not supported; use --api-key", text);
        return -1;
    }
    const char *host = auth, *host_end, *port = NULL;
    if (*auth == '[') { /* [IPv6 literal] */
        host = auth + 1;
        host_end = memchr(host, ']', (size_t)(end - host));
        if (!host_end) {
            snprintf(err, errlen, "URL '%s': missing ']' after the IPv6 address", text);
            return -1;
        }
        if (host_end + 1 < end && host_end[1] != ':') {
            snprintf(err, errlen, "URL '%s': unexpected text after ']'", text);
            return -1;
        }
        if (host_end + 1 < end) port = host_end + 2;
    } else {
        host_end = memchr(auth, ':', (size_t)(end - auth));
        if (host_end) port = host_end + 1;
        else host_end = end;
    }
    size_t hlen = (size_t)(host_end - host);
    if (hlen == 0 || hlen >= sizeof url->host) {
        snprintf(err, errlen, "URL '%s': %s host name", text, hlen ? "too long a" : "missing the");
        return -1;
    }
    memcpy(url->host, host, hlen);
    if (port) {
        size_t plen = (size_t)(end - port);
        long v = 0;
        for (size_t i = 0; i < plen && v <= 65535; i++)
            v = port[i] >= '0' && port[i] <= '9' ? v * 10 + (port[i] - '0') : 100000;
        if (plen == 0 || v < 1 || v > 65535) {
            snprintf(err, errlen, "URL '%s': invalid port '%.*s' (expected 1..65535)", text, (int)plen, port);
            return -1;
        }
        snprintf(url->port, sizeof url->port, "%ld", v);
    } else {
        strcpy(url->port, "80");
    }
    if (strpbrk(end, "?#")) {
        snprintf(err, errlen, "URL '%s': queries and fragments are not supported (give the server's base URL)", text);
        return -1;
    }
    size_t plen = strlen(end);
    while (plen > 0 && end[plen - 1] == '/') plen--;
    if (plen >= sizeof url->path) {
        snprintf(err, errlen, "URL '%s': path too long", text);
        return -1;
    }
    memcpy(url->path, end, plen);
    return 0;
}

void http_url_authority(const http_url *url, char *buf, size_t size) {
    int v6 = strchr(url->host, ':') != NULL;
    snprintf(buf, size, "%s%s%s:%s", v6 ? "[" : "", url->host, v6 ? "]" : "", url->port);
}

/* ---- chunked transfer-encoding --------------------------------------------------------- */

enum { CH_SIZE, CH_DATA, CH_DATA_END, CH_DATA_LF, CH_TRAILER, CH_DONE };

void http_chunked_init(http_chunked *c) { memset(c, 0, sizeof *c); }

/* Parses the hex size at the start of a chunk-size line; -1 when malformed. */
static int chunk_size(const char *line, size_t len, uint64_t *size) {
    uint64_t v = 0;
    size_t i = 0;
    for (; i < len; i++) {
        char ch = line[i];
        int d = ch >= '0' && ch <= '9'   ? ch - '0'
                : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                         : -1;
        if (d < 0) break;
        if (i >= 15) return -1; /* over 2^60 bytes: not a real chunk */
        v = v * 16 + (uint64_t)d;
    }
    if (i == 0 || (i < len && line[i] != ';' && line[i] != ' ' && line[i] != '\t')) return -1;
    *size = v;
    return 0;
}

int http_chunked_feed(http_chunked *c, const char *data, size_t n, size_t *used, http_body_fn fn, void *user,
                      char *err, size_t errlen) {
    size_t i = 0;
    int rc = 0;
    while (i < n && c->state != CH_DONE && rc == 0) {
        char ch = data[i];
        switch (c->state) {
        case CH_DATA: {
            size_t take = n - i < c->remaining ? n - i : (size_t)c->remaining;
            int r = fn ? fn(user, data + i, take) : 0;
            i += take;
            c->remaining -= take;
            if (c->remaining == 0) c->state = CH_DATA_END;
            if (r < 0) {
                snprintf(err, errlen, "stopped by the body callback");
                rc = -1;
            } else if (r > 0) {
                c->state = CH_DONE;
                rc = 1;
            }
            continue;
        }
        case CH_DATA_END:
        case CH_DATA_LF:
            i++;
            if (ch == '\n') c->state = CH_SIZE;
            else if (ch == '\r' && c->state == CH_DATA_END) c->state = CH_DATA_LF;
            else {
                snprintf(err, errlen, "malformed chunked encoding: expected CRLF after chunk data, got byte 0x%02x",
                         (unsigned char)ch);
                rc = -1;
            }
            continue;
        default: /* CH_SIZE, CH_TRAILER: collect a line */
            i++;
            if (ch != '\n') {
                if (c->line_len < sizeof c->line) c->line[c->line_len++] = ch;
                else c->line_long = 1;
                continue;
            }
            size_t len = c->line_len;
            if (len > 0 && c->line[len - 1] == '\r' && !c->line_long) len--;
            c->line_len = 0;
            c->line_long = 0;
            if (c->state == CH_TRAILER) {
                if (len == 0) {
                    c->state = CH_DONE;
                    rc = 1;
                }
                continue;
            }
            uint64_t size;
            if (chunk_size(c->line, len, &size) < 0) {
                snprintf(err, errlen, "malformed chunked encoding: bad chunk-size line '%.*s'", (int)(len < 40 ? len : 40),
                         c->line);
                rc = -1;
            } else if (size == 0) {
                c->state = CH_TRAILER;
            } else {
                c->remaining = size;
                c->state = CH_DATA;
            }
        }
    }
    if (c->state == CH_DONE && rc == 0) rc = 1;
    *used = i;
    return rc;
}

/* ---- server-sent events ------------------------------------------------------------------ */

void sse_reader_init(sse_reader *r) { memset(r, 0, sizeof *r); }

void sse_reader_deinit(sse_reader *r) {
    free(r->line);
    free(r->data);
    memset(r, 0, sizeof *r);
}

static int grow(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    char *p = realloc(*buf, c);
    if (!p) return -1;
    *buf = p;
    *cap = c;
    return 0;
}

/* Interprets one complete line (no terminator); dispatches on a blank line. */
static int sse_line(sse_reader *r, sse_event_fn fn, void *user) {
    const char *l = r->line ? r->line : "";
    size_t n = r->line_len;
    r->line_len = 0;
    if (n == 0) {
        int rc = 0;
        if (r->has_data) {
            size_t len = r->data_len > 0 ? r->data_len - 1 : 0; /* drop the last '\n' */
            if (grow(&r->data, &r->data_cap, len + 1) < 0) return -1;
            r->data[len] = '\0';
            rc = fn(user, r->event, r->data, len);
        }
        r->data_len = 0;
        r->has_data = 0;
        r->event[0] = '\0';
        return rc;
    }
    if (l[0] == ':') return 0; /* a comment (keep-alive) */
    const char *colon = memchr(l, ':', n);
    size_t flen = colon ? (size_t)(colon - l) : n;
    const char *v = colon ? colon + 1 : l + n;
    size_t vlen = (size_t)(l + n - v);
    if (vlen > 0 && v[0] == ' ') v++, vlen--;
    int is_error = flen == 5 && memcmp(l, "error", 5) == 0;
    if ((flen == 4 && memcmp(l, "data", 4) == 0) || is_error) {
        if (is_error) strcpy(r->event, "error");
        if (grow(&r->data, &r->data_cap, r->data_len + vlen + 1) < 0) return -1;
        memcpy(r->data + r->data_len, v, vlen);
        r->data_len += vlen;
        r->data[r->data_len++] = '\n';
        r->has_data = 1;
    } else if (flen == 5 && memcmp(l, "event", 5) == 0) {
        size_t k = vlen < sizeof r->event - 1 ? vlen : sizeof r->event - 1;
        memcpy(r->event, v, k);
        r->event[k] = '\0';
    } /* id:, retry: and unknown fields do not matter here */
    return 0;
}

int sse_reader_feed(sse_reader *r, const char *buf, size_t n, sse_event_fn fn, void *user) {
    for (size_t i = 0; i < n; i++) {
        char ch = buf[i];
        if (ch == '\n' && r->after_cr) { /* the LF of a CRLF already ended the line */
            r->after_cr = 0;
            continue;
        }
        r->after_cr = ch == '\r';
        if (ch == '\n' || ch == '\r') {
            int rc = sse_line(r, fn, user);
            if (rc) return rc;
            continue;
        }
        /* Copy the run of ordinary bytes at once. */
        size_t j = i;
        while (j < n && buf[j] != '\n' && buf[j] != '\r') j++;
        if (r->line_len + (j - i) > SSE_LINE_MAX || grow(&r->line, &r->line_cap, r->line_len + (j - i)) < 0) return -1;
        memcpy(r->line + r->line_len, buf + i, j - i);
        r->line_len += j - i;
        i = j - 1;
    }
    return 0;
}

/* ---- the exchange ------------------------------------------------------------------------ */

typedef struct exchange {
    const http_request *req;
    http_response *resp;
    http_body_fn on_body;
    void *user;
    int fd;
    double t0, deadline; /* monotonic seconds; deadline 0 = none */
    char authority[300]; /* host:port, for messages */
    char *err;
    size_t errlen;
} exchange;

/* Waits until fd is ready for events; -1 (err filled) on timeout, cancel or failure. */
static int wait_fd(exchange *x, short events, const char *doing) {
    for (;;) {
        if (x->req->cancel && *x->req->cancel) {
            snprintf(x->err, x->errlen, "cancelled");
            return -1;
        }
        int ms = -1;
        if (x->deadline > 0) {
            double left = x->deadline - mono_now();
            if (left <= 0) {
                snprintf(x->err, x->errlen, "timed out after %g s %s %s", x->req->timeout_s, doing, x->authority);
                return -1;
            }
            ms = (int)(left * 1000) + 1;
        }
        if (x->req->cancel && (ms < 0 || ms > 100)) ms = 100;
        struct pollfd p = {x->fd, events, 0};
        int r = poll(&p, 1, ms);
        if (r > 0) return 0;
        if (r < 0 && errno != EINTR) {
            snprintf(x->err, x->errlen, "poll failed: %s", strerror(errno));
            return -1;
        }
    }
}

int http_url_resolve(http_url *url, char *err, size_t errlen) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(url->host, url->port, &hints, &res);
    if (g != 0) {
        snprintf(err, errlen, "cannot resolve host '%s': %s", url->host, gai_strerror(g));
        return -1;
    }
    url->naddrs = 0;
    for (struct addrinfo *a = res; a && url->naddrs < HTTP_ADDRS_MAX; a = a->ai_next) {
        if (a->ai_addrlen > sizeof url->addrs[0]) continue;
        memcpy(&url->addrs[url->naddrs], a->ai_addr, a->ai_addrlen);
        url->addr_lens[url->naddrs++] = a->ai_addrlen;
    }
    freeaddrinfo(res);
    if (url->naddrs == 0) {
        snprintf(err, errlen, "cannot resolve host '%s': no usable address", url->host);
        return -1;
    }
    return 0;
}

/* Connects to the first address that accepts (as getaddrinfo orders them). */
static int connect_any(exchange *x) {
    http_url local;
    const http_url *u = x->req->url;
    if (u->naddrs == 0) { /* not resolved up front: look it up now */
        memcpy(&local, u, sizeof local);
        if (http_url_resolve(&local, x->err, x->errlen) < 0) return -1;
        u = &local;
    }
    int last = 0;
    for (int i = 0; i < u->naddrs; i++) {
        const struct sockaddr *addr = (const struct sockaddr *)&u->addrs[i];
        int fd = socket(addr->sa_family, SOCK_STREAM, 0);
        if (fd < 0) {
            last = errno;
            continue;
        }
        fcntl(fd, F_SETFD, FD_CLOEXEC);
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        x->fd = fd;
        int r = connect(fd, addr, u->addr_lens[i]), e = r == 0 ? 0 : errno;
        if (e == EINPROGRESS) {
            if (wait_fd(x, POLLOUT, "connecting to") < 0) {
                close(fd);
                x->fd = -1;
                return -1;
            }
            socklen_t len = sizeof e;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) < 0) e = errno;
        }
        if (e == 0) {
            int one = 1; /* the request goes out in one write; do not hold back the tail */
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            return 0;
        }
        last = e;
        close(fd);
        x->fd = -1;
    }
    if (last == ECONNREFUSED)
        snprintf(x->err, x->errlen, "connection refused by %s (is the server running and listening there?)", x->authority);
    else
        snprintf(x->err, x->errlen, "cannot connect to %s: %s", x->authority, strerror(last));
    return -1;
}

static int send_all(exchange *x, const char *buf, size_t n) {
    while (n > 0) {
        ssize_t w = send(x->fd, buf, n, MSG_NOSIGNAL);
        if (w > 0) {
            buf += w;
            n -= (size_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_fd(x, POLLOUT, "sending the request to") < 0) return -1;
        } else if (w < 0 && errno != EINTR) {
            snprintf(x->err, x->errlen, "connection to %s lost while sending the request: %s", x->authority,
                     strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* Reads what is available: >0 bytes, 0 at end of stream, -1 on failure (err filled). */
static ssize_t recv_some(exchange *x, char *buf, size_t cap) {
    for (;;) {
        if (wait_fd(x, POLLIN, "waiting for a response from") < 0) return -1;
        ssize_t r = recv(x->fd, buf, cap, 0);
        if (r >= 0) return r;
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        snprintf(x->err, x->errlen, "connection %s by %s in the middle of the response (%lld body bytes received)",
                 errno == ECONNRESET ? "reset" : "failed", x->authority, (long long)x->resp->body_bytes);
        if (errno != ECONNRESET)
            snprintf(x->err + strlen(x->err), x->errlen - strlen(x->err), ": %s", strerror(errno));
        return -1;
    }
}

static int build_and_send(exchange *x) {
    const http_request *q = x->req;
    const char *extra = q->headers ? q->headers : "";
    size_t cap = strlen(q->url->path) + strlen(q->path) + strlen(extra) + strlen(x->authority) + 512 + q->body_len;
    char *buf = malloc(cap);
    if (!buf) {
        snprintf(x->err, x->errlen, "out of memory building the request");
        return -1;
    }
    int v6 = strchr(q->url->host, ':') != NULL, port80 = strcmp(q->url->port, "80") == 0;
    int len = snprintf(buf, cap,
                       "%s %s%s HTTP/1.1\r\nHost: %s%s%s%s%s\r\nUser-Agent: loom-bench-serve\r\nAccept: */*\r\n"
                       "Connection: close\r\n%s",
                       q->method, q->url->path, q->path[0] ? q->path : "/", v6 ? "[" : "", q->url->host, v6 ? "]" : "",
                       port80 ? "" : ":", port80 ? "" : q->url->port, extra);
    if (q->body)
        len += snprintf(buf + len, cap - (size_t)len, "Content-Type: application/json\r\nContent-Length: %zu\r\n",
                        q->body_len);
    len += snprintf(buf + len, cap - (size_t)len, "\r\n");
    if (q->body) memcpy(buf + len, q->body, q->body_len);
    int rc = send_all(x, buf, (size_t)len + (q->body ? q->body_len : 0));
    free(buf);
    return rc;
}

/* Finds the end of the header block in buf[0..n): index after the blank line, or 0. */
static size_t header_end(const char *buf, size_t n) {
    for (size_t i = 0; i + 1 < n; i++) {
        if (buf[i] != '\n') continue;
        if (buf[i + 1] == '\n') return i + 2;
        if (buf[i + 1] == '\r' && i + 2 < n && buf[i + 2] == '\n') return i + 3;
    }
    return 0;
}

static void trim(const char **s, const char **e) {
    while (*s < *e && (**s == ' ' || **s == '\t')) (*s)++;
    while (*e > *s && ((*e)[-1] == ' ' || (*e)[-1] == '\t' || (*e)[-1] == '\r')) (*e)--;
}

/* Parses the status line and headers in buf[0..n). */
static int parse_head(exchange *x, const char *buf, size_t n) {
    http_response *r = x->resp;
    const char *end = buf + n, *eol = memchr(buf, '\n', n);
    if (n < 12 || strncmp(buf, "HTTP/1.", 7) != 0 || buf[8] != ' ' || !eol || buf[9] < '1' || buf[9] > '5' ||
        buf[10] < '0' || buf[10] > '9' || buf[11] < '0' || buf[11] > '9') {
        size_t k = eol ? (size_t)(eol - buf) : n;
        char shown[64];
        size_t m = 0;
        for (size_t i = 0; i < k && m + 1 < sizeof shown; i++) shown[m++] = buf[i] >= 0x20 && buf[i] < 0x7f ? buf[i] : '?';
        shown[m] = '\0';
        snprintf(x->err, x->errlen, "%s did not answer with HTTP/1.x (first line '%s')", x->authority, shown);
        return -1;
    }
    r->status = (buf[9] - '0') * 100 + (buf[10] - '0') * 10 + (buf[11] - '0');
    r->chunked = 0;
    r->content_length = -1;
    r->content_type[0] = '\0';
    for (const char *l = eol + 1; l < end; l = eol + 1) {
        eol = memchr(l, '\n', (size_t)(end - l));
        if (!eol) eol = end;
        const char *colon = memchr(l, ':', (size_t)(eol - l));
        if (!colon) continue;
        const char *v = colon + 1, *ve = eol;
        trim(&v, &ve);
        size_t nl = (size_t)(colon - l), vl = (size_t)(ve - v);
        if (nl == 14 && strncasecmp(l, "content-length", 14) == 0) {
            int64_t len = 0;
            size_t i = 0;
            for (; i < vl && v[i] >= '0' && v[i] <= '9' && len < ((int64_t)1 << 50); i++) len = len * 10 + (v[i] - '0');
            if (i == 0 || i != vl || (r->content_length >= 0 && r->content_length != len)) {
                snprintf(x->err, x->errlen, "%s sent a bad Content-Length '%.*s'", x->authority,
                         (int)(vl < 40 ? vl : 40), v);
                return -1;
            }
            r->content_length = len;
        } else if (nl == 17 && strncasecmp(l, "transfer-encoding", 17) == 0) {
            for (size_t i = 0; i + 7 <= vl; i++)
                if (strncasecmp(v + i, "chunked", 7) == 0) r->chunked = 1;
        } else if (nl == 12 && strncasecmp(l, "content-type", 12) == 0) {
            size_t k = vl < sizeof r->content_type - 1 ? vl : sizeof r->content_type - 1;
            memcpy(r->content_type, v, k);
            r->content_type[k] = '\0';
        }
    }
    if (r->chunked) r->content_length = -1; /* chunked framing wins (RFC 9112 6.3) */
    return 0;
}

/* Passes body bytes on; returns on_body's result (-1 with err filled). */
static int deliver(void *arg, const char *data, size_t n) {
    exchange *x = arg;
    x->resp->body_bytes += (int64_t)n;
    int r = x->on_body ? x->on_body(x->user, data, n) : 0;
    if (r < 0) snprintf(x->err, x->errlen, "stopped by the body callback");
    return r;
}

static int read_response(exchange *x) {
    http_response *r = x->resp;
    char *buf = malloc(HEADER_MAX + READ_SIZE);
    if (!buf) {
        snprintf(x->err, x->errlen, "out of memory reading the response");
        return -1;
    }
    size_t have = 0, head = 0;
    int rc = -1;
    for (;;) { /* the header block; 1xx interim responses are skipped */
        while (!(head = header_end(buf, have))) {
            if (have >= HEADER_MAX) {
                snprintf(x->err, x->errlen, "response headers from %s exceed %d KiB", x->authority, HEADER_MAX / 1024);
                goto done;
            }
            ssize_t got = recv_some(x, buf + have, HEADER_MAX + READ_SIZE - have);
            if (got < 0) goto done;
            if (got == 0) {
                snprintf(x->err, x->errlen, "connection closed by %s before a complete response (%zu bytes received)",
                         x->authority, have);
                goto done;
            }
            have += (size_t)got;
        }
        if (parse_head(x, buf, head) < 0) goto done;
        if (r->status >= 200 || r->status == 101) break;
        memmove(buf, buf + head, have - head);
        have -= head;
    }
    size_t extra = have - head;
    memmove(buf, buf + head, extra);
    if (r->status == 204 || r->status == 304 || strcmp(x->req->method, "HEAD") == 0) {
        rc = 0;
        goto done;
    }
    http_chunked ch;
    http_chunked_init(&ch);
    int64_t left = r->content_length; /* -1: until the connection closes */
    for (;;) {
        int d = 0;
        if (r->chunked) {
            size_t used;
            d = http_chunked_feed(&ch, buf, extra, &used, deliver, x, x->err, x->errlen);
        } else if (extra > 0) {
            size_t take = left >= 0 && (int64_t)extra > left ? (size_t)left : extra;
            if (take > 0) d = deliver(x, buf, take);
            if (left >= 0) left -= (int64_t)take;
        }
        if (d < 0) goto done;
        if (d > 0 || left == 0) break;
        ssize_t got = recv_some(x, buf, READ_SIZE);
        if (got < 0) goto done;
        if (got == 0) {
            if (!r->chunked && left < 0) break; /* close-delimited: the normal end */
            snprintf(x->err, x->errlen, "connection closed by %s in the middle of the response (%lld body bytes received%s)",
                     x->authority, (long long)r->body_bytes, r->chunked ? ", chunked body unfinished" : "");
            goto done;
        }
        extra = (size_t)got;
    }
    rc = 0;
done:
    free(buf);
    return rc;
}

int http_send(const http_request *req, http_response *resp, http_body_fn body_fn, void *user, char *err,
              size_t errlen) {
    memset(resp, 0, sizeof *resp);
    resp->content_length = -1;
    exchange x = {req, resp, body_fn, user, -1, mono_now(), 0, "", err, errlen};
    if (req->timeout_s > 0) x.deadline = x.t0 + req->timeout_s;
    http_url_authority(req->url, x.authority, sizeof x.authority);
    err[0] = '\0';
    int rc = connect_any(&x);
    if (rc == 0) rc = build_and_send(&x);
    if (rc == 0) rc = read_response(&x);
    if (x.fd >= 0) close(x.fd);
    return rc;
}
