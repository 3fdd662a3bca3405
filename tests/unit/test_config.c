/* test_config.c — config.json resolution (gemma4-spec §1.2) on the real geometries, both
 * per-layer forms, and a table of bad configs each giving a clear error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "base/status.h"
#include "model/config.h"

#define PRESETS LM_SHARED_DIR "/presets"

static void load_preset(const char *name, lm_model_config *c) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", PRESETS, name);
  lm_status s = lm_config_load(p, c);
  if (s) fprintf(stderr, "%s\n", lm_errmsg());
  assert_int_equal(s, LM_OK);
}

/* E2B: 35 layers 4:1, layers 15..34 share; donors 13 (sliding) and 14 (full); double-wide MLP. */
static void t_e2b(void **st) {
  (void)st;
  lm_model_config c;
  load_preset("gemma4-e2b.json", &c);
  assert_int_equal(c.n_layers, 35);
  assert_int_equal(c.n_caches, 15);
  for (int l = 15; l < 35; l++) {
    assert_true(c.layers[l].kv_shared);
    assert_int_equal(c.layers[l].donor, c.layers[l].type == LM_LAYER_FULL ? 14 : 13);
    assert_int_equal(c.layers[l].ffn_dim, 12288);
  }
  assert_int_equal(c.layers[14].ffn_dim, 6144);
  assert_int_equal(c.layers[4].head_dim, 512);
  assert_int_equal(c.layers[3].head_dim, 256);
  assert_int_equal(c.layers[4].n_kv_heads, 1);
  assert_int_equal(c.rope[LM_LAYER_FULL].dim, 512);
  assert_true(c.rope[LM_LAYER_FULL].proportional);
  assert_true(c.rope[LM_LAYER_FULL].partial_rotary_factor == 0.25);
  lm_config_free(&c);
}

/* E4B: 42 layers 5:1, 18 shared, donors 22/23, no double-wide MLP. */
static void t_e4b(void **st) {
  (void)st;
  lm_model_config c;
  load_preset("gemma4-e4b.json", &c);
  assert_int_equal(c.n_caches, 24);
  assert_int_equal(c.layers[24].donor, 22);
  assert_int_equal(c.layers[29].donor, 23);
  assert_int_equal(c.layers[41].donor, 23);
  assert_int_equal(c.layers[30].ffn_dim, 10240);
  lm_config_free(&c);
}

/* 31B / 26B: k_eq_v full layers with num_global_key_value_heads; MoE fields. */
static void t_big(void **st) {
  (void)st;
  lm_model_config c;
  load_preset("gemma4-31b.json", &c);
  assert_int_equal(c.layers[5].n_kv_heads, 4);
  assert_int_equal(c.layers[4].n_kv_heads, 16);
  assert_true(c.layers[5].k_eq_v);
  assert_false(c.layers[4].k_eq_v);
  assert_int_equal(c.n_caches, 60);
  lm_config_free(&c);
  load_preset("gemma4-26b-a4b.json", &c);
  assert_true(c.moe);
  assert_int_equal(c.n_experts, 128);
  assert_int_equal(c.top_k, 8);
  assert_int_equal(c.moe_dim, 704);
  assert_int_equal(c.layers[5].n_kv_heads, 2);
  lm_config_free(&c);
}

#define BASE                                                                                       \
  "\"model_type\":\"gemma4_text\",\"vocab_size\":64,\"hidden_size\":32,\"intermediate_size\":64,"  \
  "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":8"

/* per_layer_config wins over global_head_dim; keys are zero-padded strings; last layer forced full.
 */
static void t_forms(void **st) {
  (void)st;
  lm_model_config c;
  const char *a =
      "{" BASE ",\"layer_types\":[\"sliding_attention\",\"full_attention\",\"sliding_attention\","
      "\"sliding_attention\"],\"global_head_dim\":16,\"attention_k_eq_v\":true,"
      "\"num_global_key_value_heads\":1}";
  assert_int_equal(lm_config_parse(a, strlen(a), "a", &c), LM_OK);
  assert_int_equal(c.layers[1].head_dim, 16);
  assert_int_equal(c.layers[1].n_kv_heads, 1);
  assert_int_equal(c.layers[3].type, LM_LAYER_FULL); /* forced */
  assert_int_equal(c.layers[3].head_dim, 16);
  lm_config_free(&c);
  const char *b = "{\"model_type\":\"gemma4\",\"text_config\":{" BASE ",\"global_head_dim\":99,"
                  "\"per_layer_config\":{\"1\":{\"head_dim\":24},\"3\":{\"head_dim\":24,\"num_key_"
                  "value_heads\":1}},"
                  "\"layer_types\":[\"sliding_attention\",\"full_attention\",\"sliding_attention\","
                  "\"full_attention\"]}}";
  assert_int_equal(lm_config_parse(b, strlen(b), "b", &c), LM_OK);
  assert_int_equal(c.layers[1].head_dim, 24);
  assert_int_equal(c.layers[1].n_kv_heads, 2);
  assert_int_equal(c.layers[3].n_kv_heads, 1);
  assert_int_equal(c.layers[0].head_dim, 8);
  lm_config_free(&c);
}

