/* srv_error.c — error bodies (srv_error.h). */
#include "server/srv_error.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int set_v(lm_srv_err *e, int http, const char *type, const char *code, const char *param,
                 const char *fmt, va_list ap) {
  e->http = http;
  e->type = type;
  e->code = code;
  snprintf(e->param, sizeof e->param, "%s", param ? param : "");
  vsnprintf(e->message, sizeof e->message, fmt, ap);
  return http;
}

int lm_srv_err_set(lm_srv_err *e, int http, const char *type, const char *code, const char *param,
                   const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_v(e, http, type, code, param, fmt, ap);
  va_end(ap);
  return http;
}

int lm_srv_err_bad(lm_srv_err *e, const char *param, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_v(e, 400, "invalid_request_error", NULL, param, fmt, ap);
  va_end(ap);
  return 400;
}

/* Messages may quote request bytes; json_string refuses invalid UTF-8, so fall back. */
static json_t *safe_string(const char *s) {
  json_t *j = json_string(s);
  return j ? j : json_string("(message not valid UTF-8)");
}

char *lm_srv_err_openai_json(const lm_srv_err *e) {
  json_t *o = json_pack("{s:{s:o,s:s,s:o,s:o}}", "error", "message", safe_string(e->message),
                        "type", e->type ? e->type : "server_error", "param",
                        e->param[0] ? safe_string(e->param) : json_null(), "code",
                        e->code ? json_string(e->code) : json_null());
  char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  return s;
}

const char *lm_srv_err_anthropic_type(int http) {
  switch (http) {
  case 400: return "invalid_request_error";
  case 401: return "authentication_error";
  case 403: return "permission_error";
  case 404: return "not_found_error";
  case 413: return "request_too_large";
  case 429: return "rate_limit_error";
  case 503: return "overloaded_error";
  case 504: return "timeout_error";
  default: return http >= 500 ? "api_error" : "invalid_request_error";
  }
}

char *lm_srv_err_anthropic_json(const lm_srv_err *e) {
  const char *type = e->type && !strcmp(e->type, "memory_admission")
                         ? e->type
                         : lm_srv_err_anthropic_type(e->http);
  json_t *o = json_pack("{s:s,s:{s:s,s:o}}", "type", "error", "error", "type", type, "message",
                        safe_string(e->message));
  char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  return s;
}
