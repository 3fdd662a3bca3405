/* test_grammar_json.c — JSON Schema grammars. Random walks through the masks generate
 * documents for many schemas (nested objects, optional properties, arrays with bounds, tuples,
 * enums and const of any value, anyOf / oneOf, allOf, $ref recursion, string lengths, patterns,
 * formats, integer and number bounds, nullable types); each must parse as JSON and validate
 * against its schema by the small validator below (written for exactly these keywords; patterns
 * through PCRE2). Plus acceptance / rejection of given documents, refusal of unsupported
 * keywords with the keyword and its JSON pointer, and hostile schemas refused cleanly and fast. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <math.h>
#include <pcre2.h>
#include <time.h>

#include "grammar_testlib.h"
#include "grammar/json_schema_impl.h"

/* ---- a validator for the keywords the cases use -------------------------------------------- */

static int v_valid(json_t *root, json_t *s, json_t *v);

static int v_equal(json_t *a, json_t *b) {
  if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
  if (json_typeof(a) != json_typeof(b)) return 0;
  if (json_is_array(a)) {
    if (json_array_size(a) != json_array_size(b)) return 0;
    for (size_t i = 0; i < json_array_size(a); i++)
      if (!v_equal(json_array_get(a, i), json_array_get(b, i))) return 0;
    return 1;
  }
  if (json_is_object(a)) {
    if (json_object_size(a) != json_object_size(b)) return 0;
    const char *k;
    json_t *x;
    json_object_foreach(a, k, x) {
      json_t *y = json_object_get(b, k);
      if (!y || !v_equal(x, y)) return 0;
    }
    return 1;
  }
  return json_equal(a, b);
}

static int v_type(const char *t, json_t *v) {
  if (!strcmp(t, "null")) return json_is_null(v);
  if (!strcmp(t, "boolean")) return json_is_boolean(v);
  if (!strcmp(t, "object")) return json_is_object(v);
  if (!strcmp(t, "array")) return json_is_array(v);
  if (!strcmp(t, "string")) return json_is_string(v);
  if (!strcmp(t, "number")) return json_is_number(v);
  if (!strcmp(t, "integer"))
    return json_is_integer(v) ||
           (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
  return 0;
}

static int v_regex(const char *pattern, const char *s, size_t n) {
  int err;
  PCRE2_SIZE off;
  pcre2_code *re =
      pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &err, &off, NULL);
  if (!re) fail_msg("test regex does not compile: %s", pattern);
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
  int rc = pcre2_match(re, (PCRE2_SPTR)s, n, 0, 0, md, NULL);
  pcre2_match_data_free(md);
  pcre2_code_free(re);
  return rc >= 0;
}

static size_t v_codepoints(const char *s, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    k += ((unsigned char)s[i] & 0xC0) != 0x80;
  return k;
}

static const char *v_format_rx(const char *f) {
  if (!strcmp(f, "date")) return "^\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])$";
  if (!strcmp(f, "uuid")) return "^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$";
  if (!strcmp(f, "date-time"))
    return "^\\d{4}-\\d\\d-\\d\\d[Tt]([01]\\d|2[0-3]):[0-5]\\d:([0-5]\\d|60)(\\.\\d+)?([Zz]|[+-]"
           "\\d\\d:\\d\\d)$";
  if (!strcmp(f, "email")) return "^[^@\\s]+@[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)+$";
  if (!strcmp(f, "uri")) return "^[A-Za-z][A-Za-z0-9+.-]*:\\S+$";
  if (!strcmp(f, "ipv4"))
    return "^((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)$";
  return NULL;
}

static json_t *v_deref(json_t *root, const char *ref) {
  json_t *cur = root;
  const char *p = ref + 1;
  char tok[256];
  while (*p == '/') {
    p++;
    size_t n = 0;
    while (*p && *p != '/' && n < 255)
      tok[n++] = *p++;
    tok[n] = 0;
    cur = json_object_get(cur, tok);
    if (!cur) fail_msg("test $ref %s does not resolve", ref);
  }
  return cur;
}

