/*
 * lkv_request.h: the lazykv-worker request and result formats (JSON lines, through libjansson),
 * and the text rendering of a result.
 *
 * A request is one JSON object on one line:
 *
 *   {"id": "q1",                          optional string (echoed back; default "N": line no.)
 *    "docs": ["text", {"text": "..."}, {"tokens": [1, 2, 3]}],   documents in prompt order
 *    "question": "text" | {"tokens": [...]},                    required
 *    "max_tokens": 32,                    1.. (default: the worker's default)
 *    "temperature": 0.0, "top_p": 1.0, "seed": 0,   sampling (temperature 0: greedy)
 *    "stop": true,                        stop at an end token (default true)
 *    "bos": true,                         documents given as text start with BOS (default true)
 *    "mode": "lazy" | "materialise" | "prefix",   default "lazy" ("prefix": the worker's
 *                                         prefix pool, lazykv-worker --prefix-pages)
 *    "cache": true}                       false: do not use the daemon for this request
 *
 * Text goes through the tokenizer: a document gets a BOS first (unless "bos": false), the
 * question never does. Unknown keys are refused (a typo must not silently change a request).
 *
 * A result is one JSON object on one line: {"id", "ok": true, "text", "tokens", "stop",
 * "ttft_ms", "tpot_ms", "total_ms", "lookup_ms", "attach_ms", "miss_ms", "put_ms", "n_prompt",
 * "hit_docs", "miss_docs", "hit_tokens", "miss_tokens", "zero_copy_blocks", "local_only",
 * "note", "docs": [{"hit", "tier", "start", "n_tokens", "n_blocks", "stored", "inplace",
 * "key"}]}, or {"id", "ok": false, "error", "code"} ("code" is the LKV_E* name, e.g. "EINVAL").
 */
#ifndef LKV_REQUEST_H
#define LKV_REQUEST_H

#include <stdio.h>

#include "lkv_tokenizer.h"
#include "lkv_worker.h"

/* Defaults applied to fields a request leaves out. */
typedef struct lkv_request_defaults {
    int max_tokens;        /* Default max_tokens. */
    lkv_sampling sampling; /* Default sampling. */
    int mode;              /* Default enum lkv_rag_mode. */
} lkv_request_defaults;

/* A parsed request. Owns its token arrays. */
typedef struct lkv_request {
    char id[128];        /* The request's id. */
    lkv_rag_request rag; /* Points into the arrays below. */
    lkv_rag_doc *docs;   /* [rag.n_docs]. Owned. */
    int **doc_tokens;    /* [rag.n_docs] token arrays. Owned. */
    int *question;       /* Owned. */
} lkv_request;

/* Parses one JSON line (borrowed) into *out (free with lkv_request_free, also on error). tok
 * (borrowed; may be NULL: then only token lists are accepted) encodes text. default_id names the
 * request when it has no "id". Returns 0, or LKV_EINVAL with a message in err (len bytes) that
 * names the bad field (or the JSON error's column). */
int lkv_request_parse(const char *line, const lkv_tokenizer *tok, const lkv_request_defaults *def,
                      const char *default_id, lkv_request *out, char *err, size_t len);

/* Builds a request from texts (borrowed): n_docs documents and a question, with the defaults.
 * Same errors as lkv_request_parse. */
int lkv_request_from_text(const char *const *docs, int n_docs, const char *question,
                          const lkv_tokenizer *tok, const lkv_request_defaults *def, const char *id,
                          lkv_request *out, char *err, size_t len);

void lkv_request_free(lkv_request *r);

/* Tokenizes text (a BOS first when bos) into *out (a new array, caller frees, also on error)
 * and its length *n. what names the text in messages. Returns 0, or LKV_EINVAL (no tokenizer,
 * empty text) with a message in err. */
int lkv_request_encode(const lkv_tokenizer *tok, const char *text, int bos, const char *what,
                       int **out, int *n, char *err, size_t len);

/* The JSON line of a result (no newline): rc 0 renders res, else the error (res->error, or msg
 * when res is NULL). Returns a malloc'ed string (caller frees). */
char *lkv_result_json(const char *id, int rc, const lkv_rag_result *res, const char *msg);

/* Writes a human-readable rendering of a result to f. */
void lkv_result_text(FILE *f, const char *id, int rc, const lkv_rag_result *res, const char *msg);

/* "hot", "cold", "absent" or "local" for an enum lkv_wire_tier (0: local). */
const char *lkv_request_tier_name(int tier);

#endif
