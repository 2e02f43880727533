// Load generator in C on libnghttp2 (its own process): open-loop ext_proc requests at a fixed rate,
#define _GNU_SOURCE
// one gRPC stream per request on one HTTP/2 connection, as Envoy sends them. Prints one JSON line
// per run, the same fields as bench/loadgen.ts.
//
// Why C: Envoy's ext_proc client costs microseconds in C++, and a generator in JS puts its own event
// loop and GC pauses into every latency it measures. Measured on this machine against the same EPP
// (bench/REPORT.md): the Bun generator on node:http2 reported p99 1.3-1.8 ms where h2load (C,
// nghttp2) saw 0.6-0.9 ms; h2load itself cannot pace a steady 500/s (--rps sends bursts every 10 ms,
// timing scripts drift to ~400/s), hence this program. bench/loadgen.ts remains for machines
// without a C compiler or the nghttp2 headers (Debian: libnghttp2-dev).
//
// Decision latency: the request's last body byte handed to the socket (the DATA frame with
// END_STREAM sent) -> the first response bytes after it. In full duplex that is the request_headers
// answer carrying the route; in BUFFERED mode the body goes out after the headers' CONTINUE and the
// route is on the request_body answer. A server that falls behind also delays the body's sending
// (flow control, socket buffers), which this clock does not see: `achieved` (answers per second in
// the window) is what shows it. An answer other than the route, or a non-OK grpc-status, is an error.
//
// --tls: the connection is TLS (OpenSSL, ALPN h2, the certificate not verified, as the gateways
// open it to an EPP's self-signed one); every send and read goes through the TLS session.
//
// --latencies FILE: each measured, answered request's index in the requests file and its latency (ms), one
// line each, so that a tail can be read against the bodies that made it.
//
// Requests come pre-serialized (gRPC-framed ProcessingRequest messages) in a file the bench writes:
// u32le count, then per request u32le headersLen, headers message, u32le bodyLen, body message.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  const uint8_t *headers, *body;
  uint32_t headers_len, body_len;
} Request;

enum { ANSWER_BYTES = 512 };

typedef struct {
  const Request *req;
  size_t sent;       /* bytes of headers + body given to nghttp2 */
  int body_allowed;  /* buffered: the headers' answer arrived */
  double t0;         /* body fully sent; 0 before */
  double t1;         /* first answer byte after t0 */
  uint8_t answer[ANSWER_BYTES]; /* the answer's first bytes, until its message is whole */
  size_t nanswer;
  int counted, answered, failed, done;
  int32_t id;
} Stream;

static const char *ROUTE_KEY = "x-gateway-destination-endpoint";
enum { MAX_ENDPOINTS = 256 };

static int buffered;
static double *latencies;
static size_t nlat, answered_in_window, errors, done_count, measured_sent, measured_done;
static int measuring, window_open;
static char endpoints[MAX_ENDPOINTS][64];
static size_t nendpoints;
static int fd;
static SSL *ssl; /* --tls; NULL: h2c */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void die(const char *what) {
  fprintf(stderr, "loadgen: %s: %s\n", what, strerror(errno));
  exit(1);
}

static uint32_t le32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

/* The destination header's value in a route answer: the bytes after the key's own field. */
static void note_endpoint(const uint8_t *msg, size_t len) {
  size_t klen = strlen(ROUTE_KEY);
  for (size_t i = 0; i + klen + 2 < len; i++) {
    if (memcmp(msg + i, ROUTE_KEY, klen) != 0) continue;
    const uint8_t *p = msg + i + klen;
    if ((p[0] == 0x12 || p[0] == 0x1a) && p[1] < 64 && i + klen + 2 + p[1] <= len) {
      char ep[64];
      memcpy(ep, p + 2, p[1]);
      ep[p[1]] = 0;
      for (size_t k = 0; k < nendpoints; k++)
        if (strcmp(endpoints[k], ep) == 0) return;
      if (nendpoints < MAX_ENDPOINTS) strcpy(endpoints[nendpoints++], ep);
    }
    return;
  }
}

static ssize_t send_cb(nghttp2_session *s, const uint8_t *data, size_t len, int flags, void *ud) {
  (void)s, (void)flags, (void)ud;
  if (ssl) {
    int n = SSL_write(ssl, data, (int)(len > INT32_MAX ? INT32_MAX : len));
    if (n > 0) return n;
    int e = SSL_get_error(ssl, n);
    return e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ ? NGHTTP2_ERR_WOULDBLOCK : NGHTTP2_ERR_CALLBACK_FAILURE;
  }
  ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
  if (n < 0) return errno == EAGAIN || errno == EINTR ? NGHTTP2_ERR_WOULDBLOCK : NGHTTP2_ERR_CALLBACK_FAILURE;
  return n;
}