static void t_bad(void **st) {
  (void)st;
  static const struct {
    const char *json, *needle;
    lm_status want;
  } rows[] = {
      {"{", "invalid JSON", LM_ERR_CORRUPT},
      {"[1]", "not a JSON object", LM_ERR_CORRUPT},
      {"{\"vocab_size\":1}", "model_type", LM_ERR_NOT_FOUND},
      {"{\"model_type\":\"llama\"}", "'llama' is not supported", LM_ERR_UNSUPPORTED},
      {"{\"model_type\":\"gemma4_text\",\"vocab_size\":64}", "'hidden_size'", LM_ERR_NOT_FOUND},
      {"{" BASE ",\"hidden_size\":\"32\"}", NULL, LM_ERR_CORRUPT}, /* duplicate key */
      {"{\"model_type\":\"gemma4_text\",\"vocab_size\":64,\"hidden_size\":\"x\"}",
       "'hidden_size' must be an integer", LM_ERR_CORRUPT},
      {"{" BASE ",\"num_kv_shared_layers\":9}", "num_kv_shared_layers", LM_ERR_CORRUPT},
      {"{" BASE ",\"layer_types\":[\"sliding_attention\"]}", "layer_types", LM_ERR_CORRUPT},
      {"{" BASE ",\"layer_types\":[\"a\",\"b\",\"c\",\"d\"]}", "layer_types[0]", LM_ERR_CORRUPT},
      {"{" BASE ",\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"yarn\"}}}", "yarn",
       LM_ERR_UNSUPPORTED},
      {"{" BASE ",\"per_layer_config\":{\"7\":{\"head_dim\":8}}}", "not a layer index",
       LM_ERR_CORRUPT},
      {"{" BASE ",\"per_layer_config\":{\"1\":{\"rope\":8}}}", "not supported", LM_ERR_UNSUPPORTED},
      {"{" BASE ",\"enable_moe_block\":true}", "'num_experts'", LM_ERR_NOT_FOUND},
      {"{" BASE ",\"num_key_value_heads\":3}", "", LM_ERR_CORRUPT},
      {"{\"model_type\":\"gemma4_text\",\"vocab_size\":64,\"hidden_size\":-5}", "outside",
       LM_ERR_CORRUPT},
      {"{" BASE ",\"use_bidirectional_attention\":\"all\"}", "encoder", LM_ERR_UNSUPPORTED},
      /* bounds where the values are read: a hostile config must not size allocations */
      {"{" BASE ",\"sliding_window\":4294967296}", "'sliding_window'", LM_ERR_CORRUPT},
      {"{" BASE ",\"max_position_embeddings\":4096,\"sliding_window\":8192}", "'sliding_window'",
       LM_ERR_CORRUPT},
      {"{" BASE ",\"max_position_embeddings\":0}", "'max_position_embeddings'", LM_ERR_CORRUPT},
      {"{" BASE ",\"max_position_embeddings\":-1}", "'max_position_embeddings'", LM_ERR_CORRUPT},
      {"{" BASE ",\"max_position_embeddings\":4611686018427387904}", "'max_position_embeddings'",
       LM_ERR_CORRUPT},
      {"{" BASE ",\"final_logit_softcapping\":-30.0}", "'final_logit_softcapping'", LM_ERR_CORRUPT},
      {"{" BASE
       ",\"num_kv_shared_layers\":3,\"layer_types\":[\"full_attention\",\"sliding_attention\","
       "\"sliding_attention\",\"full_attention\"]}",
       "no earlier sliding_attention", LM_ERR_CORRUPT},
  };
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    lm_model_config c;
    lm_status s = lm_config_parse(rows[i].json, strlen(rows[i].json), "config.json", &c);
    if (s != rows[i].want || (rows[i].needle && !strstr(lm_errmsg(), rows[i].needle)))
      fprintf(stderr, "row %zu: status %d, message: %s\n", i, s, lm_errmsg());
    assert_int_equal(s, rows[i].want);
    assert_non_null(strstr(lm_errmsg(), "config.json"));
    if (rows[i].needle) assert_non_null(strstr(lm_errmsg(), rows[i].needle));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(t_e2b), cmocka_unit_test(t_e4b),
                                     cmocka_unit_test(t_big), cmocka_unit_test(t_forms),
                                     cmocka_unit_test(t_bad)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
