/* test_server_util.h — shared by the server tests: a server on a loopback ephemeral port over the
 * embedded model (models/lumen-tiny-kjv), and a small blocking HTTP/1.1 client (Connection:
 * close, chunked bodies decoded, a receive timeout so no test can hang). Header-only: each test
 * executable includes it once. */
#ifndef LM_TEST_SERVER_UTIL_H
#define LM_TEST_SERVER_UTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "lumen.h"
#include "server/server.h"

#define TINY_MODEL LM_SOURCE_DIR "/models/lumen-tiny-kjv"

typedef struct test_server {
  lm_checkpoint *ck;
  lm_server *s;
  int port;
} test_server;

/* Starts a server on 127.0.0.1:0 with o (model_dir set here); 0 on success. */
static int test_server_start(test_server *t, lm_server_opts *o) {
  memset(t, 0, sizeof *t);
  if (lm_checkpoint_open(TINY_MODEL, &t->ck)) {
    fprintf(stderr, "test server: %s\n", lm_errmsg());
    return 1;
  }
  o->model_dir = TINY_MODEL;
  o->host = "127.0.0.1";
  o->port = 0;
  if (!o->backend) o->backend = "cpu";
  if (lm_server_create(t->ck, o, &t->s) || lm_server_start(t->s)) {
    fprintf(stderr, "test server: %s\n", lm_errmsg());
    return 1;
  }
  t->port = lm_server_port(t->s);
  return 0;
}

static void test_server_stop(test_server *t) {
  lm_server_free(t->s);
  lm_checkpoint_free(t->ck);
  memset(t, 0, sizeof *t);
}

static double test_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the client ------------------------------------------------------------------------------ */

typedef struct http_resp {
  int status;
  char *head; /* status line + headers */
  char *body; /* decoded body, NUL-terminated */
  size_t len;
} http_resp;

static void http_resp_free(http_resp *r) {
  free(r->head);
  free(r->body);
  memset(r, 0, sizeof *r);
}

/* A connected socket with a receive timeout, or -1. */
static int http_connect(int port, double timeout_s) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  struct timeval tv = {.tv_sec = (time_t)timeout_s,
                       .tv_usec = (suseconds_t)((timeout_s - (time_t)timeout_s) * 1e6)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static int send_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* Sends the request head (and body) on fd. */
static int http_send(int fd, const char *method, const char *path, const char *headers,
                     const char *body, size_t blen) {
  char head[2048];
  int k = snprintf(
      head, sizeof head,
      "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n"
      "%sContent-Length: %zu\r\n\r\n",
      method, path, headers ? headers : "", body ? blen : 0);
  if (send_all(fd, head, (size_t)k)) return -1;
  return body && blen ? send_all(fd, body, blen) : 0;
}

/* Decodes a chunked body in place; returns its length. */
static size_t dechunk(char *p, size_t n) {
  size_t in = 0, out = 0;
  while (in < n) {
    char *end;
    unsigned long sz = strtoul(p + in, &end, 16);
    char *nl = strstr(end, "\r\n");
    if (!nl) break;
    in = (size_t)(nl - p) + 2;
    if (!sz || in + sz > n) break;
    memmove(p + out, p + in, sz);
    out += sz;
    in += sz + 2;
  }
  p[out] = '\0';
  return out;
}

/* Reads the whole response (until the server closes). */
static int http_read(int fd, http_resp *r) {
  size_t cap = 65536, n = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (n + 4096 > cap) buf = realloc(buf, cap *= 2);
    ssize_t k = recv(fd, buf + n, cap - n - 1, 0);
    if (k <= 0) break;
    n += (size_t)k;
  }
  buf[n] = '\0';
  char *sep = strstr(buf, "\r\n\r\n");
  if (!sep || sscanf(buf, "HTTP/1.%*d %d", &r->status) != 1) {
    free(buf);
    return -1;
  }
  r->head = strndup(buf, (size_t)(sep - buf));
  size_t bl = n - (size_t)(sep + 4 - buf);
  r->body = malloc(bl + 1);
  memcpy(r->body, sep + 4, bl);
  r->body[bl] = '\0';
  r->len = strcasestr(r->head, "transfer-encoding: chunked") ? dechunk(r->body, bl) : bl;
  free(buf);
  return 0;
}

/* One request; 0 on success (any HTTP status). */
static int http_do(int port, const char *method, const char *path, const char *headers,
                   const char *body, size_t blen, http_resp *r) {
  memset(r, 0, sizeof *r);
  int fd = http_connect(port, 60);
  if (fd < 0) return -1;
  int rc = http_send(fd, method, path, headers, body, blen) ? -1 : http_read(fd, r);
  close(fd);
  return rc;
}

static int http_post(int port, const char *path, const char *body, http_resp *r) {
  return http_do(port, "POST", path, NULL, body, strlen(body), r);
}

static int http_get(int port, const char *path, http_resp *r) {
  return http_do(port, "GET", path, NULL, NULL, 0, r);
}

/* GET /stats as JSON (NULL on failure). */
static json_t *test_stats(int port) {
  http_resp r;
  if (http_get(port, "/stats", &r) || r.status != 200) {
    http_resp_free(&r);
    return NULL;
  }
  json_t *j = json_loads(r.body, 0, NULL);
  http_resp_free(&r);
  return j;
}

static long long stats_int(const json_t *st, const char *group, const char *key) {
  return json_integer_value(json_object_get(json_object_get(st, group), key));
}

/* Waits up to `secs` until /stats shows no active sequence and an empty queue. */
static int wait_idle(int port, double secs) {
  double t0 = test_now();
  while (test_now() - t0 < secs) {
    json_t *st = test_stats(port);
    int idle =
        st && stats_int(st, "sequences", "active") == 0 && stats_int(st, "queue", "length") == 0;
    json_decref(st);
    if (idle) return 1;
    usleep(20000);
  }
  return 0;
}

#endif
