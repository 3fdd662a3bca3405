/* srv_store.c — the bounded store of past responses (srv_store.h): a list in insertion order,
 * which is also expiry order, so eviction and expiry both take from the head. */
#include "server/srv_store.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/status.h"

typedef struct entry {
  struct entry *prev, *next;
  char *id, *response, *conversation;
  int64_t bytes;
  double t; /* monotonic seconds of the insert */
} entry;

struct lm_srv_store {
  pthread_mutex_t mu;
  entry *head, *tail; /* oldest first */
  int n, max_entries;
  int64_t bytes, max_bytes;
  double ttl_s;
  int64_t evicted, expired;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

lm_status lm_srv_store_create(int max_entries, int64_t max_bytes, double ttl_s,
                              lm_srv_store **out) {
  *out = NULL;
  if (max_entries < 1 || max_bytes < 1 || !(ttl_s > 0))
    return LM_ERRF(LM_ERR_INVALID, "response store: entries, bytes and ttl must be positive");
  lm_srv_store *st = calloc(1, sizeof *st);
  if (!st) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  pthread_mutex_init(&st->mu, NULL);
  st->max_entries = max_entries;
  st->max_bytes = max_bytes;
  st->ttl_s = ttl_s;
  *out = st;
  return LM_OK;
}

static void entry_free(entry *e) {
  free(e->id);
  free(e->response);
  free(e->conversation);
  free(e);
}

/* Unlinks and frees e (mu held). */
static void drop(lm_srv_store *st, entry *e) {
  if (e->prev)
    e->prev->next = e->next;
  else
    st->head = e->next;
  if (e->next)
    e->next->prev = e->prev;
  else
    st->tail = e->prev;
  st->n--;
  st->bytes -= e->bytes;
  entry_free(e);
}

static void expire(lm_srv_store *st, double now) {
  while (st->head && now - st->head->t > st->ttl_s) {
    drop(st, st->head);
    st->expired++;
  }
}

static entry *find(lm_srv_store *st, const char *id) {
  for (entry *e = st->tail; e; e = e->prev) /* recent ones are asked for most */
    if (!strcmp(e->id, id)) return e;
  return NULL;
}

void lm_srv_store_free(lm_srv_store *st) {
  if (!st) return;
  while (st->head)
    drop(st, st->head);
  pthread_mutex_destroy(&st->mu);
  free(st);
}

int lm_srv_store_put(lm_srv_store *st, const char *id, const json_t *response,
                     const json_t *conversation) {
  entry *e = calloc(1, sizeof *e);
  if (!e) return -1;
  e->id = strdup(id);
  e->response = json_dumps(response, JSON_COMPACT);
  e->conversation = json_dumps(conversation, JSON_COMPACT);
  if (!e->id || !e->response || !e->conversation) {
    entry_free(e);
    return -1;
  }
  e->bytes = (int64_t)(strlen(e->id) + strlen(e->response) + strlen(e->conversation));
  e->t = now_s();
  if (e->bytes > st->max_bytes) {
    entry_free(e);
    return 0;
  }
  pthread_mutex_lock(&st->mu);
  expire(st, e->t);
  entry *old = find(st, id);
  if (old) drop(st, old);
  while (st->head && (st->n + 1 > st->max_entries || st->bytes + e->bytes > st->max_bytes)) {
    drop(st, st->head);
    st->evicted++;
  }
  e->prev = st->tail;
  if (st->tail)
    st->tail->next = e;
  else
    st->head = e;
  st->tail = e;
  st->n++;
  st->bytes += e->bytes;
  pthread_mutex_unlock(&st->mu);
  return 1;
}

int lm_srv_store_get(lm_srv_store *st, const char *id, json_t **response, json_t **conversation) {
  if (response) *response = NULL;
  if (conversation) *conversation = NULL;
  char *r = NULL, *c = NULL;
  pthread_mutex_lock(&st->mu);
  expire(st, now_s());
  entry *e = find(st, id);
  int found = e != NULL;
  if (e && response) r = strdup(e->response);
  if (e && conversation) c = strdup(e->conversation);
  pthread_mutex_unlock(&st->mu);
  if (!found) return 0;
  if ((response && !r) || (conversation && !c)) {
    free(r);
    free(c);
    return -1;
  }
  if (response) *response = json_loads(r, 0, NULL);
  if (conversation) *conversation = json_loads(c, 0, NULL);
  free(r);
  free(c);
  if ((response && !*response) || (conversation && !*conversation)) {
    if (response) json_decref(*response);
    if (conversation) json_decref(*conversation);
    return -1;
  }
  return 1;
}

int lm_srv_store_delete(lm_srv_store *st, const char *id) {
  pthread_mutex_lock(&st->mu);
  entry *e = find(st, id);
  int found = e != NULL;
  if (e) drop(st, e);
  pthread_mutex_unlock(&st->mu);
  return found;
}

lm_srv_store_stats lm_srv_store_get_stats(lm_srv_store *st) {
  pthread_mutex_lock(&st->mu);
  lm_srv_store_stats s = {
      .entries = st->n, .bytes = st->bytes, .evicted = st->evicted, .expired = st->expired};
  pthread_mutex_unlock(&st->mu);
  return s;
}
