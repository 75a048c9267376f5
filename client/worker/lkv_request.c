/*
 * lkv_request.c: request parsing and result rendering (see lkv_request.h). All JSON goes through
 * libjansson; numbers are checked for type and range, strings are tokenized with the worker's
 * tokenizer into owned arrays.
 */
#include "lkv_request.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "lkv_err.h"
#include "lkv_log.h"

static int bad(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int bad(char *err, size_t len, const char *fmt, ...)
{
    if (err != NULL && len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, len, fmt, ap);
        va_end(ap);
    }
    return LKV_EINVAL;
}

void lkv_request_free(lkv_request *r)
{
    for (int i = 0; r->doc_tokens != NULL && i < r->rag.n_docs; i++) {
        free(r->doc_tokens[i]);
    }
    free(r->doc_tokens);
    free(r->docs);
    free(r->question);
    memset(r, 0, sizeof(*r));
}

int lkv_request_encode(const lkv_tokenizer *tok, const char *text, int bos, const char *what,
                       int **out, int *n, char *err, size_t len)
{
    if (tok == NULL) {
        return bad(err, len, "%s: text needs a tokenizer (start the worker with --tokenizer)",
                   what);
    }
    if (text[strspn(text, " \t\r\n")] == '\0') {
        return bad(err, len, "%s is empty (a document or question needs some text)", what);
    }
    size_t cap = strlen(text) + 3;
    *out = lkv_xmalloc(cap * sizeof(int));
    int rc = lkv_tokenizer_encode(tok, text, bos, *out, (int)cap, n);
    if (rc != 0) {
        return bad(err, len, "%s: cannot tokenize (%s)", what, lkv_strerror(rc));
    }
    return 0;
}

/* A "tokens" array into a new int array. */
static int tokens_of(const json_t *a, const char *what, int **out, int *n, char *err, size_t len)
{
    if (!json_is_array(a)) {
        return bad(err, len, "%s: \"tokens\" must be an array of token ids", what);
    }
    size_t k = json_array_size(a);
    if (k == 0) {
        return bad(err, len, "%s is empty (a document or question needs some tokens)", what);
    }
    *out = lkv_xmalloc(k * sizeof(int));
    *n = (int)k;
    for (size_t i = 0; i < k; i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            return bad(err, len, "%s: tokens[%zu] is not a non-negative integer", what, i);
        }
        (*out)[i] = (int)json_integer_value(v);
    }
    return 0;
}

/* A document or question: a string, or {"text": ...} / {"tokens": [...]}. */
static int segment_of(const json_t *v, const lkv_tokenizer *tok, int bos, const char *what,
                      int **out, int *n, char *err, size_t len)
{
    if (json_is_string(v)) {
        return lkv_request_encode(tok, json_string_value(v), bos, what, out, n, err, len);
    }
    if (!json_is_object(v)) {
        return bad(err, len, "%s: must be a string or an object with \"text\" or \"tokens\"", what);
    }
    const json_t *t = json_object_get(v, "text"), *k = json_object_get(v, "tokens");
    if ((t == NULL) == (k == NULL) || json_object_size(v) != 1) {
        return bad(err, len, "%s: give exactly one of \"text\" and \"tokens\"", what);
    }
    if (t != NULL) {
        if (!json_is_string(t)) {
            return bad(err, len, "%s: \"text\" must be a string", what);
        }
        return lkv_request_encode(tok, json_string_value(t), bos, what, out, n, err, len);
    }
    return tokens_of(k, what, out, n, err, len);
}

static void init_request(lkv_request *out, const lkv_request_defaults *def, const char *id)
{
    memset(out, 0, sizeof(*out));
    snprintf(out->id, sizeof(out->id), "%s", id != NULL ? id : "");
    out->rag.max_tokens = def->max_tokens;
    out->rag.sampling = def->sampling;
    out->rag.mode = def->mode;
    out->rag.stop_at_eos = 1;
}

static const char *const known_keys[] = {"id",          "docs",  "question", "max_tokens",
                                         "temperature", "top_p", "seed",     "stop",
                                         "bos",         "mode",  "cache",    NULL};