static ssize_t read_body(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len, uint32_t *flags, nghttp2_data_source *src, void *ud) {
  (void)s, (void)id, (void)ud;
  Stream *st = src->ptr;
  const Request *r = st->req;
  size_t total = r->headers_len + r->body_len;
  if (buffered && st->sent >= r->headers_len && !st->body_allowed) return NGHTTP2_ERR_DEFERRED;
  size_t n = 0;
  while (n < len && st->sent < total) {
    const uint8_t *src_bytes;
    size_t avail;
    if (st->sent < r->headers_len) {
      src_bytes = r->headers + st->sent;
      avail = r->headers_len - st->sent;
    } else {
      if (buffered && !st->body_allowed) break;
      src_bytes = r->body + (st->sent - r->headers_len);
      avail = total - st->sent;
    }
    size_t take = avail < len - n ? avail : len - n;
    memcpy(buf + n, src_bytes, take);
    n += take;
    st->sent += take;
  }
  if (st->sent == total) *flags |= NGHTTP2_DATA_FLAG_EOF;
  return (ssize_t)n;
}

static int on_frame_send(nghttp2_session *s, const nghttp2_frame *f, void *ud) {
  (void)ud;
  if (f->hd.type != NGHTTP2_DATA || !(f->hd.flags & NGHTTP2_FLAG_END_STREAM)) return 0;
  Stream *st = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
  if (st) st->t0 = now_ms();
  return 0;
}

/* The answer after the body, once its first message is whole (or ANSWER_BYTES of it are in). */
static void on_answer(Stream *st) {
  st->answered = 1;
  /* request_headers (field 1) in full duplex, request_body (field 3) in BUFFERED mode. */
  uint8_t want = buffered ? 0x1a : 0x0a;
  if (st->nanswer < 6 || st->answer[0] != 0 || st->answer[5] != want) {
    st->failed = 1;
    return;
  }
  if (!st->counted) return;
  latencies[nlat++] = st->t1 - st->t0;
  if (window_open) answered_in_window++;
  note_endpoint(st->answer + 5, st->nanswer - 5);
}

static int on_data(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *data, size_t len, void *ud) {
  (void)flags, (void)ud;
  Stream *st = nghttp2_session_get_stream_user_data(s, id);
  if (!st || st->answered) return 0;
  if (st->t0 == 0) {
    /* Buffered: the headers' CONTINUE; the body may go now. */
    if (buffered && !st->body_allowed) {
      st->body_allowed = 1;
      nghttp2_session_resume_data(s, id);
    }
    return 0;
  }
  if (st->nanswer == 0) st->t1 = now_ms();
  size_t take = len < ANSWER_BYTES - st->nanswer ? len : ANSWER_BYTES - st->nanswer;
  memcpy(st->answer + st->nanswer, data, take);
  st->nanswer += take;
  if (st->nanswer >= 5) {
    size_t whole = 5 + ((size_t)st->answer[1] << 24 | st->answer[2] << 16 | st->answer[3] << 8 | st->answer[4]);
    if (st->nanswer >= whole || st->nanswer == ANSWER_BYTES) on_answer(st);
  }
  return 0;
}

static int on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name, size_t namelen, const uint8_t *value, size_t valuelen,
                     uint8_t flags, void *ud) {
  (void)flags, (void)ud;
  Stream *st = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
  if (st && namelen == 11 && memcmp(name, "grpc-status", 11) == 0 && !(valuelen == 1 && value[0] == '0')) st->failed = 1;
  return 0;
}

static int on_close(nghttp2_session *s, int32_t id, uint32_t code, void *ud) {
  (void)ud;
  Stream *st = nghttp2_session_get_stream_user_data(s, id);
  if (!st) return 0;
  if (!st->answered && st->nanswer > 0) on_answer(st); /* a short answer, ended by its stream */
  if (code != 0 || !st->answered || st->failed) errors++;
  st->done = 1;
  done_count++;
  if (st->counted) measured_done++;
  return 0;
}

static int flag(int argc, char **argv, const char *name) {
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], name) == 0) return 1;
  return 0;
}

