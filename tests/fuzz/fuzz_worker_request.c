/*
 * fuzz_worker_request.c: libFuzzer target for the JSON the decode worker reads
 * (client/worker/lkv_request.c, lkv_request_parse: one request line of lazykv-worker), with the
 * real tokenizer (tests/data/models/tok512.bin) so text documents go through encoding too.
 * Oracles: 0 or LKV_EINVAL with a message; an accepted request is consistent (a question of at
 * least one token, max_tokens >= 1, every token id in the vocabulary, every document with at
 * least one token); and the result line the worker would print for it (lkv_result_json, an
 * error result carrying the request's id and the parser's message, both attacker-controlled)
 * is valid JSON that gives the id back unchanged.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lkv_err.h"
#include "lkv_log.h"
#include "lkv_request.h"
#include "lkv_tokenizer.h"

#define VOCAB 512

static lkv_tokenizer tok;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    lkv_log_set_level(LKV_LOG_ERROR);
    if (lkv_tokenizer_load(&tok, LKV_FUZZ_TOKENIZER, VOCAB) != 0) {
        abort(); /* Not a finding: the tokenizer file is missing. */
    }
    return 0;
}

static void check_result_json(const char *id, int rc, const char *msg)
{
    char *line = lkv_result_json(id, rc, NULL, msg);
    json_error_t je;
    json_t *j = json_loads(line, 0, &je);
    if (j == NULL) {
        abort(); /* The worker would print a line its readers cannot parse. */
    }
    json_t *jid = json_object_get(j, "id");
    if (!json_is_string(jid) || strcmp(json_string_value(jid), id) != 0) {
        abort();
    }
    json_decref(j);
    free(line);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16) {
        return 0;
    }
    char *line = malloc(size + 1);
    memcpy(line, data, size);
    line[size] = '\0';
    lkv_request_defaults def;
    memset(&def, 0, sizeof(def));
    def.max_tokens = 16;
    lkv_request r;
    memset(&r, 0, sizeof(r));
    char err[512];
    err[0] = '\0';
    int rc = lkv_request_parse(line, &tok, &def, "fuzz-7", &r, err, sizeof(err));
    if (rc != 0) {
        if (rc != LKV_EINVAL || err[0] == '\0') {
            abort();
        }
        check_result_json("fuzz-7", rc, err);
    } else {
        const lkv_rag_request *q = &r.rag;
        if (q->n_question < 1 || q->question == NULL || q->max_tokens < 1 || q->n_docs < 0) {
            abort();
        }
        for (int i = 0; i < q->n_question; i++) {
            if (q->question[i] < 0 || q->question[i] >= VOCAB) {
                abort();
            }
        }
        for (int d = 0; d < q->n_docs; d++) {
            if (q->docs[d].n_tokens < 1 || q->docs[d].tokens == NULL) {
                abort();
            }
            for (int i = 0; i < q->docs[d].n_tokens; i++) {
                if (q->docs[d].tokens[i] < 0 || q->docs[d].tokens[i] >= VOCAB) {
                    abort();
                }
            }
        }
        check_result_json(r.id, LKV_EINVAL, "refused by the fuzzer");
    }
    lkv_request_free(&r);
    free(line);
    return 0;
}
