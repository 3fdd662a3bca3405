/* srv_store.h — the Responses API's store of past responses, so that a request can continue one
 * with previous_response_id (and GET /v1/responses/ID can show it): each entry is a response id,
 * the response object as it was answered, and the conversation it ended (chat-shaped messages:
 * its input, then its output as an assistant message).
 *
 * Bounded three ways: entries, bytes (the two JSON texts) and age. Entries are kept as JSON text,
 * not jansson objects: their size is exact, and a reader gets its own parsed copy, so no object
 * is shared between threads. The oldest go first when a new one does not fit; an entry larger
 * than the whole byte cap is not stored. Expired entries are dropped as the store is used.
 * Lookup is linear in the entries (a thousand by default). Thread-safe (one mutex). */
#ifndef LM_SERVER_SRV_STORE_H
#define LM_SERVER_SRV_STORE_H

#include <jansson.h>
#include <stdint.h>

#include "lumen.h"

typedef struct lm_srv_store lm_srv_store;

/* max_entries >= 1, max_bytes >= 1, ttl_s > 0. Errors: LM_ERR_INVALID, LM_ERR_NOMEM. */
lm_status lm_srv_store_create(int max_entries, int64_t max_bytes, double ttl_s, lm_srv_store **out);
void lm_srv_store_free(lm_srv_store *st); /* NULL is a no-op */

/* Stores (or replaces) id's entry; the objects are serialized (the caller keeps them). Returns 1
 * when stored, 0 when it is larger than the byte cap, -1 when out of memory. */
int lm_srv_store_put(lm_srv_store *st, const char *id, const json_t *response,
                     const json_t *conversation);
/* New objects of id's entry (either pointer may be NULL); 0 when there is none (unknown, evicted
 * or expired), -1 when out of memory. */
int lm_srv_store_get(lm_srv_store *st, const char *id, json_t **response, json_t **conversation);
/* Removes id's entry; 1 when there was one. */
int lm_srv_store_delete(lm_srv_store *st, const char *id);

typedef struct lm_srv_store_stats {
  int entries;
  int64_t bytes;
  int64_t evicted, expired; /* since creation */
} lm_srv_store_stats;
lm_srv_store_stats lm_srv_store_get_stats(lm_srv_store *st);

#endif
