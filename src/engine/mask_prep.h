/* mask_prep.h — the constraints' masks of a step filled on a helper thread while the engine
 * thread waits for the forward: on a GPU the host is idle for the whole step, and the masks
 * (hundreds of microseconds each over a 262,144-id vocabulary) then cost the step nothing but
 * their writing into the logits rows. */
#ifndef LM_ENGINE_MASK_PREP_H
#define LM_ENGINE_MASK_PREP_H

#include "engine/constraint.h"
#include "lumen.h"

typedef struct lm_mask_prep lm_mask_prep;

/* Starts the helper thread. Errors: LM_ERR_NOMEM, LM_ERR_IO (no thread). */
lm_status lm_mask_prep_create(int max_rows, lm_mask_prep **out);
/* Stops and joins the helper (NULL is a no-op); waits for work in flight first. */
void lm_mask_prep_free(lm_mask_prep *p);

/* Hands cons[0..n) (n <= max_rows; NULL entries skipped) to the helper, which prepares each
 * (lm_constraint_prepare, rows in parallel); returns at once. The constraints are the helper's
 * until lm_mask_prep_wait returns. A failed prepare is left undone: the sampling loop's apply
 * prepares again and reports the error on its row. */
void lm_mask_prep_start(lm_mask_prep *p, lm_constraint *const *cons, int n);
/* Waits for the work handed over last (none: returns at once). *host_s gets the seconds of host
 * time the prepares took, summed over rows. */
void lm_mask_prep_wait(lm_mask_prep *p, double *host_s);

#endif
