/* srv_web.c — GET / (and /index.html): the chat page, a static document that holds no data (the
 * conversations live in the browser), so it is served without the API key; the page itself sends
 * the key the user gives it on every API call. Its headers confine it: scripts and styles only
 * the page's own (by hash), connections only to this server, no framing, no MIME sniffing. */
#include "server/srv_web.h"

#include "server/srv_route.h"

static const lm_srv_header page_headers[] = {
    {"Content-Security-Policy", lm_srv_web_csp},
    {"X-Content-Type-Options", "nosniff"},
    {"Referrer-Policy", "no-referrer"},
    /* the page changes with the binary: revalidate rather than keep an old copy */
    {"Cache-Control", "no-cache"},
    {NULL, NULL},
};

void lm_srv_web(const lm_srv_http_req *rq, lm_srv_reply *rp) {
  (void)rq;
  rp->status = 200;
  rp->ctype = "text/html; charset=utf-8";
  rp->static_body = lm_srv_web_page;
  rp->len = lm_srv_web_page_len;
  rp->headers = page_headers;
}