static int get_number(const json_t *o, const char *key, double lo, double hi, double *v, char *err,
                      size_t len)
{
    const json_t *x = json_object_get(o, key);
    if (x == NULL) {
        return 1;
    }
    if (!json_is_number(x) || json_number_value(x) < lo || json_number_value(x) > hi) {
        return bad(err, len, "\"%s\" must be a number in %g..%g", key, lo, hi);
    }
    *v = json_number_value(x);
    return 0;
}

static int get_bool(const json_t *o, const char *key, int *v, char *err, size_t len)
{
    const json_t *x = json_object_get(o, key);
    if (x == NULL) {
        return 0;
    }
    if (!json_is_boolean(x)) {
        return bad(err, len, "\"%s\" must be true or false", key);
    }
    *v = json_is_true(x);
    return 0;
}

int lkv_request_parse(const char *line, const lkv_tokenizer *tok, const lkv_request_defaults *def,
                      const char *default_id, lkv_request *out, char *err, size_t len)
{
    init_request(out, def, default_id);
    json_error_t je;
    json_t *root = json_loads(line, JSON_REJECT_DUPLICATES, &je);
    int rc = 0;
    if (root == NULL) {
        return bad(err, len, "not valid JSON (column %d: %s)", je.column, je.text);
    }
    if (!json_is_object(root)) {
        rc = bad(err, len, "a request must be a JSON object");
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        int ok = 0;
        for (int i = 0; known_keys[i] != NULL && !ok; i++) {
            ok = strcmp(key, known_keys[i]) == 0;
        }
        if (!ok) {
            rc = bad(err, len,
                     "unknown key \"%s\" (keys: id, docs, question, max_tokens, temperature, "
                     "top_p, seed, stop, bos, mode, cache)",
                     key);
            goto out;
        }
    }
    const json_t *id = json_object_get(root, "id");
    if (id != NULL) {
        if (!json_is_string(id)) {
            rc = bad(err, len, "\"id\" must be a string");
            goto out;
        }
        snprintf(out->id, sizeof(out->id), "%s", json_string_value(id));
    }
    double d = 0;
    int r;
    if ((r = get_number(root, "max_tokens", 1, 1 << 22, &d, err, len)) < 0) {
        rc = r;
        goto out;
    } else if (r == 0) {
        if (d != (double)(int)d) {
            rc = bad(err, len, "\"max_tokens\" must be an integer");
            goto out;
        }
        out->rag.max_tokens = (int)d;
    }
    if ((r = get_number(root, "temperature", 0, 100, &d, err, len)) < 0) {
        rc = r;
        goto out;
    } else if (r == 0) {
        out->rag.sampling.temperature = (float)d;
    }
    if ((r = get_number(root, "top_p", 0, 1, &d, err, len)) < 0) {
        rc = r;
        goto out;
    } else if (r == 0) {
        out->rag.sampling.top_p = (float)d;
    }
    const json_t *seed = json_object_get(root, "seed");
    if (seed != NULL) {
        if (!json_is_integer(seed) || json_integer_value(seed) < 0) {
            rc = bad(err, len, "\"seed\" must be a non-negative integer");
            goto out;
        }
        out->rag.sampling.seed = (uint64_t)json_integer_value(seed);
    }
    int bos = 1, cache = 1;
    if ((rc = get_bool(root, "stop", &out->rag.stop_at_eos, err, len)) != 0 ||
        (rc = get_bool(root, "bos", &bos, err, len)) != 0 ||
        (rc = get_bool(root, "cache", &cache, err, len)) != 0) {
        goto out;
    }
    out->rag.no_cache = !cache;
    const json_t *mode = json_object_get(root, "mode");
    if (mode != NULL) {
        const char *m = json_is_string(mode) ? json_string_value(mode) : "";
        if (strcmp(m, "lazy") == 0) {
            out->rag.mode = LKV_RAG_LAZY;
        } else if (strcmp(m, "materialise") == 0 || strcmp(m, "materialize") == 0) {
            out->rag.mode = LKV_RAG_MATERIALISE;
        } else if (strcmp(m, "prefix") == 0) {
            out->rag.mode = LKV_RAG_PREFIX;
        } else {
            rc = bad(err, len, "\"mode\" must be \"lazy\", \"materialise\" or \"prefix\"");
            goto out;
        }
    }
    const json_t *docs = json_object_get(root, "docs");
    if (docs != NULL && !json_is_array(docs)) {
        rc = bad(err, len, "\"docs\" must be an array of documents");
        goto out;
    }
    size_t nd = docs != NULL ? json_array_size(docs) : 0;
    out->docs = lkv_xcalloc(nd ? nd : 1, sizeof(*out->docs));
    out->doc_tokens = lkv_xcalloc(nd ? nd : 1, sizeof(*out->doc_tokens));
    out->rag.n_docs = (int)nd;
    out->rag.docs = out->docs;
    for (size_t i = 0; i < nd; i++) {
        char what[32];
        snprintf(what, sizeof(what), "docs[%zu]", i);
        rc = segment_of(json_array_get(docs, i), tok, bos, what, &out->doc_tokens[i],
                        &out->docs[i].n_tokens, err, len);
        out->docs[i].tokens = out->doc_tokens[i];
        if (rc != 0) {
            goto out;
        }
    }
    const json_t *q = json_object_get(root, "question");
    if (q == NULL) {
        rc = bad(err, len, "\"question\" is missing");
        goto out;
    }
    rc = segment_of(q, tok, 0, "question", &out->question, &out->rag.n_question, err, len);
    out->rag.question = out->question;
out:
    json_decref(root);
    return rc;
}

