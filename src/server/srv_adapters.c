/* srv_adapters.c — LoRA adapters in the server (srv_adapters.h): the /v1/adapters endpoints and a
 * request's choice of adapters.
 *
 * Loading reads and checks the adapter's files, which takes as long as they are large, so it runs
 * on a thread of its own while the connection is parked (lm_srv_later): no HTTP pool thread, which
 * serves many connections, waits for it, and no lock of the server is held meanwhile. The server
 * waits for such threads before it frees the engine (lm_server_free). */
#include "server/srv_adapters.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "server/srv_route.h"

#define LM_SRV_ADAPTER_WEIGHT_MAX 100.0

static int bad_name(const char *param, lm_srv_err *e) {
  return lm_srv_err_bad(e, param, "adapter names are 1-%d characters of [A-Za-z0-9._-]",
                        LM_ADAPTER_NAME_MAX - 1);
}

/* ---- a request's choice ---------------------------------------------------------------------- */

static int add_one(lm_srv_adapters *a, const char *s, size_t n, float weight, const char *param,
                   lm_srv_err *e) {
  if (!lm_adapter_name_valid(s, n)) return bad_name(param, e);
  if (a->n == LM_ADAPTER_STACK_MAX)
    return lm_srv_err_bad(e, param, "at most %d adapters per request", LM_ADAPTER_STACK_MAX);
  memcpy(a->name[a->n], s, n);
  a->name[a->n][n] = 0;
  a->weights[a->n++] = weight;
  return 0;
}

/* "A+B+...": each at weight 1. strict: a malformed name is a 400, else -1 (not this form). */
static int add_stack(lm_srv_adapters *a, const char *s, const char *param, int strict,
                     lm_srv_err *e) {
  for (;;) {
    const char *plus = strchr(s, '+');
    size_t n = plus ? (size_t)(plus - s) : strlen(s);
    if (!strict && !lm_adapter_name_valid(s, n)) return -1;
    int r = add_one(a, s, n, 1.0f, param, e);
    if (r || !plus) return r;
    s = plus + 1;
  }
}

int lm_srv_adapters_from_model(const lm_server *s, const char *id, const char **base,
                               lm_srv_adapters *a, lm_srv_err *e) {
  const char *colon = strrchr(id, ':'); /* names have no ':', served ids may ("org/m:v2") */
  char b[260];
  size_t nb = colon ? (size_t)(colon - id) : 0;
  if (!nb || nb >= sizeof b) return -1;
  memcpy(b, id, nb);
  b[nb] = 0;
  if (!(*base = lm_srv_model_served(s, b))) return -1;
  a->n = 0;
  a->param = "model";
  int r = add_stack(a, colon + 1, "model", 0, e);
  if (r) a->n = 0;
  return r;
}

/* One item of an "adapter" list: a name, or {"name": ..., "weight": ...}. */
static int add_item(lm_srv_adapters *a, const json_t *it, size_t i, lm_srv_err *e) {
  char param[48];
  snprintf(param, sizeof param, "adapter[%zu]", i);
  if (json_is_string(it))
    return add_one(a, json_string_value(it), json_string_length(it), 1.0f, param, e);
  const json_t *name = json_object_get(it, "name"), *w = json_object_get(it, "weight");
  if (!json_is_object(it) || !json_is_string(name))
    return lm_srv_err_bad(e, param, "an adapter is a name or {\"name\": ..., \"weight\": ...}");
  double x = w && !json_is_null(w) ? (json_is_number(w) ? json_number_value(w) : NAN) : 1.0;
  if (!(fabs(x) <= LM_SRV_ADAPTER_WEIGHT_MAX))
    return lm_srv_err_bad(e, param, "an adapter's weight must be a number in [-%g, %g]",
                          LM_SRV_ADAPTER_WEIGHT_MAX, LM_SRV_ADAPTER_WEIGHT_MAX);
  return add_one(a, json_string_value(name), json_string_length(name), (float)x, param, e);
}

