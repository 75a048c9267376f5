/*
 * lkv_corpus.c: stories the model writes (see lkv_corpus.h).
 */
#include "lkv_corpus.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lkv_log.h"
#include "lkv_request.h"

static const char *const names[] = {"Lily", "Tom", "Sue", "Max", "Ben", "Anna",
                                    "Sam",  "Mia", "Tim", "Zoe", "Leo", "Amy"};
static const char *const things[] = {"a red ball",  "a big tree", "a little dog",
                                     "a shiny key", "a blue car", "a soft bear"};

int lkv_corpus_make(lkv_worker *w, int n, int max_tokens, char ***texts)
{
    char **t = lkv_xcalloc((size_t)(n > 0 ? n : 1), sizeof(char *));
    char err[512];
    for (int i = 0; i < n; i++) {
        char prompt[160];
        snprintf(prompt, sizeof(prompt), "%s found %s.", names[i % 12], things[(i / 2) % 6]);
        lkv_request_defaults def = {
            .max_tokens = max_tokens,
            .sampling = {.temperature = 0.8f, .top_p = 0.9f, .seed = (uint64_t)i + 1}};
        lkv_request rq;
        int rc = lkv_request_from_text(NULL, 0, prompt, lkv_worker_tokenizer(w), &def, "story", &rq,
                                       err, sizeof(err));
        if (rc != 0) {
            fprintf(stderr, "corpus: %s\n", err);
            lkv_request_free(&rq);
            lkv_corpus_free(t, i);
            return rc;
        }
        rq.rag.no_cache = 1;
        lkv_rag_result res;
        rc = lkv_worker_run(w, &rq.rag, &res);
        if (rc != 0) {
            fprintf(stderr, "corpus: story %d: %s\n", i, res.error);
            lkv_rag_result_free(&res);
            lkv_request_free(&rq);
            lkv_corpus_free(t, i);
            return rc;
        }
        size_t len = strlen(prompt) + strlen(res.text) + 1;
        t[i] = lkv_xmalloc(len);
        snprintf(t[i], len, "%s%s", prompt, res.text);
        lkv_rag_result_free(&res);
        lkv_request_free(&rq);
    }
    *texts = t;
    return 0;
}

void lkv_corpus_free(char **texts, int n)
{
    for (int i = 0; texts != NULL && i < n; i++) {
        free(texts[i]);
    }
    free(texts);
}