int lkv_request_from_text(const char *const *docs, int n_docs, const char *question,
                          const lkv_tokenizer *tok, const lkv_request_defaults *def, const char *id,
                          lkv_request *out, char *err, size_t len)
{
    init_request(out, def, id);
    out->docs = lkv_xcalloc((size_t)(n_docs > 0 ? n_docs : 1), sizeof(*out->docs));
    out->doc_tokens = lkv_xcalloc((size_t)(n_docs > 0 ? n_docs : 1), sizeof(*out->doc_tokens));
    out->rag.n_docs = n_docs;
    out->rag.docs = out->docs;
    for (int i = 0; i < n_docs; i++) {
        char what[32];
        snprintf(what, sizeof(what), "document %d", i);
        int rc = lkv_request_encode(tok, docs[i], 1, what, &out->doc_tokens[i],
                                    &out->docs[i].n_tokens, err, len);
        out->docs[i].tokens = out->doc_tokens[i];
        if (rc != 0) {
            return rc;
        }
    }
    if (question == NULL) {
        return bad(err, len, "the question is missing");
    }
    int rc = lkv_request_encode(tok, question, 0, "question", &out->question, &out->rag.n_question,
                                err, len);
    out->rag.question = out->question;
    return rc;
}

const char *lkv_request_tier_name(int tier)
{
    switch (tier) {
    case LKV_WIRE_TIER_HOT:
        return "hot";
    case LKV_WIRE_TIER_COLD:
        return "cold";
    case LKV_WIRE_TIER_ABSENT:
        return "absent";
    default:
        return "local";
    }
}

