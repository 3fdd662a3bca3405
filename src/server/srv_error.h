/* srv_error.h — an HTTP error as the OpenAI API shapes it:
 *   {"error": {"message": "...", "type": "invalid_request_error", "param": "messages[0].role",
 * "code": null}} and as the Anthropic Messages API shapes it ({"type": "error", "error": {"type",
 * "message"}}). */
#ifndef LM_SERVER_SRV_ERROR_H
#define LM_SERVER_SRV_ERROR_H

#include <stddef.h>

#include "base/status.h"

typedef struct lm_srv_err {
  int http;         /* 0: no error */
  const char *type; /* "invalid_request_error", "memory_admission", "authentication_error", ... */
  const char *code; /* NULL: null */
  char param[128];  /* "": null */
  char message[768];
} lm_srv_err;

/* Sets every field; returns http (so handlers can `return lm_srv_err_set(...)`). */
int lm_srv_err_set(lm_srv_err *e, int http, const char *type, const char *code, const char *param,
                   const char *fmt, ...) LM_PRINTF(6, 7);
/* 400 invalid_request_error naming param. */
int lm_srv_err_bad(lm_srv_err *e, const char *param, const char *fmt, ...) LM_PRINTF(3, 4);

/* The JSON bodies (malloc'ed, NUL-terminated; NULL only when out of memory). */
char *lm_srv_err_openai_json(const lm_srv_err *e);
char *lm_srv_err_anthropic_json(const lm_srv_err *e);
/* The Anthropic error type for an HTTP status ("invalid_request_error", "not_found_error", ...). */
const char *lm_srv_err_anthropic_type(int http);

#endif
