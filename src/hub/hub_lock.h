/* hub_lock.h — one process at a time per blob: {cache}/.locks/models--ORG--REPO/ETAG.lock held
 * with flock(2), the file huggingface_hub's filelock uses, so two downloads of the same file (by
 * lumen or by huggingface_hub) wait for each other instead of writing one .incomplete together.
 * The kernel drops the lock when the process dies, so a killed download never leaves it held. */
#ifndef LM_HUB_LOCK_H
#define LM_HUB_LOCK_H

#include "lumen.h"

/* Takes the lock at path (creating its folders); *fd receives the descriptor to unlock. With
 * wait, blocks while another process holds it; without, returns LM_ERR_STATE at once then (so the
 * caller can say that it waits before it does). */
lm_status lm_hub_lock(const char *path, int wait, int *fd);
void lm_hub_unlock(int fd);

#endif
