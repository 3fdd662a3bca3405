/* hub_error.h — an HTTP error status of the hub, worded for the person at the terminal: which
 * repository, revision or file, and what to do (set HF_TOKEN, accept a gated repository's
 * conditions, check the name). */
#ifndef LM_HUB_ERROR_H
#define LM_HUB_ERROR_H

#include "hub/hub_env.h"
#include "hub/hub_meta.h"
#include "lumen.h"

/* Sets the message for head->status (an error status) and returns the status to report:
 * LM_ERR_NOT_FOUND for 401/404, LM_ERR_STATE for 403, LM_ERR_IO otherwise. file may be NULL
 * (the revision request). */
lm_status lm_hub_http_error(const lm_hub_head *head, const lm_hub_env *env, const char *id,
                            const char *rev, const char *file);

#endif
