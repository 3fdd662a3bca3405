/* lora_batch.h — rows of one batch running different LoRA adapter sets (lora_bank.h), checked on
 * a backend against each sequence run alone with its set attached. */
#ifndef LM_TEST_LORA_BATCH_H
#define LM_TEST_LORA_BATCH_H

#include "backend/backend.h"
#include "model/model.h"

typedef struct lm_lora_batch_report {
  double max_rel;  /* the largest max |d| / max |ref| of a sequence, mixed batch vs alone */
  double base_rel; /* the base sequence's: the same (it picks no adapter) */
  double adapted;  /* max |d| / max |base| between an adapted sequence and the base: > 0 */
  int base_bits;   /* after unmounting, the forward's logits equal a fresh one's bit for bit */
  double rel[3];   /* each sequence's max |d| / max |ref|, mixed vs alone */
} lm_lora_batch_report;

/* Floats of each of lm_test_lora_batch's logit sets (3 sequences x 4 steps x vocab). */
int64_t lm_test_lora_batch_floats(const lm_model *m);

/* Three sequences of model m in one batch on be — adapter A; A at weight 0.5 stacked with B;
 * none — prefilled together, then decoded together for three steps; each compared with the
 * same sequence alone (A; A with B scaled by 0.5 at load, and B; no adapter). Then every slot
 * unmounted and the base prompt run again. mixed and alone (NULL, or
 * lm_test_lora_batch_floats each) get the two sets of logits. Returns LM_OK or the first
 * error. */
lm_status lm_test_lora_batch(const lm_model *m, lm_backend *be, lm_lora_batch_report *r,
                             float *mixed, float *alone);

#endif
