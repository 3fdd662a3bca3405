/* srv_web.h — the chat page (web/chat.html), compiled into the binary: cmake/embed_web.cmake
 * writes its bytes and the Content-Security-Policy that allows its inline script and style by
 * hash into a generated source. srv_web.c serves it at GET /. */
#ifndef LM_SERVER_SRV_WEB_H
#define LM_SERVER_SRV_WEB_H

#include <stddef.h>

extern const unsigned char lm_srv_web_page[]; /* lm_srv_web_page_len bytes, then a NUL */
extern const size_t lm_srv_web_page_len;
extern const char lm_srv_web_csp[];

#endif
