/* srv_sse.h — Server-Sent Events: a byte buffer, the framing of events ("data: {json}\n\n",
 * "event: NAME\ndata: {json}\n\n", comments for keep-alive pings), and the stream object the HTTP
 * layer drains into a chunked response. */
#ifndef LM_SERVER_SRV_SSE_H
#define LM_SERVER_SRV_SSE_H

#include <jansson.h>
#include <stddef.h>

#include "lumen.h"

typedef struct lm_srv_buf {
  char *p;
  size_t n, cap;
  size_t off; /* bytes already sent */
} lm_srv_buf;

lm_status lm_srv_buf_put(lm_srv_buf *b, const void *s, size_t n);
void lm_srv_buf_free(lm_srv_buf *b);
/* "data: <compact json>\n\n"; takes the reference to obj (NULL: out of memory). */
lm_status lm_srv_sse_data(lm_srv_buf *b, json_t *obj);
/* "event: <name>\ndata: <compact json>\n\n"; takes the reference to obj. */
lm_status lm_srv_sse_event(lm_srv_buf *b, const char *name, json_t *obj);
/* A literal frame, e.g. "data: [DONE]\n\n" or ": ping\n\n". */
lm_status lm_srv_sse_raw(lm_srv_buf *b, const char *frame);

/* A streamed response body. produce() appends to `out` what is ready, waiting up to timeout_ms;
 * it returns 1 once the stream is complete (everything appended), 0 to be called again, -1 on a
 * failure (the response is cut). ping() appends a keep-alive frame (NULL: ": ping\n\n"). */
typedef struct lm_srv_stream lm_srv_stream;
struct lm_srv_stream {
  lm_srv_buf out;
  int ended;
  int (*produce)(lm_srv_stream *st, int timeout_ms);
  void (*destroy)(lm_srv_stream *st); /* frees the stream (and cancels its work) */
};

#endif
