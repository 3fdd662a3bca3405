/* hub_error.c — words for the hub's HTTP errors (see hub_error.h). The hub answers 401 rather
 * than 404 for a repository it will not show an anonymous caller, so a 401 may mean either "no
 * such repository" or "private or gated": the message says both. */
#include "hub/hub_error.h"

#include <stdio.h>
#include <string.h>

#include "base/status.h"

lm_status lm_hub_http_error(const lm_hub_head *h, const lm_hub_env *env, const char *id,
                            const char *rev, const char *file) {
  char said[300] = "";
  if (h->error_message[0]) snprintf(said, sizeof said, " (the hub says: %s)", h->error_message);
  long st = h->status;
  if (st == 401 && env->token[0])
    return LM_ERRF(LM_ERR_NOT_FOUND,
                   "%s: the hub did not accept the token from %s (HTTP 401)%s; check the token, "
                   "and that the repository exists",
                   id, env->token_from, said);
  if (st == 401)
    return LM_ERRF(LM_ERR_NOT_FOUND,
                   "%s: HTTP 401 from %s%s: the repository does not exist, or it is private or "
                   "gated; if you have access, set HF_TOKEN to a token of yours (or write it to "
                   "$HF_HOME/token)",
                   id, env->endpoint, said);
  if (st == 403)
    return LM_ERRF(LM_ERR_STATE,
                   "%s: access refused (HTTP 403)%s: a gated repository needs its conditions "
                   "accepted on the hub, and HF_TOKEN set to a token of the account that did",
                   id, said);
  if (st == 404 && !strcmp(h->error_code, "RevisionNotFound"))
    return LM_ERRF(LM_ERR_NOT_FOUND, "%s has no revision '%s' (HTTP 404)%s", id, rev, said);
  if (st == 404 && file)
    return LM_ERRF(LM_ERR_NOT_FOUND, "%s@%s has no file '%s' (HTTP 404)%s", id, rev, file, said);
  if (st == 404)
    return LM_ERRF(LM_ERR_NOT_FOUND,
                   "%s: no such repository, or no revision '%s', on %s (HTTP 404)%s", id, rev,
                   env->endpoint, said);
  if (st == 429)
    return LM_ERRF(LM_ERR_IO, "%s: the hub is rate-limiting this client (HTTP 429)%s; try later",
                   id, said);
  return LM_ERRF(LM_ERR_IO, "%s%s%s: HTTP %ld from %s%s", id, file ? ": " : "", file ? file : "",
                 st, env->endpoint, said);
}
