/* hub_ref.h — model names as the Hugging Face hub spells them: ORG/REPO[@REV]. The rules are
 * huggingface_hub's validate_repo_id: at most 96 characters, letters, digits, '_', '-' and '.',
 * each part beginning and ending with a letter, digit or '_', no "--" and no "..". */
#ifndef LM_HUB_REF_H
#define LM_HUB_REF_H

#include "lumen.h"

#define LM_HUB_ID_MAX 96
#define LM_HUB_REV_MAX 200

typedef struct lm_hub_ref {
  char id[LM_HUB_ID_MAX + 1];   /* ORG/REPO */
  char rev[LM_HUB_REV_MAX + 1]; /* the revision asked for; "main" when none was */
} lm_hub_ref;

/* 1 when s is a valid ORG/REPO (exactly one '/'). */
int lm_hub_id_valid(const char *s);
/* 1 when s is a revision lumen accepts: a branch, tag or commit name without "..", spaces,
 * control characters, backslashes or an empty path component. */
int lm_hub_rev_valid(const char *s);
/* 1 when s is a full commit hash (40 hex digits). */
int lm_hub_is_commit(const char *s);
/* 1 when s reads as ORG/REPO[@REV]. Says nothing about whether it exists. */
int lm_hub_looks_like_ref(const char *s);
/* 1 when s is a file path inside a repository that is safe to place under a snapshot folder:
 * relative, '/'-separated, no empty, "." or ".." component, no backslash or control character,
 * at most 1024 bytes. A server's file list is checked with it before anything is written. */
int lm_hub_file_valid(const char *s);
/* Parses ORG/REPO[@REV]; LM_ERR_INVALID with a message saying which part is wrong. */
lm_status lm_hub_ref_parse(const char *s, lm_hub_ref *out);
/* The cache folder of a repository: models--ORG--REPO. */
void lm_hub_repo_folder(const char *id, char *buf, size_t n);

#endif