static int v_num_ok(json_t *s, json_t *v) {
  double x = json_number_value(v);
  json_t *b;
  if ((b = json_object_get(s, "minimum")) && x < json_number_value(b)) return 0;
  if ((b = json_object_get(s, "maximum")) && x > json_number_value(b)) return 0;
  if ((b = json_object_get(s, "exclusiveMinimum")) && x <= json_number_value(b)) return 0;
  if ((b = json_object_get(s, "exclusiveMaximum")) && x >= json_number_value(b)) return 0;
  return 1;
}

static int v_object_ok(json_t *root, json_t *s, json_t *v) {
  json_t *props = json_object_get(s, "properties"),
         *addl = json_object_get(s, "additionalProperties");
  json_t *req = json_object_get(s, "required");
  size_t i;
  json_t *x;
  json_array_foreach(req, i, x) if (!json_object_get(v, json_string_value(x))) return 0;
  const char *k;
  json_object_foreach(v, k, x) {
    json_t *ps = props ? json_object_get(props, k) : NULL;
    if (ps && !v_valid(root, ps, x)) return 0;
    if (!ps && addl && !v_valid(root, addl, x)) return 0;
  }
  return 1;
}

static int v_array_ok(json_t *root, json_t *s, json_t *v) {
  json_t *pre = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items"), *b;
  size_t n = json_array_size(v), k = json_array_size(pre);
  if ((b = json_object_get(s, "minItems")) && n < (size_t)json_integer_value(b)) return 0;
  if ((b = json_object_get(s, "maxItems")) && n > (size_t)json_integer_value(b)) return 0;
  for (size_t i = 0; i < n; i++) {
    json_t *is = i < k ? json_array_get(pre, i) : items;
    if (is && !v_valid(root, is, json_array_get(v, i))) return 0;
  }
  return 1;
}

static int v_string_ok(json_t *s, json_t *v) {
  const char *str = json_string_value(v);
  size_t n = json_string_length(v), cps = v_codepoints(str, n);
  json_t *b;
  if ((b = json_object_get(s, "minLength")) && cps < (size_t)json_integer_value(b)) return 0;
  if ((b = json_object_get(s, "maxLength")) && cps > (size_t)json_integer_value(b)) return 0;
  if ((b = json_object_get(s, "pattern")) && !v_regex(json_string_value(b), str, n)) return 0;
  if ((b = json_object_get(s, "format"))) {
    const char *rx = v_format_rx(json_string_value(b));
    if (rx && !v_regex(rx, str, n)) return 0;
  }
  return 1;
}

static int v_valid(json_t *root, json_t *s, json_t *v) {
  if (json_is_true(s)) return 1;
  if (json_is_false(s)) return 0;
  json_t *x;
  if ((x = json_object_get(s, "$ref")) && !v_valid(root, v_deref(root, json_string_value(x)), v))
    return 0;
  size_t i;
  json_t *y;
  if ((x = json_object_get(s, "allOf")))
    json_array_foreach(x, i, y) if (!v_valid(root, y, v)) return 0;
  if ((x = json_object_get(s, "anyOf"))) {
    int any = 0;
    json_array_foreach(x, i, y) any |= v_valid(root, y, v);
    if (!any) return 0;
  }
  if ((x = json_object_get(s, "oneOf"))) {
    int n = 0;
    json_array_foreach(x, i, y) n += v_valid(root, y, v);
    if (n != 1) return 0;
  }
  if ((x = json_object_get(s, "enum"))) {
    int any = 0;
    json_array_foreach(x, i, y) any |= v_equal(y, v);
    if (!any) return 0;
  }
  if ((x = json_object_get(s, "const")) && !v_equal(x, v)) return 0;
  if ((x = json_object_get(s, "type"))) {
    int ok = json_is_string(x) && v_type(json_string_value(x), v);
    json_array_foreach(x, i, y) ok |= v_type(json_string_value(y), v);
    if (json_is_true(json_object_get(s, "nullable")) && json_is_null(v)) ok = 1;
    if (!ok) return 0;
  }
  if (json_is_object(v) && !v_object_ok(root, s, v)) return 0;
  if (json_is_array(v) && !v_array_ok(root, s, v)) return 0;
  if (json_is_string(v) && !v_string_ok(s, v)) return 0;
  if (json_is_number(v) && !v_num_ok(s, v)) return 0;
  return 1;
}

