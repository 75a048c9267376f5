/*
 * test_request.c: client.worker.request. The lazykv-worker request format
 * (client/worker/lkv_request.c): a full request parses into the right tokens and options (text
 * through the real tokenizer, BOS on documents only), defaults apply, every malformed field is
 * refused naming it, and a result rendered as JSON parses back (libjansson) to the same values.
 */
#include <jansson.h>

#include "lkv_request.h"
#include "lkv_test.h"

static lkv_tokenizer tok;
static const lkv_request_defaults def = {
    .max_tokens = 7, .sampling = {.temperature = 0, .top_p = 1, .seed = 3}, .mode = 0};

static void test_parse(void)
{
    lkv_request r;
    char err[256];
    const char *line = "{\"id\": \"q1\", \"docs\": [\"Lily went to the park.\", {\"text\": \"Tom "
                       "ran.\"}, {\"tokens\": [5, 6, 7]}], \"question\": \"One day,\", "
                       "\"max_tokens\": 12, \"temperature\": 0.5, \"top_p\": 0.9, \"seed\": 42, "
                       "\"stop\": false, \"mode\": \"materialise\", \"cache\": false}";
    ASSERT_OK(lkv_request_parse(line, &tok, &def, "9", &r, err, sizeof err));
    ASSERT_TRUE(strcmp(r.id, "q1") == 0);
    ASSERT_EQ(r.rag.n_docs, 3);
    int ids[64], n;
    ASSERT_OK(lkv_tokenizer_encode(&tok, "Lily went to the park.", 1, ids, 64, &n));
    ASSERT_EQ(r.rag.docs[0].n_tokens, n);
    ASSERT_TRUE(memcmp(r.rag.docs[0].tokens, ids, (size_t)n * sizeof(int)) == 0);
    ASSERT_EQ(r.rag.docs[1].tokens[0], LKV_TOK_BOS);
    ASSERT_EQ(r.rag.docs[2].n_tokens, 3);
    ASSERT_EQ(r.rag.docs[2].tokens[2], 7);
    ASSERT_OK(lkv_tokenizer_encode(&tok, "One day,", 0, ids, 64, &n));
    ASSERT_EQ(r.rag.n_question, n);
    ASSERT_TRUE(r.rag.question[0] != LKV_TOK_BOS);
    ASSERT_EQ(r.rag.max_tokens, 12);
    ASSERT_NEAR(r.rag.sampling.temperature, 0.5, 1e-7);
    ASSERT_NEAR(r.rag.sampling.top_p, 0.9, 1e-7);
    ASSERT_EQ(r.rag.sampling.seed, 42);
    ASSERT_EQ(r.rag.stop_at_eos, 0);
    ASSERT_EQ(r.rag.mode, LKV_RAG_MATERIALISE);
    ASSERT_EQ(r.rag.no_cache, 1);
    lkv_request_free(&r);
    /* Defaults; "bos": false. */
    ASSERT_OK(lkv_request_parse("{\"docs\": [\"Tom ran.\"], \"bos\": false, \"question\": "
                                "{\"tokens\": [9]}}",
                                &tok, &def, "9", &r, err, sizeof err));
    ASSERT_TRUE(strcmp(r.id, "9") == 0);
    ASSERT_EQ(r.rag.max_tokens, 7);
    ASSERT_EQ(r.rag.sampling.seed, 3);
    ASSERT_EQ(r.rag.stop_at_eos, 1);
    ASSERT_TRUE(r.rag.docs[0].tokens[0] != LKV_TOK_BOS);
    lkv_request_free(&r);
    /* The prefix-caching baseline's mode. */
    ASSERT_OK(lkv_request_parse("{\"question\": {\"tokens\": [9]}, \"mode\": \"prefix\"}", &tok,
                                &def, "9", &r, err, sizeof err));
    ASSERT_EQ(r.rag.mode, LKV_RAG_PREFIX);
    lkv_request_free(&r);
    /* No tokenizer: token lists only. */
    ASSERT_OK(lkv_request_parse("{\"question\": {\"tokens\": [9, 10]}}", NULL, &def, "1", &r, err,
                                sizeof err));
    ASSERT_EQ(r.rag.n_docs, 0);
    lkv_request_free(&r);
    ASSERT_ERR(lkv_request_parse("{\"question\": \"hi\"}", NULL, &def, "1", &r, err, sizeof err),
               LKV_EINVAL);
    ASSERT_TRUE(strstr(err, "tokenizer") != NULL);
    lkv_request_free(&r);
}

