/* srv_sse.c — SSE framing over a growable buffer (srv_sse.h). */
#include "server/srv_sse.h"

#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/status.h"

lm_status lm_srv_buf_put(lm_srv_buf *b, const void *s, size_t n) {
  if (b->off && b->off == b->n) b->off = b->n = 0; /* everything was sent: start over */
  return lm_buf_append(&b->p, &b->n, &b->cap, 1024, s, n);
}

void lm_srv_buf_free(lm_srv_buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

static lm_status put_json(lm_srv_buf *b, json_t *obj) {
  char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
  json_decref(obj);
  if (!s) return LM_ERRF(LM_ERR_NOMEM, "server: out of memory (event)");
  lm_status st = lm_srv_buf_put(b, s, strlen(s));
  free(s);
  return st;
}

lm_status lm_srv_sse_data(lm_srv_buf *b, json_t *obj) {
  lm_status st = lm_srv_buf_put(b, "data: ", 6);
  if (st) {
    json_decref(obj);
    return st;
  }
  LM_TRY(put_json(b, obj));
  return lm_srv_buf_put(b, "\n\n", 2);
}

lm_status lm_srv_sse_event(lm_srv_buf *b, const char *name, json_t *obj) {
  lm_status st = lm_srv_buf_put(b, "event: ", 7);
  if (!st) st = lm_srv_buf_put(b, name, strlen(name));
  if (!st) st = lm_srv_buf_put(b, "\n", 1);
  if (st) {
    json_decref(obj);
    return st;
  }
  return lm_srv_sse_data(b, obj);
}

lm_status lm_srv_sse_raw(lm_srv_buf *b, const char *frame) {
  return lm_srv_buf_put(b, frame, strlen(frame));
}