/* The "adapter" field alone into f (f->param is set when it chose anything). */
static int parse_field(const json_t *v, lm_srv_adapters *f, lm_srv_err *e) {
  if (!v || json_is_null(v) || (json_is_string(v) && !json_string_length(v))) return 0;
  f->param = "adapter";
  if (json_is_string(v)) {
    if (strlen(json_string_value(v)) != json_string_length(v)) return bad_name("adapter", e);
    return add_stack(f, json_string_value(v), "adapter", 1, e);
  }
  if (!json_is_array(v))
    return lm_srv_err_bad(e, "adapter",
                          "adapter must be a name, \"A+B\", or a list of names and {\"name\", "
                          "\"weight\"} objects");
  const json_t *it;
  size_t i;
  f->none = json_array_size(v) == 0;
  json_array_foreach(v, i, it) {
    int r = add_item(f, it, i, e);
    if (r) return r;
  }
  return 0;
}

static int same_choice(const lm_srv_adapters *a, const lm_srv_adapters *b) {
  if (a->n != b->n || a->none != b->none) return 0;
  for (int i = 0; i < a->n; i++)
    if (strcmp(a->name[i], b->name[i]) || a->weights[i] != b->weights[i]) return 0;
  return 1;
}

int lm_srv_adapters_parse(const json_t *body, lm_srv_adapters *a, lm_srv_err *e) {
  lm_srv_adapters f;
  memset(&f, 0, sizeof f);
  int r = parse_field(json_object_get(body, "adapter"), &f, e);
  if (r) return r;
  if (a->n && f.param && !same_choice(a, &f))
    return lm_srv_err_bad(e, "adapter",
                          "adapter and the model id choose different adapters (give one, or "
                          "the same in both)");
  if (!a->n) memcpy(a, &f, sizeof f);
  for (int i = 0; i < a->n; i++) /* linked last: a copy above would point into f */
    a->names[i] = a->name[i];
  return 0;
}

int lm_srv_adapters_mounted(lm_server *s, lm_adapter_info **out) {
  *out = NULL;
  lm_adapter_info *v = malloc(LM_ADAPTER_MOUNT_MAX * sizeof *v);
  if (!v) return -1;
  int n = lm_engine_list_adapters(s->e, v, LM_ADAPTER_MOUNT_MAX);
  if (n > LM_ADAPTER_MOUNT_MAX) n = LM_ADAPTER_MOUNT_MAX;
  if (n <= 0) {
    free(v);
    return 0;
  }
  *out = v;
  return n;
}

/* ---- the adapter object ---------------------------------------------------------------------- */

/* A directory given on the command line need not be UTF-8; json_string refuses that. */
static json_t *text(const char *s) {
  json_t *j = json_string(s);
  return j ? j : json_string("(not valid UTF-8)");
}

static json_t *info_json(const lm_server *s, const lm_adapter_info *a) {
  char model[LM_ADAPTER_NAME_MAX + 260];
  snprintf(model, sizeof model, "%s:%s", s->model_id, a->name);
  return json_pack("{s:s,s:o,s:o,s:o,s:o,s:i,s:i,s:I,s:I,s:f,s:f}", "object", "adapter", "name",
                   text(a->name), "model", text(model), "path", text(a->dir), "format",
                   text(a->format), "max_rank", a->max_rank, "modules", a->modules, "bytes",
                   (json_int_t)a->bytes, "users", (json_int_t)a->users, "load_ms", a->load_s * 1e3,
                   "mount_ms", a->mount_s * 1e3);
}

/* The mounted adapter named name into *out; 1 when there is one, 0 when not, -1 out of memory. */
static int find(lm_server *s, const char *name, lm_adapter_info *out) {
  lm_adapter_info *v;
  int n = lm_srv_adapters_mounted(s, &v), hit = 0;
  for (int i = 0; i < n && !hit; i++)
    if (!strcmp(v[i].name, name)) *out = v[i], hit = 1;
  free(v);
  return n < 0 ? -1 : hit;
}

static void not_mounted(const char *name, lm_srv_reply *rp) {
  lm_srv_err e;
  lm_srv_err_set(&e, 404, "invalid_request_error", "adapter_not_found", NULL,
                 "no adapter named '%.64s' is mounted (GET /v1/adapters lists them)", name);
  lm_srv_reply_error(rp, &e, 0);
}

/* ---- POST /v1/adapters ----------------------------------------------------------------------- */