/* ---- generation ------------------------------------------------------------------------------ */

static lm_grammar *schema_grammar(const char *schema) {
  lm_grammar *g = NULL;
  if (lm_grammar_from_json_schema(schema, strlen(schema), &g) != LM_OK)
    fail_msg("schema refused: %s\n%s", lm_errmsg(), schema);
  return g;
}

/* Walks `runs` documents; every completed one must parse and validate. Returns how many
 * completed. */
static int walk_validate(const char *schema, int runs, int brute, lm_grammar_vocab *v) {
  lm_grammar *g = schema_grammar(schema);
  json_t *sch = json_loads(schema, JSON_DECODE_ANY, NULL);
  assert_non_null(sch);
  char *buf = malloc(1 << 16);
  int done = 0;
  for (int r = 0; r < runs; r++) {
    long n = gt_walk(g, v, 1000 + (uint64_t)r * 31, 600, brute && r < 3, "\"]},", buf, 1 << 16);
    if (n < 0) continue;
    done++;
    json_error_t err;
    json_t *doc = json_loadb(buf, (size_t)n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
    if (!doc) fail_msg("not JSON (%s): %s\nschema %s", err.text, buf, schema);
    if (!v_valid(sch, sch, doc)) fail_msg("invalid for the schema: %s\nschema %s", buf, schema);
    if (n > 0 && (buf[0] == ' ' || buf[0] == '\n' || buf[n - 1] == ' ' || buf[n - 1] == '\n'))
      fail_msg("whitespace at an end: '%s'", buf);
    json_decref(doc);
  }
  free(buf);
  json_decref(sch);
  lm_grammar_free(g);
  return done;
}

static const char *const k_schemas[] = {
    /* nested objects, required and optional properties */
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},\"addr\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\",\"pattern\":"
    "\"^[0-9]{5}$\"}},\"required\":[\"city\"]}},\"required\":[\"name\",\"age\"],"
    "\"additionalProperties\":false}",
    /* all optional */
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":\"null\"},"
    "\"c\":{\"type\":\"number\"}}}",
    /* arrays with bounds */
    "{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":-20,\"maximum\":20},"
    "\"minItems\":2,\"maxItems\":4}",
    "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":3},"
    "\"maxItems\":3}",
    /* tuples */
    "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],"
    "\"items\":false,\"minItems\":1}",
    "{\"type\":\"array\",\"prefixItems\":[{\"const\":1}],\"items\":{\"type\":\"boolean\"},"
    "\"maxItems\":3}",
    /* enums and const of any value */
    "{\"enum\":[\"red\",\"green\",1.5,null,{\"k\":[1,2]},[true],\"q\\\"uote\"]}",
    "{\"type\":\"object\",\"properties\":{\"v\":{\"const\":{\"x\":\"y\"}}},\"required\":[\"v\"]}",
    /* anyOf, oneOf, nullable */
    "{\"anyOf\":[{\"type\":\"string\",\"maxLength\":4},{\"type\":\"integer\",\"maximum\":-1}]}",
    "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"a\"}},"
    "\"required\":[\"kind\"]},{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"b\"},"
    "\"n\":{\"type\":\"integer\"}},\"required\":[\"kind\",\"n\"]}]}",
    "{\"type\":[\"string\",\"null\"],\"maxLength\":5}",
    "{\"type\":\"integer\",\"nullable\":true,\"minimum\":5}",
    /* $ref recursion */
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
    "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},"
    "\"required\":[\"v\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
    "{\"definitions\":{\"list\":{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"object\","
    "\"properties\":{\"head\":{\"type\":\"integer\"},\"tail\":{\"$ref\":\"#/definitions/list\"}},"
    "\"required\":[\"head\",\"tail\"]}]}},\"$ref\":\"#/definitions/list\"}",
    /* strings: lengths, patterns, formats */
    "{\"type\":\"string\",\"minLength\":2,\"maxLength\":6}",
    "{\"type\":\"string\",\"pattern\":\"^[a-z]{2,4}-\\\\d+(\\\\.[0-9]+)?$\"}",
    "{\"type\":\"string\",\"pattern\":\"ab|c\\\"d\"}",
    "{\"type\":\"string\",\"pattern\":\"^(?:[A-Z][a-z]+ ?){1,3}$\"}",
    "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},"
    "\"u\":{\"type\":\"string\",\"format\":\"uuid\"},\"e\":{\"type\":\"string\",\"format\":"
    "\"email\"},\"t\":{\"type\":\"string\",\"format\":\"date-time\"},\"ip\":{\"type\":\"string\","
    "\"format\":\"ipv4\"},\"w\":{\"type\":\"string\",\"format\":\"uri\"}},\"required\":[\"d\","
    "\"u\",\"e\",\"t\",\"ip\",\"w\"]}",
    /* numbers */
    "{\"type\":\"integer\",\"minimum\":-1234,\"maximum\":567}",
    "{\"type\":\"integer\",\"exclusiveMinimum\":99}",
    "{\"type\":\"integer\",\"maximum\":-7}",
    "{\"type\":\"number\",\"minimum\":-2,\"exclusiveMaximum\":3}",
    "{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1}",
    "{\"type\":\"number\"}",
    /* allOf of objects */
    "{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
    "\"required\":[\"a\"]},{\"properties\":{\"b\":{\"type\":\"string\",\"maxLength\":2}},"
    "\"required\":[\"b\"]}]}",
    /* what Pydantic and OpenAI's strict mode write */
    "{\"$defs\":{\"Item\":{\"properties\":{\"name\":{\"title\":\"Name\",\"type\":\"string\"},"
    "\"price\":{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"null\"}],\"default\":null,"
    "\"title\":\"Price\"}},\"required\":[\"name\"],\"title\":\"Item\",\"type\":\"object\"}},"
    "\"properties\":{\"items\":{\"items\":{\"$ref\":\"#/$defs/Item\"},\"title\":\"Items\","
    "\"type\":\"array\",\"maxItems\":3}},\"required\":[\"items\"],\"title\":\"Order\","
    "\"type\":\"object\",\"additionalProperties\":false}",
    "{\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\",\"description\":"
    "\"City\"},\"unit\":{\"type\":[\"string\",\"null\"],\"enum\":[\"celsius\",\"fahrenheit\","
    "null]}},\"required\":[\"location\",\"unit\"],\"additionalProperties\":false,\"strict\":"
    "true}",
    /* maps and any values */
    "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\",\"minimum\":0}}",
    "{\"type\":\"object\"}",
    "true",
};