char *lkv_result_json(const char *id, int rc, const lkv_rag_result *res, const char *msg)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(id));
    json_object_set_new(o, "ok", json_boolean(rc == 0));
    if (rc != 0) {
        const char *e = res != NULL && res->error[0] ? res->error : msg != NULL ? msg : "";
        json_object_set_new(o, "error", json_string(e));
        json_object_set_new(o, "code", json_string(lkv_err_name(rc)));
    } else {
        json_object_set_new(o, "text", json_string(res->text != NULL ? res->text : ""));
        json_t *t = json_array();
        for (int i = 0; i < res->n_out; i++) {
            json_array_append_new(t, json_integer(res->tokens[i]));
        }
        json_object_set_new(o, "tokens", t);
        json_object_set_new(o, "stop", json_string(res->stop_eos ? "eos" : "length"));
        json_object_set_new(o, "ttft_ms", json_real(res->ttft_ms));
        json_object_set_new(o, "tpot_ms", json_real(res->tpot_ms));
        json_object_set_new(o, "total_ms", json_real(res->total_ms));
        json_object_set_new(o, "lookup_ms", json_real(res->lookup_ms));
        json_object_set_new(o, "attach_ms", json_real(res->attach_ms));
        json_object_set_new(o, "miss_ms", json_real(res->miss_ms));
        json_object_set_new(o, "put_ms", json_real(res->put_ms));
        json_object_set_new(o, "n_prompt", json_integer(res->n_prompt));
        json_object_set_new(o, "hit_docs", json_integer(res->hit_docs));
        json_object_set_new(o, "miss_docs", json_integer(res->miss_docs));
        json_object_set_new(o, "hit_tokens", json_integer((json_int_t)res->hit_tokens));
        json_object_set_new(o, "miss_tokens", json_integer((json_int_t)res->miss_tokens));
        json_object_set_new(o, "zero_copy_blocks", json_integer((json_int_t)res->zero_copy_blocks));
        json_object_set_new(o, "local_only", json_boolean(res->local_only));
        json_object_set_new(o, "note", json_string(res->note));
        json_t *docs = json_array();
        for (int i = 0; i < res->n_docs; i++) {
            const lkv_rag_doc_result *d = &res->docs[i];
            json_t *x = json_object();
            json_object_set_new(x, "hit", json_boolean(d->hit));
            json_object_set_new(x, "tier", json_string(lkv_request_tier_name(d->tier)));
            json_object_set_new(x, "start", json_integer(d->start));
            json_object_set_new(x, "n_tokens", json_integer(d->n_tokens));
            json_object_set_new(x, "n_blocks", json_integer(d->n_blocks));
            json_object_set_new(x, "stored", json_integer(d->stored));
            json_object_set_new(x, "inplace", json_integer(d->inplace));
            json_object_set_new(x, "page0", json_integer((json_int_t)d->page0));
            if (d->page0 >= 0) {
                char h[17];
                snprintf(h, sizeof(h), "%016llx", (unsigned long long)d->pages_hash);
                json_object_set_new(x, "pages_hash", json_string(h));
            }
            if (d->kv_hash != 0) {
                /* The digest bytes in order (= Python's hashlib.blake2b(kv,
                 * digest_size=8).hexdigest()). */
                char h[17];
                const uint8_t *b = (const uint8_t *)&d->kv_hash;
                for (int k = 0; k < 8; k++) {
                    snprintf(h + 2 * k, 3, "%02x", b[k]);
                }
                json_object_set_new(x, "kv_hash", json_string(h));
            }
            json_object_set_new(x, "key", json_string(d->key_hex));
            json_array_append_new(docs, x);
        }
        json_object_set_new(o, "docs", docs);
    }
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (s == NULL) {
        lkv_panic("json_dumps: out of memory");
    }
    return s;
}

void lkv_result_text(FILE *f, const char *id, int rc, const lkv_rag_result *res, const char *msg)
{
    if (rc != 0) {
        fprintf(f, "[%s] error %s: %s\n", id, lkv_err_name(rc),
                res != NULL && res->error[0] ? res->error
                : msg != NULL                ? msg
                                             : "");
        return;
    }
    fprintf(f,
            "[%s] %d/%d documents hit (%" PRIu64 "/%" PRIu64
            " tokens), ttft %.2f ms, tpot %.3f ms, %d tokens%s\n",
            id, res->hit_docs, res->n_docs, res->hit_tokens, res->hit_tokens + res->miss_tokens,
            res->ttft_ms, res->tpot_ms, res->n_out, res->local_only ? " (local, no cache)" : "");
    for (int i = 0; i < res->n_docs; i++) {
        const lkv_rag_doc_result *d = &res->docs[i];
        fprintf(f, "  doc %d: %s (%s) at %" PRId64 ", %d tokens%s\n", i, d->hit ? "hit" : "miss",
                lkv_request_tier_name(d->tier), d->start, d->n_tokens,
                d->stored == 1  ? ", stored"
                : d->stored < 0 ? ", store failed"
                                : "");
    }
    if (res->note[0] != '\0') {
        fprintf(f, "  note: %s\n", res->note);
    }
    fprintf(f, "  text: %s\n", res->text != NULL ? res->text : "");
}
