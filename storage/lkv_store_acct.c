/*
 * lkv_store_acct.c: per-tenant usage accounts of the store (lkv_store_usage_get; issue 13's
 * quotas). One account per salt that put a document since open, in a table of at most
 * LKV_STORE_ACCOUNTS entries (a salt beyond that is not accounted: account 0, "none").
 *
 * Each doc names its account (doc.acct, set by lkv_store_put_begin) and remembers in doc.acct_on
 * which of its parts the account holds: ACCT_HOT (n_blocks arena pages), ACCT_COLD (payload in
 * RocksDB), ACCT_DOC (one visible document). lkv__acct_sync(s, d) brings the account in line with
 * the doc's flags and state, so the tier engine calls it after every change of d->hot, d->cold or
 * d->state, and a missed call is corrected by the next one. Invariant (under s->mu): an
 * account's counters are the sums over the docs naming it of the parts in their acct_on.
 *
 * Limitation: RocksDB records do not carry the salt, so documents recovered from the cold tier
 * at open belong to no account until they are put again.
 */
#include <string.h>

#include "lkv_store_int.h"

enum { ACCT_HOT = 1, ACCT_COLD = 2, ACCT_DOC = 4 };

struct lkv__acct {
    uint8_t salt[LKV_SALT_BYTES]; /* The tenant's salt. */
    uint64_t hot_bytes;           /* Arena bytes of its hot docs (live or dead but pinned). */
    uint64_t cold_bytes;          /* Payload bytes of its docs in the cold tier. */
    uint64_t docs;                /* Its visible docs. */
};

/* Account of salt (1-based), created if new; 0 if the table is full. Lock held. */
uint16_t lkv__acct_of(lkv_store *s, const uint8_t salt[LKV_SALT_BYTES])
{
    for (uint32_t i = 0; i < s->n_accts; i++) {
        if (memcmp(s->accts[i].salt, salt, LKV_SALT_BYTES) == 0) {
            return (uint16_t)(i + 1);
        }
    }
    if (s->n_accts == LKV_STORE_ACCOUNTS) {
        return 0;
    }
    if (s->accts == NULL) {
        s->accts = lkv_xcalloc(LKV_STORE_ACCOUNTS, sizeof(*s->accts));
    }
    memcpy(s->accts[s->n_accts].salt, salt, LKV_SALT_BYTES);
    return (uint16_t)(++s->n_accts);
}

/* When d was last read (Get, Attach, pin), else created: the quota's recency. */
static int64_t last_use(const doc *d)
{
    return d->used_ms > d->created_ms ? d->used_ms : d->created_ms;
}

void lkv__acct_sync(lkv_store *s, doc *d)
{
    if (d->acct == 0) {
        return;
    }
    lkv__acct *a = &s->accts[d->acct - 1];
    unsigned want = (d->hot ? ACCT_HOT : 0) | (d->cold ? ACCT_COLD : 0) |
                    (d->state == ST_VISIBLE ? ACCT_DOC : 0);
    unsigned have = d->acct_on;
    if ((want ^ have) & ACCT_HOT) {
        a->hot_bytes = want & ACCT_HOT ? a->hot_bytes + lkv__hot_bytes(s, d)
                                       : a->hot_bytes - lkv__hot_bytes(s, d);
    }
    if ((want ^ have) & ACCT_COLD) {
        a->cold_bytes = want & ACCT_COLD ? a->cold_bytes + lkv__cold_bytes(d)
                                         : a->cold_bytes - lkv__cold_bytes(d);
    }
    if ((want ^ have) & ACCT_DOC) {
        a->docs = want & ACCT_DOC ? a->docs + 1 : a->docs - 1;
    }
    d->acct_on = (uint8_t)want;
}

void lkv__acct_free(lkv_store *s)
{
    free(s->accts);
    s->accts = NULL;
    s->n_accts = 0;
}

void lkv_store_usage_get(lkv_store *s, const uint8_t salt[LKV_SALT_BYTES], lkv_store_usage *out)
{
    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&s->mu);
    out->page_bytes = s->page_bytes;
    for (uint32_t i = 0; i < s->n_accts; i++) {
        if (memcmp(s->accts[i].salt, salt, LKV_SALT_BYTES) == 0) {
            out->hot_bytes = s->accts[i].hot_bytes;
            out->cold_bytes = s->accts[i].cold_bytes;
            out->docs = s->accts[i].docs;
            out->accounted = 1;
        }
    }
    pthread_mutex_unlock(&s->mu);
}

int lkv_store_usage_oldest(lkv_store *s, const uint8_t salt[LKV_SALT_BYTES], int tier,
                           lkv_dockey *out)
{
    int rc = LKV_ENOTFOUND;
    pthread_mutex_lock(&s->mu);
    uint16_t acct = 0;
    for (uint32_t i = 0; i < s->n_accts && acct == 0; i++) {
        if (memcmp(s->accts[i].salt, salt, LKV_SALT_BYTES) == 0) {
            acct = (uint16_t)(i + 1);
        }
    }
    const doc *best = NULL;
    for (uint32_t i = 0; acct != 0 && i < s->n_slots; i++) {
        const doc *d = s->slots[i];
        if (d == NULL || d->acct != acct || d->state != ST_VISIBLE) {
            continue;
        }
        int ok = tier == LKV_TIER_HOT ? d->hot && d->hot_pins == 0 && !d->promoting
                                      : d->hot_pins == 0 && d->cold_pins == 0 && !d->promoting;
        /* Hot: documents already persisted first (demoting them frees pages, no write). */
        int rank = tier == LKV_TIER_HOT && d->cold && !d->cold_busy;
        int best_rank = best != NULL && tier == LKV_TIER_HOT && best->cold && !best->cold_busy;
        if (ok && (best == NULL || rank > best_rank ||
                   (rank == best_rank && last_use(d) < last_use(best)))) {
            best = d;
        }
    }
    if (best != NULL) {
        *out = best->key;
        rc = 0;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}