static void t_walks_validate(void **state) {
  (void)state;
  lm_grammar_vocab *v = gt_json_vocab();
  for (size_t i = 0; i < sizeof k_schemas / sizeof *k_schemas; i++) {
    int done = walk_validate(k_schemas[i], 24, 1, v);
    if (done < 6) fail_msg("only %d of 24 walks completed for %s", done, k_schemas[i]);
  }
  lm_grammar_vocab_free(v);
}

typedef struct acase {
  const char *schema;
  const char *yes[6];
  const char *no[8];
} acase;

static const acase k_accept[] = {
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
     "\"string\"}},\"required\":[\"a\"]}",
     {"{\"a\":1}", "{\"a\":-2,\"b\":\"x\"}", "{ \"a\": 1, \"b\": \"\" }", "{\n  \"a\": 0\n}"},
     {"{}", "{\"b\":\"x\"}", "{\"b\":\"x\",\"a\":1}", "{\"a\":1,\"c\":2}", "{\"a\":01}",
      " {\"a\":1}", "{\"a\":1} ", "{\"a\":  1}"}},
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":2}",
     {"[]", "[1]", "[1,2]", "[ 1 , 2 ]"},
     {"[1,2,3]", "[1,]", "[,1]", "[1.5]"}},
    {"{\"type\":\"string\",\"maxLength\":2}",
     {"\"\"", "\"ab\"", "\"\\n\\u00e9\"", "\"日本\""},
     {"\"abc\"", "\"a\nb\"", "\"\\ud800\"", "\"\\x\""}},
    {"{\"type\":\"integer\",\"minimum\":10,\"maximum\":200}",
     {"10", "99", "200", "150"},
     {"9", "201", "010", "-10", "1000", "2e2"}},
    {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}",
     {"0", "1", "0.5", "1.000", "0.0"},
     {"-0.5", "1.01", "2", "1e0", ".5"}},
    {"{\"enum\":[\"a\",{\"b\":[1,null]},true]}",
     {"\"a\"", "{\"b\":[1,null]}", "true"},
     {"\"b\"", "{\"b\":[1]}", "false", "{ \"b\":[1,null]}"}},
    {"{\"type\":\"string\",\"format\":\"date\"}",
     {"\"2024-02-29\"", "\"1999-12-31\""},
     {"\"2024-13-01\"", "\"2024-1-01\"", "\"24-01-01\""}},
    {"{\"type\":\"string\",\"pattern\":\"^a+$\"}", {"\"a\"", "\"aaa\""}, {"\"\"", "\"ab\""}},
    {"{\"type\":\"string\",\"pattern\":\"b\"}", {"\"b\"", "\"abc\"", "\"\\\"b\""}, {"\"ac\""}},
    {"{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"boolean\"}},"
     "\"additionalProperties\":false}",
     {"{}", "{\"k\":true}"},
     {"{\"k\":1}", "{\"x\":true}"}},
};