/* One read: bytes > 0, 0 at the connection's end, -1 with errno EAGAIN when nothing is there. */
static ssize_t read_some(uint8_t *buf, size_t len) {
  if (!ssl) return read(fd, buf, len);
  int n = SSL_read(ssl, buf, (int)len);
  if (n > 0) return n;
  int e = SSL_get_error(ssl, n);
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
    errno = EAGAIN;
    return -1;
  }
  return 0;
}

/* TLS on the connected socket (still blocking): ALPN h2, no verification. */
static void tls_connect(void) {
  SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
  if (!ctx) die("SSL_CTX_new");
  SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
  static const unsigned char alpn[] = {2, 'h', '2'};
  SSL_CTX_set_alpn_protos(ctx, alpn, sizeof alpn);
  /* nghttp2 retries a blocked send with the same bytes from a buffer that may have moved. */
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  SSL_set_tlsext_host_name(ssl, "dynamo-epp");
  if (SSL_connect(ssl) != 1) {
    ERR_print_errors_fp(stderr);
    fprintf(stderr, "loadgen: TLS handshake failed\n");
    exit(1);
  }
  const unsigned char *proto;
  unsigned int plen;
  SSL_get0_alpn_selected(ssl, &proto, &plen);
  if (plen != 2 || memcmp(proto, "h2", 2) != 0) {
    fprintf(stderr, "loadgen: the server did not select ALPN h2\n");
    exit(1);
  }
}

static const char *arg(int argc, char **argv, const char *name, const char *def) {
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], name) == 0) return argv[i + 1];
  return def;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  const char *target = arg(argc, argv, "--target", NULL), *file = arg(argc, argv, "--requests", NULL);
  if (!target || !file) {
    fprintf(stderr, "usage: loadgen --target host:port --requests FILE [--rate N] [--duration-ms N] [--warmup-ms N] [--mode full-duplex|buffered] [--tls] [--latencies FILE]\n");
    return 2;
  }
  double rate = atof(arg(argc, argv, "--rate", "500"));
  double duration = atof(arg(argc, argv, "--duration-ms", "3000")), warmup = atof(arg(argc, argv, "--warmup-ms", "500"));
  buffered = strcmp(arg(argc, argv, "--mode", "full-duplex"), "buffered") == 0;

  FILE *f = fopen(file, "rb");
  if (!f) die(file);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  rewind(f);
  uint8_t *blob = malloc(size);
  if (size < 4 || fread(blob, 1, size, f) != (size_t)size) die("read requests");
  fclose(f);
  uint32_t nreq = le32(blob);
  Request *reqs = calloc(nreq, sizeof *reqs);
  const uint8_t *p = blob + 4, *end = blob + size;
  for (uint32_t i = 0; i < nreq; i++) {
    for (int part = 0; part < 2; part++) {
      if (end - p < 4 || (size_t)(end - p - 4) < le32(p)) {
        fprintf(stderr, "loadgen: %s: truncated at request %u\n", file, i);
        return 2;
      }
      uint32_t len = le32(p);
      if (part == 0) reqs[i].headers_len = len, reqs[i].headers = p + 4;
      else reqs[i].body_len = len, reqs[i].body = p + 4;
      p += 4 + len;
    }
  }
  if (nreq == 0) {
    fprintf(stderr, "loadgen: %s holds no requests\n", file);
    return 2;
  }

  char host[256];
  const char *colon = strrchr(target, ':');
  if (!colon) {
    fprintf(stderr, "loadgen: --target must be host:port\n");
    return 2;
  }
  snprintf(host, sizeof host, "%.*s", (int)(colon - target), target);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(atoi(colon + 1))};
  if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) die("target address");
  fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) die("connect");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int tls = flag(argc, argv, "--tls");
  if (tls) tls_connect();
  fcntl(fd, F_SETFL, O_NONBLOCK);

  nghttp2_session_callbacks *cbs;
  nghttp2_session_callbacks_new(&cbs);
  nghttp2_session_callbacks_set_send_callback(cbs, send_cb);
  nghttp2_session_callbacks_set_on_frame_send_callback(cbs, on_frame_send);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data);
  nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_close);
  nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
  nghttp2_session *session;
  nghttp2_session_client_new(&session, cbs, NULL);
  /* Wide windows, as Envoy runs with: the answers hand 50 KB bodies back. */
  nghttp2_settings_entry settings[] = {{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 16 << 20}, {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 1 << 16}};
  nghttp2_submit_settings(session, NGHTTP2_FLAG_NONE, settings, 2);
  nghttp2_session_set_local_window_size(session, NGHTTP2_FLAG_NONE, 0, 1 << 30);

  size_t total = (size_t)((warmup + duration) / 1000 * rate);
  Stream *streams = calloc(total, sizeof *streams);
  latencies = calloc(total, sizeof *latencies);
  char authority[300];
  snprintf(authority, sizeof authority, "%s", target);