/* A load in flight: the thread's and the parked connection's, freed by the last to let go. */
typedef struct load_job {
  atomic_int refs;
  atomic_int done;
  lm_server *srv;
  char name[LM_ADAPTER_NAME_MAX];
  char *dir;
  lm_status st;
  char msg[640];        /* lm_errmsg() of the loading thread (messages are per thread) */
  lm_adapter_info info; /* what was mounted, when have_info */
  int have_info;
} load_job;

static void job_unref(load_job *j) {
  if (atomic_fetch_sub(&j->refs, 1) != 1) return;
  free(j->dir);
  free(j);
}

static void *load_main(void *arg) {
  load_job *j = arg;
  lm_server *s = j->srv;
  j->st = lm_engine_load_adapter(s->e, j->name, j->dir);
  if (j->st)
    snprintf(j->msg, sizeof j->msg, "%s", lm_errmsg());
  else
    j->have_info = find(s, j->name, &j->info) == 1; /* 0: unmounted again already */
  atomic_store(&j->done, 1);
  job_unref(j);
  atomic_fetch_sub(&s->loads, 1); /* the last touch of s: lm_server_free waits for this */
  return NULL;
}

static int load_error(const load_job *j, lm_srv_err *e) {
  switch (j->st) {
  case LM_ERR_STATE: /* the name is taken, or LM_ADAPTER_MOUNT_MAX are mounted */
    return lm_srv_err_set(e, 409, "invalid_request_error", "adapter_conflict", "name", "%s",
                          j->msg);
  case LM_ERR_NOT_FOUND:
  case LM_ERR_IO:
  case LM_ERR_CORRUPT:
  case LM_ERR_INVALID:
  case LM_ERR_UNSUPPORTED:
    return lm_srv_err_set(e, 400, "invalid_request_error", "invalid_adapter", "path", "%s", j->msg);
  case LM_ERR_CANCELLED: return lm_srv_err_set(e, 503, "server_error", NULL, NULL, "%s", j->msg);
  default: return lm_srv_err_set(e, 500, "server_error", NULL, NULL, "%s", j->msg);
  }
}

static int load_pump(void *obj) { return atomic_load(&((load_job *)obj)->done); }

static void load_answer(void *obj, int r, lm_srv_reply *rp) {
  load_job *j = obj;
  lm_srv_err e;
  (void)r;
  if (j->st) {
    load_error(j, &e);
    lm_srv_reply_error(rp, &e, 0);
  } else if (j->have_info) {
    lm_srv_reply_json(rp, 200, info_json(j->srv, &j->info));
  } else {
    lm_srv_reply_json(
        rp, 200,
        json_pack("{s:s,s:s,s:o}", "object", "adapter", "name", j->name, "path", text(j->dir)));
  }
  job_unref(j);
}

static void load_drop(void *obj) { job_unref(obj); }

/* name and the directory (path, or its aliases adapter_path and dir) from the body. */
static int load_args(const json_t *body, const char **name, const char **dir, lm_srv_err *e) {
  const json_t *n = json_object_get(body, "name");
  if (!json_is_string(n) || !lm_adapter_name_valid(json_string_value(n), json_string_length(n)))
    return bad_name("name", e);
  static const char *const keys[] = {"path", "adapter_path", "dir"};
  *dir = NULL;
  for (int i = 0; i < 3; i++) {
    const json_t *v = json_object_get(body, keys[i]);
    if (!v || json_is_null(v)) continue;
    const char *d = json_string_value(v);
    if (!d || !*d || strlen(d) != json_string_length(v) || strlen(d) >= 4096)
      return lm_srv_err_bad(e, keys[i], "%s must be the adapter's directory", keys[i]);
    if (*dir && strcmp(*dir, d))
      return lm_srv_err_bad(e, keys[i], "path, adapter_path and dir name different directories");
    *dir = d;
  }
  if (!*dir) return lm_srv_err_bad(e, "path", "path (the adapter's directory) is required");
  *name = json_string_value(n);
  return 0;
}