static void t_accept_reject(void **state) {
  (void)state;
  lm_grammar_vocab *v = gt_json_vocab();
  for (size_t c = 0; c < sizeof k_accept / sizeof *k_accept; c++) {
    lm_grammar *g = schema_grammar(k_accept[c].schema);
    for (int k = 0; k < 6 && k_accept[c].yes[k]; k++) {
      const char *s = k_accept[c].yes[k];
      if (!gt_accepts(g, v, s, strlen(s)))
        fail_msg("schema %zu rejects %s\n%s", c, s, k_accept[c].schema);
    }
    for (int k = 0; k < 8 && k_accept[c].no[k]; k++) {
      const char *s = k_accept[c].no[k];
      if (gt_accepts(g, v, s, strlen(s)))
        fail_msg("schema %zu accepts %s\n%s", c, s, k_accept[c].schema);
    }
    lm_grammar_free(g);
  }
  lm_grammar_vocab_free(v);
}

/* Whitespace is bounded: past LM_JS_WS_MAX indentation the grammar says no. */
static void t_whitespace_bounded(void **state) {
  (void)state;
  lm_grammar_vocab *v = gt_json_vocab();
  lm_grammar *g = schema_grammar("{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}");
  char doc[128];
  snprintf(doc, sizeof doc, "[\n%*s1]", LM_JS_WS_MAX, "");
  assert_true(gt_accepts(g, v, doc, strlen(doc)));
  snprintf(doc, sizeof doc, "[\n%*s1]", LM_JS_WS_MAX + 1, "");
  assert_false(gt_accepts(g, v, doc, strlen(doc)));
  assert_false(gt_accepts(g, v, "[  1]", 5));
  assert_false(gt_accepts(g, v, "[\n\n1]", 5));
  lm_grammar_free(g);
  lm_grammar_vocab_free(v);
}

typedef struct ucase {
  const char *schema;
  lm_status code;
  const char *msg;
} ucase;