#define NV(n, v) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v), NGHTTP2_NV_FLAG_NONE}
  nghttp2_nv hdrs[] = {NV(":method", "POST"), NV(":scheme", tls ? "https" : "http"), NV(":authority", authority),
                       NV(":path", "/envoy.service.ext_proc.v3.ExternalProcessor/Process"), NV("content-type", "application/grpc"), NV("te", "trailers")};

  double start = now_ms(), measure_start = 0, measured_ms = 0;
  size_t next = 0;
  uint8_t buf[1 << 16];
  for (;;) {
    double t = now_ms() - start;
    if (!measuring && t >= warmup && measure_start == 0) measuring = window_open = 1, measure_start = now_ms();
    if (measuring && t >= warmup + duration) measuring = window_open = 0, measured_ms = now_ms() - measure_start;
    /* Open loop: each request goes out at its scheduled time, whatever the latency so far. */
    while (next < total && next * 1000.0 / rate <= t) {
      Stream *st = &streams[next];
      st->req = &reqs[next % nreq];
      /* Counted by its scheduled time, so a late loop turn does not move requests across the window. */
      double due = next * 1000.0 / rate;
      st->counted = due >= warmup && due < warmup + duration;
      if (st->counted) measured_sent++;
      nghttp2_data_provider prd = {.source.ptr = st, .read_callback = read_body};
      st->id = nghttp2_submit_request(session, NULL, hdrs, sizeof hdrs / sizeof hdrs[0], &prd, st);
      if (st->id < 0) errors++, st->done = 1, done_count++;
      next++;
    }
    if (nghttp2_session_send(session) != 0) break;
    if (next >= total && (done_count >= total || t > warmup + duration + 10000)) break;
    double wait = next < total ? next * 1000.0 / rate - (now_ms() - start) : 10;
    if (wait < 0) wait = 0;
    struct timespec ts = {.tv_sec = (time_t)(wait / 1000), .tv_nsec = (long)((wait - (time_t)(wait / 1000) * 1000) * 1e6)};
    struct pollfd pfd = {.fd = fd, .events = POLLIN | (nghttp2_session_want_write(session) ? POLLOUT : 0)};
    if (ppoll(&pfd, 1, &ts, NULL) < 0 && errno != EINTR) die("poll");
    if (pfd.revents & (POLLIN | POLLHUP | POLLERR)) {
      for (;;) {
        ssize_t n = read_some(buf, sizeof buf);
        if (n > 0) {
          if (nghttp2_session_mem_recv(session, buf, n) < 0) goto out;
          continue;
        }
        if (n == 0) goto out;
        if (errno == EAGAIN) break;
        if (errno == EINTR) continue;
        die("read");
      }
    }
  }
out:
  /* The connection ended early: a window that never opened measures nothing. */
  if (measure_start == 0) measure_start = now_ms();
  if (measured_ms == 0) measured_ms = now_ms() - measure_start;
  if (measured_ms <= 0) measured_ms = 1;
  /* Each measured request's index in the requests file and its latency, for reading a tail against its bodies. */
  const char *per_request = arg(argc, argv, "--latencies", NULL);
  if (per_request) {
    FILE *out = fopen(per_request, "w");
    if (!out) die(per_request);
    for (size_t i = 0; i < total; i++)
      if (streams[i].counted && streams[i].answered && !streams[i].failed) fprintf(out, "%td %.6f\n", streams[i].req - reqs, streams[i].t1 - streams[i].t0);
    fclose(out);
  }
  qsort(latencies, nlat, sizeof *latencies, cmp);
  printf("{\"rate\":%g,\"sent\":%zu,\"completed\":%zu,\"achieved\":%.3f", rate, measured_sent, measured_done, answered_in_window / measured_ms * 1000);
  const char *names[] = {"p50", "p90", "p99", "max"};
  const double qs[] = {0.5, 0.9, 0.99, 1};
  for (int i = 0; i < 4; i++) {
    size_t k = (size_t)(qs[i] * nlat);
    if (nlat == 0) printf(",\"%s\":null", names[i]); /* no answer: no percentiles */
    else printf(",\"%s\":%.6f", names[i], latencies[k < nlat ? k : nlat - 1]);
  }
  printf(",\"errors\":%zu,\"endpoints\":%zu,\"unfinished\":%zu}\n", errors, nendpoints, total - done_count);
  return 0;
}