static void test_refused(void)
{
    static const struct {
        const char *line, *msg;
    } bad[] = {
        {"not json", "not valid JSON"},
        {"[1, 2]", "JSON object"},
        {"{\"question\": \"x\", \"qestion\": 1}", "unknown key \"qestion\""},
        {"{\"question\": \"x\", \"question\": \"y\"}", "not valid JSON"},
        {"{\"docs\": \"abc\", \"question\": \"x\"}", "\"docs\" must be an array"},
        {"{\"docs\": [{\"text\": \"a\", \"tokens\": [1]}], \"question\": \"x\"}",
         "docs[0]: give exactly one"},
        {"{\"docs\": [{\"tokens\": [1, -2]}], \"question\": \"x\"}", "docs[0]: tokens[1]"},
        {"{\"docs\": [{\"tokens\": [1, 2.5]}], \"question\": \"x\"}", "docs[0]: tokens[1]"},
        {"{\"docs\": [7], \"question\": \"x\"}", "docs[0]: must be a string"},
        {"{\"docs\": [\"  \"], \"question\": \"x\"}", "docs[0] is empty"},
        {"{\"docs\": []}", "\"question\" is missing"},
        {"{\"question\": \"\"}", "question is empty"},
        {"{\"question\": \"x\", \"max_tokens\": 0}", "\"max_tokens\""},
        {"{\"question\": \"x\", \"max_tokens\": 2.5}", "\"max_tokens\" must be an integer"},
        {"{\"question\": \"x\", \"temperature\": -1}", "\"temperature\""},
        {"{\"question\": \"x\", \"top_p\": 1.5}", "\"top_p\""},
        {"{\"question\": \"x\", \"seed\": -4}", "\"seed\""},
        {"{\"question\": \"x\", \"stop\": 1}", "\"stop\" must be true or false"},
        {"{\"question\": \"x\", \"mode\": \"eager\"}", "\"mode\""},
        {"{\"question\": \"x\", \"id\": 5}", "\"id\" must be a string"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        lkv_request r;
        char err[256] = "";
        int rc = lkv_request_parse(bad[i].line, &tok, &def, "1", &r, err, sizeof err);
        if (rc != LKV_EINVAL || strstr(err, bad[i].msg) == NULL) {
            LKV_FAIL("%s: got %d '%s', want '%s'", bad[i].line, rc, err, bad[i].msg);
        }
        lkv_request_free(&r);
    }
}

static void test_result_json(void)
{
    lkv_rag_result res = {0};
    int toks[3] = {10, 20, 30};
    lkv_rag_doc_result docs[2] = {{.hit = 1, .tier = 2, .n_tokens = 5, .start = 0, .n_blocks = 1},
                                  {.hit = 0, .tier = 3, .n_tokens = 9, .start = 5, .stored = 1}};
    res.n_out = 3;
    res.tokens = toks;
    res.text = "a \"quoted\" story";
    res.ttft_ms = 1.5;
    res.n_docs = 2;
    res.docs = docs;
    res.hit_docs = 1;
    res.miss_docs = 1;
    res.hit_tokens = 5;
    res.miss_tokens = 9;
    snprintf(res.note, sizeof res.note, "a note");
    char *s = lkv_result_json("x", 0, &res, NULL);
    ASSERT_TRUE(strchr(s, '\n') == NULL);
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    ASSERT_TRUE(j != NULL);
    ASSERT_TRUE(json_is_true(json_object_get(j, "ok")));
    ASSERT_TRUE(strcmp(json_string_value(json_object_get(j, "text")), res.text) == 0);
    ASSERT_EQ(json_integer_value(json_array_get(json_object_get(j, "tokens"), 2)), 30);
    ASSERT_NEAR(json_real_value(json_object_get(j, "ttft_ms")), 1.5, 0);
    json_t *d = json_array_get(json_object_get(j, "docs"), 0);
    ASSERT_TRUE(strcmp(json_string_value(json_object_get(d, "tier")), "cold") == 0);
    ASSERT_TRUE(json_is_true(json_object_get(d, "hit")));
    d = json_array_get(json_object_get(j, "docs"), 1);
    ASSERT_EQ(json_integer_value(json_object_get(d, "start")), 5);
    ASSERT_TRUE(strcmp(json_string_value(json_object_get(d, "tier")), "absent") == 0);
    json_decref(j);
    free(s);
    s = lkv_result_json("y", LKV_EPROFILE, NULL, "model identity mismatch");
    j = json_loads(s, 0, &e);
    ASSERT_TRUE(json_is_false(json_object_get(j, "ok")));
    ASSERT_TRUE(strcmp(json_string_value(json_object_get(j, "code")), "LKV_EPROFILE") == 0);
    ASSERT_TRUE(strcmp(json_string_value(json_object_get(j, "error")), "model identity mismatch") ==
                0);
    json_decref(j);
    free(s);
}

int main(void)
{
    ASSERT_OK(lkv_tokenizer_load(&tok, LKV_TEST_MODEL_DIR "/tok512.bin", 512));
    LKV_RUN(test_parse);
    LKV_RUN(test_refused);
    LKV_RUN(test_result_json);
    lkv_tokenizer_free(&tok);
    return 0;
}