static const ucase k_refused[] = {
    {"{\"properties\":{\"a\":{\"patternProperties\":{\"x\":{}}}}}", LM_ERR_UNSUPPORTED,
     "#/properties/a: 'patternProperties' is not supported"},
    {"{\"type\":\"array\",\"items\":{\"not\":{\"type\":\"null\"}}}", LM_ERR_UNSUPPORTED,
     "#/items: 'not' is not supported"},
    {"{\"if\":{},\"then\":{}}", LM_ERR_UNSUPPORTED, "#: 'if' is not supported"},
    {"{\"type\":\"array\",\"uniqueItems\":true}", LM_ERR_UNSUPPORTED, "'uniqueItems': true"},
    {"{\"type\":\"string\",\"format\":\"iri-reference\"}", LM_ERR_UNSUPPORTED,
     "format 'iri-reference'"},
    {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", LM_ERR_UNSUPPORTED, "backreferences"},
    {"{\"type\":\"string\",\"pattern\":\"(?=a)\"}", LM_ERR_UNSUPPORTED, "lookaround"},
    {"{\"type\":\"string\",\"pattern\":\"[a\"}", LM_ERR_INVALID, "unterminated character class"},
    {"{\"$ref\":\"other.json#/a\"}", LM_ERR_UNSUPPORTED, "only local JSON pointers"},
    {"{\"$ref\":\"#/$defs/missing\"}", LM_ERR_INVALID, "does not resolve"},
    {"{\"type\":\"integer\",\"multipleOf\":3}", LM_ERR_UNSUPPORTED, "'multipleOf'"},
    {"{\"type\":\"number\",\"minimum\":0.5}", LM_ERR_UNSUPPORTED, "only integer bounds"},
    {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", LM_ERR_INVALID, "no number fits"},
    {"{\"type\":\"string\",\"minLength\":5,\"maxLength\":4}", LM_ERR_INVALID, "minLength 5"},
    {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":1}", LM_ERR_INVALID, "no array fits"},
    {"{\"type\":\"frob\"}", LM_ERR_INVALID, "unknown type 'frob'"},
    {"false", LM_ERR_INVALID, "schema false"},
    {"{\"enum\":[]}", LM_ERR_INVALID, "non-empty"},
    {"{\"type\":\"string\",\"enum\":[1,2]}", LM_ERR_INVALID, "no value of 'enum'"},
    {"{\"allOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", LM_ERR_INVALID, "no type"},
    {"{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":"
     "\"#/$defs/a\"}",
     LM_ERR_INVALID, "json schema"},
    {"{\"type\":\"object\",\"properties\":{},\"required\":[\"x\"],\"additionalProperties\":false}",
     LM_ERR_INVALID, "required property 'x'"},
    {"{\"a\":", LM_ERR_INVALID, "invalid JSON"},
};

static void t_refused(void **state) {
  (void)state;
  for (size_t c = 0; c < sizeof k_refused / sizeof *k_refused; c++) {
    lm_grammar *g = NULL;
    lm_status s = lm_grammar_from_json_schema(k_refused[c].schema, strlen(k_refused[c].schema), &g);
    if (s != k_refused[c].code)
      fail_msg("case %zu: status %s (%s), expected %s\n%s", c, lm_status_name(s), lm_errmsg(),
               lm_status_name(k_refused[c].code), k_refused[c].schema);
    assert_null(g);
    gt_assert_msg_has(k_refused[c].msg);
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Hostile schemas: refused (or accepted) within a bounded time, never a crash. */
static void t_hostile(void **state) {
  (void)state;
  size_t cap = 1 << 22;
  char *s = malloc(cap);
  lm_grammar *g = NULL;
  /* 100 levels of nesting */
  size_t n = 0;
  for (int i = 0; i < 100; i++)
    n += (size_t)snprintf(s + n, cap - n, "{\"items\":");
  n += (size_t)snprintf(s + n, cap - n, "{}");
  for (int i = 0; i < 100; i++)
    s[n++] = '}';
  s[n] = 0;
  assert_int_equal(lm_grammar_from_json_schema(s, n, &g), LM_ERR_UNSUPPORTED);
  gt_assert_msg_has("deeper than 64");
  /* nested anyOf of two branches, 40 levels: linear, accepted */
  n = 0;
  for (int i = 0; i < 40; i++)
    n += (size_t)snprintf(s + n, cap - n, "{\"anyOf\":[{\"type\":\"null\"},");
  n += (size_t)snprintf(s + n, cap - n, "{\"type\":\"integer\"}");
  for (int i = 0; i < 40; i++)
    n += (size_t)snprintf(s + n, cap - n, "]}");
  double t0 = now_s();
  assert_int_equal(lm_grammar_from_json_schema(s, n, &g), LM_OK);
  lm_grammar_free(g);
  /* an enum too large for the IR */
  n = (size_t)snprintf(s, cap, "{\"enum\":[");
  for (int i = 0; i < 30000; i++)
    n += (size_t)snprintf(s + n, cap - n, "%s\"value-%d\"", i ? "," : "", i);
  n += (size_t)snprintf(s + n, cap - n, "]}");
  assert_int_equal(lm_grammar_from_json_schema(s, n, &g), LM_ERR_INVALID);
  gt_assert_msg_has("too large");
  /* allOf of a schema with itself at every level, through $defs: linear thanks to the memo */
  n = (size_t)snprintf(s, cap, "{\"$defs\":{");
  for (int i = 0; i < 40; i++)
    n +=
        (size_t)snprintf(s + n, cap - n,
                         "%s\"d%d\":{\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#/$defs/"
                         "d%d\"},\"y\":{\"$ref\":\"#/$defs/d%d\"}}}",
                         i ? "," : "", i, i + 1, i + 1);
  n += (size_t)snprintf(s + n, cap - n,
                        ",\"d40\":{\"type\":\"integer\"}},\"allOf\":[{\"$ref\":\"#/$defs/d0\"},{"
                        "\"$ref\":\"#/$defs/d0\"}]}");
  lm_status st = lm_grammar_from_json_schema(s, n, &g);
  if (st == LM_OK)
    lm_grammar_free(g);
  else
    assert_int_equal(st, LM_ERR_UNSUPPORTED);
  /* a long tuple and a long property list */
  n = (size_t)snprintf(s, cap, "{\"type\":\"array\",\"prefixItems\":[");
  for (int i = 0; i < 5000; i++)
    n += (size_t)snprintf(s + n, cap - n, "%s{\"type\":\"null\"}", i ? "," : "");
  n += (size_t)snprintf(s + n, cap - n, "]}");
  st = lm_grammar_from_json_schema(s, n, &g);
  if (st == LM_OK)
    lm_grammar_free(g);
  else
    assert_int_equal(st, LM_ERR_INVALID);
  if (now_s() - t0 > 20) fail_msg("hostile schemas took %.1f s", now_s() - t0);
  free(s);
}

/* json_object: any object; the mask fills agree with brute force. */
static void t_json_object(void **state) {
  (void)state;
  lm_grammar_vocab *v = gt_json_vocab();
  lm_grammar *g = NULL;
  assert_int_equal(lm_grammar_json_object(&g), LM_OK);
  const char *doc = "{\"a\":[1,{\"b\":null}],\"c\":\"d\"}";
  assert_true(gt_accepts(g, v, doc, strlen(doc)));
  assert_false(gt_accepts(g, v, "[1]", 3));
  assert_false(gt_accepts(g, v, "{\"a\":}", 6));
  char buf[1 << 14];
  int done = 0;
  for (int r = 0; r < 16; r++) {
    long n = gt_walk(g, v, (uint64_t)r + 77, 400, r < 4, "\"]},", buf, sizeof buf);
    if (n < 0) continue;
    done++;
    json_t *doc = json_loadb(buf, (size_t)n, 0, NULL);
    if (!json_is_object(doc)) fail_msg("not a JSON object: %s", buf);
    json_decref(doc);
  }
  assert_true(done >= 4);
  lm_grammar_free(g);
  lm_grammar_vocab_free(v);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_walks_validate),
      cmocka_unit_test(t_accept_reject),
      cmocka_unit_test(t_whitespace_bounded),
      cmocka_unit_test(t_refused),
      cmocka_unit_test(t_hostile),
      cmocka_unit_test(t_json_object),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