/* A directory that is not there is a 404 before any thread starts. */
static int check_dir(const char *dir, lm_srv_err *e) {
  struct stat st;
  if (stat(dir, &st)) /* other failures (permissions) are the load's to report */
    return errno == ENOENT || errno == ENOTDIR
               ? lm_srv_err_set(e, 404, "invalid_request_error", "path_not_found", "path",
                                "no directory %.512s", dir)
               : 0;
  if (!S_ISDIR(st.st_mode))
    return lm_srv_err_bad(e, "path", "%.512s is not a directory (an adapter is one)", dir);
  return 0;
}

static int start_load(lm_server *s, const char *name, const char *dir, lm_srv_reply *rp,
                      lm_srv_err *e) {
  load_job *j = calloc(1, sizeof *j);
  if (!j || !(j->dir = strdup(dir))) {
    free(j);
    return lm_srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
  }
  j->srv = s;
  snprintf(j->name, sizeof j->name, "%s", name);
  atomic_init(&j->refs, 2);
  atomic_init(&j->done, 0);
  /* counted before closing is read: lm_server_free sets closing, then waits for loads == 0 */
  atomic_fetch_add(&s->loads, 1);
  pthread_attr_t at;
  pthread_t t;
  int bad = atomic_load(&s->closing) || pthread_attr_init(&at);
  if (!bad) {
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    bad = pthread_create(&t, &at, load_main, j) != 0;
    pthread_attr_destroy(&at);
  }
  if (bad) {
    atomic_fetch_sub(&s->loads, 1);
    free(j->dir);
    free(j);
    return atomic_load(&s->closing)
               ? lm_srv_err_set(e, 503, "server_error", NULL, NULL, "the server is stopping")
               : lm_srv_err_set(e, 500, "server_error", NULL, NULL, "cannot start a thread");
  }
  lm_srv_reply_later_n(rp, j, load_pump, load_answer, load_drop);
  return 0;
}

void lm_srv_adapters_load(const lm_srv_http_req *rq, const json_t *body, lm_srv_reply *rp) {
  lm_srv_err e;
  const char *name = NULL, *dir = NULL;
  int r = load_args(body, &name, &dir, &e);
  if (!r) r = check_dir(dir, &e);
  if (!r) r = start_load(rq->srv, name, dir, rp, &e);
  if (r) lm_srv_reply_error(rp, &e, 0);
}

/* ---- GET and DELETE -------------------------------------------------------------------------- */

void lm_srv_adapters_list(const lm_srv_http_req *rq, lm_srv_reply *rp) {
  lm_adapter_info *v;
  int n = lm_srv_adapters_mounted(rq->srv, &v);
  json_t *data = n < 0 ? NULL : json_array();
  for (int i = 0; data && i < n; i++)
    json_array_append_new(data, info_json(rq->srv, &v[i]));
  free(v);
  lm_srv_reply_json(rp, 200, data ? json_pack("{s:s,s:o}", "object", "list", "data", data) : NULL);
}

void lm_srv_adapters_get(const lm_srv_http_req *rq, lm_srv_reply *rp) {
  const char *name = rq->path + strlen("/v1/adapters/");
  lm_adapter_info a;
  int hit = lm_adapter_name_valid(name, strlen(name)) ? find(rq->srv, name, &a) : 0;
  if (hit > 0)
    lm_srv_reply_json(rp, 200, info_json(rq->srv, &a));
  else if (hit < 0)
    lm_srv_reply_text(rp, 500, "application/json", NULL);
  else
    not_mounted(name, rp);
}

void lm_srv_adapters_delete(const lm_srv_http_req *rq, lm_srv_reply *rp) {
  const char *name = rq->path + strlen("/v1/adapters/");
  lm_status st = lm_adapter_name_valid(name, strlen(name))
                     ? lm_engine_unload_adapter(rq->srv->e, name)
                     : LM_ERR_NOT_FOUND;
  if (st == LM_ERR_NOT_FOUND) {
    not_mounted(name, rp);
    return;
  }
  if (st) {
    lm_srv_err e;
    lm_srv_err_set(&e, 500, "server_error", NULL, NULL, "%s", lm_errmsg());
    lm_srv_reply_error(rp, &e, 0);
    return;
  }
  lm_srv_reply_json(rp, 200,
                    json_pack("{s:s,s:s,s:b}", "object", "adapter", "name", name, "deleted", 1));
}
