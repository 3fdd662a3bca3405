/*
 * lumen.h — the public C API of lumen, a local LLM inference engine.
 *
 * This header is the contract: what is not declared here is not a published API.
 * Conventions:
 *   - Every fallible call returns lm_status. LM_OK (0) means no defect was detected;
 *     any other value comes with a human-readable message from lm_errmsg(), which is
 *     kept per thread and valid until the next failing call on that thread.
 *   - Objects come in create/free pairs; every free function accepts NULL.
 *   - The API grows by addition (_v2 functions), never by changed signatures.
 */
#ifndef LUMEN_H
#define LUMEN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LUMEN_VERSION "0.1.0"
#define LUMEN_VERSION_NUMBER 1000 /* major*1000000 + minor*1000 + patch */

/* Status codes. Each has a one-line meaning; lm_errmsg() says which file/field/offset. */
typedef enum lm_status {
  LM_OK = 0,          /* success */
  LM_ERR_IO = 1,      /* a file could not be opened, read, mapped or written */
  LM_ERR_CORRUPT = 2, /* a file's bytes violate its format (truncated, bad offsets, bad JSON) */
  LM_ERR_INVALID = 3, /* an argument or a request is invalid (bad id, bad flag value, bad shape) */
  LM_ERR_UNSUPPORTED =
      4,                /* valid input that lumen does not implement (a quant mode, a model type) */
  LM_ERR_NOMEM = 5,     /* host or device memory could not be allocated */
  LM_ERR_NOT_FOUND = 6, /* a required file, tensor or field is missing */
  LM_ERR_DEVICE = 7,    /* a GPU/driver call failed */
  LM_ERR_STATE = 8,     /* the object is not in a state that allows the call (e.g. ring wrapped) */
  LM_ERR_CANCELLED = 9  /* the operation was cancelled */
} lm_status;

/* Version of the linked library; compare with LUMEN_VERSION_NUMBER. */
int lm_version_number(void);

/* Message of the last failing call on this thread ("" if none). Never NULL. */
const char *lm_errmsg(void);

/* Short name of a status code ("LM_ERR_CORRUPT"). Never NULL. */
const char *lm_status_name(lm_status s);

#ifdef __cplusplus
}
#endif
#endif /* LUMEN_H */
