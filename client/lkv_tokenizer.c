/*
 * lkv_tokenizer.c: llama2.c tokenizer, see lkv_tokenizer.h. Vocabularies are small (hundreds
 * to tens of thousands of tokens) and prompts short, so lookups are linear scans: simple and
 * fast enough for tests and the reference worker.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lkv_err.h"
#include "lkv_log.h"
#include "lkv_tokenizer.h"

void lkv_tokenizer_free(lkv_tokenizer *t)
{
    if (t->pieces != NULL) {
        for (int i = 0; i < t->vocab_size; i++) {
            free(t->pieces[i]);
        }
    }
    free(t->pieces);
    free(t->scores);
    memset(t, 0, sizeof *t);
}

int lkv_tokenizer_load(lkv_tokenizer *t, const char *path, int vocab_size)
{
    int rc = 0;
    memset(t, 0, sizeof *t);
    if (vocab_size < 259) {
        return LKV_EINVAL;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return LKV_EIO;
    }
    int32_t maxlen;
    if (fread(&maxlen, 4, 1, f) != 1) {
        rc = LKV_EIO;
        goto out;
    }
    if (maxlen < 1 || maxlen > 4096) {
        rc = LKV_ECORRUPT;
        goto out;
    }
    t->vocab_size = vocab_size;
    t->max_token_len = maxlen;
    t->pieces = lkv_xcalloc((size_t)vocab_size, sizeof(char *));
    t->scores = lkv_xcalloc((size_t)vocab_size, sizeof(float));
    for (int i = 0; i < vocab_size; i++) {
        int32_t len;
        if (fread(&t->scores[i], 4, 1, f) != 1 || fread(&len, 4, 1, f) != 1) {
            rc = LKV_EIO;
            goto out;
        }
        if (len < 0 || len > maxlen) {
            rc = LKV_ECORRUPT;
            goto out;
        }
        t->pieces[i] = lkv_xmalloc((size_t)len + 1);
        if (len > 0 && fread(t->pieces[i], (size_t)len, 1, f) != 1) {
            rc = LKV_EIO;
            goto out;
        }
        t->pieces[i][len] = '\0';
    }
    for (int b = 0; b < 256; b++) {
        t->bytes[b][0] = (char)b;
        t->bytes[b][1] = '\0';
    }
out:
    fclose(f);
    if (rc != 0) {
        lkv_tokenizer_free(t);
    }
    return rc;
}

static int lookup(const lkv_tokenizer *t, const char *s, size_t len)
{
    for (int i = 0; i < t->vocab_size; i++) {
        if (strlen(t->pieces[i]) == len && memcmp(t->pieces[i], s, len) == 0) {
            return i;
        }
    }
    return -1;
}

int lkv_tokenizer_encode(const lkv_tokenizer *t, const char *text, int bos, int *tokens, int cap,
                         int *n)
{
    int k = 0;
    *n = 0;
    size_t tl = strlen(text);
    /* Worst case: BOS, prefix, one token per byte. */
    if ((size_t)cap < tl + 2) {
        return LKV_ENOSPC;
    }
    if (bos) {
        tokens[k++] = LKV_TOK_BOS;
    }
    int first = k;
    if (tl > 0) {
        int sp = lookup(t, " ", 1);
        if (sp >= 0) {
            tokens[k++] = sp;
        }
    }
    for (size_t i = 0; i < tl;) {
        size_t len = 1;
        while (i + len < tl && len < 4 && ((unsigned char)text[i + len] & 0xc0u) == 0x80u) {
            len++;
        }
        int id = lookup(t, text + i, len);
        if (id >= 0) {
            tokens[k++] = id;
        } else {
            for (size_t b = 0; b < len; b++) {
                tokens[k++] = (unsigned char)text[i + b] + 3;
            }
        }
        i += len;
    }
    char *buf = lkv_xmalloc((size_t)t->max_token_len * 2 + 1);
    for (;;) {
        float best = -1e30f;
        int best_id = -1, best_i = -1;
        for (int i = first; i + 1 < k; i++) {
            size_t a = strlen(t->pieces[tokens[i]]), b = strlen(t->pieces[tokens[i + 1]]);
            if (a + b > (size_t)t->max_token_len) {
                continue;
            }
            memcpy(buf, t->pieces[tokens[i]], a);
            memcpy(buf + a, t->pieces[tokens[i + 1]], b);
            int id = lookup(t, buf, a + b);
            if (id >= 0 && t->scores[id] > best) {
                best = t->scores[id];
                best_id = id;
                best_i = i;
            }
        }
        if (best_i < 0) {
            break;
        }
        tokens[best_i] = best_id;
        memmove(tokens + best_i + 1, tokens + best_i + 2, (size_t)(k - best_i - 2) * sizeof(int));
        k--;
    }
    free(buf);
    *n = k;
    return 0;
}

const char *lkv_tokenizer_decode(const lkv_tokenizer *t, int prev, int token)
{
    if (token < 0 || token >= t->vocab_size) {
        return "";
    }
    const char *p = t->pieces[token];
    if (prev == LKV_TOK_BOS && p[0] == ' ') {
        p++;
    }
    unsigned int byte;
    if (sscanf(p, "<0x%02X>", &byte) == 1 && strlen(p) == 6) {
        return t->bytes[byte];
    }
    return p;
}
