/*
 * lkv_store_index.c: the block store's document index (internals in lkv_store_int.h).
 *
 * Four structures, all metadata, all under the store lock:
 *   slots   the slot table: every doc the store knows, by slot number, with a free stack;
 *           a doc's slot never changes while it lives (dead docs keep theirs while held).
 *   kidx    the key index: a chained hash (links through doc.next) on the key's hash64,
 *           holding COMMITTING and VISIBLE docs; at most one doc per key. Grows by doubling.
 *   cidx    the content index: the same on the content hash (doc.cnext), VISIBLE docs only,
 *           so a token lookup that misses can tell "stored under another profile".
 *   gone    a ring of the last gone_cap evicted or deleted key hashes (FIFO overwrite) with a
 *           chained hash on top (2 * cap buckets at least), so a miss can say why.
 * Nothing here touches the arena, RocksDB or the policies.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "lkv_store_int.h"

void lkv__index_init(lkv_store *s, uint32_t gone_cap)
{
    s->kmask = 1023;
    s->kidx = lkv_xmalloc(sizeof(uint32_t) * 1024);
    memset(s->kidx, 0xff, sizeof(uint32_t) * 1024);
    s->cmask = 1023;
    s->cidx = lkv_xmalloc(sizeof(uint32_t) * 1024);
    memset(s->cidx, 0xff, sizeof(uint32_t) * 1024);
    s->gone_cap = gone_cap;
    s->gone = lkv_xcalloc(s->gone_cap, sizeof(gone_ent));
    uint32_t nb = 1;
    while (nb < 2 * s->gone_cap) {
        nb *= 2;
    }
    s->gone_bmask = nb - 1;
    s->gone_b = lkv_xmalloc(sizeof(uint32_t) * nb);
    memset(s->gone_b, 0xff, sizeof(uint32_t) * nb);
}

void lkv__index_free(lkv_store *s)
{
    for (uint32_t i = 0; i < s->n_slots; i++) {
        doc *d = s->slots[i];
        if (d != NULL) {
            free(d->tokens);
            free(d->pages);
            free(d);
        }
    }
    free(s->slots);
    free(s->free_slots);
    free(s->kidx);
    free(s->cidx);
    free(s->gone);
    free(s->gone_b);
}

doc *lkv__slot_new(lkv_store *s)
{
    uint32_t id;
    if (s->n_free_slots > 0) {
        id = s->free_slots[--s->n_free_slots];
    } else {
        if (s->n_slots == s->cap_slots) {
            s->cap_slots = s->cap_slots ? s->cap_slots * 2 : 256;
            s->slots = lkv_xrealloc(s->slots, sizeof(doc *) * s->cap_slots);
        }
        id = s->n_slots++;
    }
    doc *d = lkv_xcalloc(1, sizeof *d);
    d->slot = id;
    d->next = d->cnext = d->qnext = NIL;
    d->profile = -1;
    s->slots[id] = d;
    return d;
}

void lkv__slot_free(lkv_store *s, doc *d)
{
    assert(!d->hot && !d->cold && !d->indexed && !d->cindexed && d->refs == 0 && !d->queued);
    s->slots[d->slot] = NULL;
    if (s->n_free_slots == s->cap_free_slots) {
        s->cap_free_slots = s->cap_free_slots ? s->cap_free_slots * 2 : 256;
        s->free_slots = lkv_xrealloc(s->free_slots, sizeof(uint32_t) * s->cap_free_slots);
    }
    s->free_slots[s->n_free_slots++] = d->slot;
    free(d->tokens);
    free(d->pages);
    free(d);
}

static void kidx_link(lkv_store *s, doc *d)
{
    uint32_t b = (uint32_t)lkv_dockey_hash64(&d->key) & s->kmask;
    d->next = s->kidx[b];
    s->kidx[b] = d->slot;
}

void lkv__kidx_insert(lkv_store *s, doc *d)
{
    assert(!d->indexed);
    if (s->kcount + 1 > s->kmask + 1) {
        uint32_t nb = (s->kmask + 1) * 2;
        free(s->kidx);
        s->kidx = lkv_xmalloc(sizeof(uint32_t) * nb);
        memset(s->kidx, 0xff, sizeof(uint32_t) * nb);
        s->kmask = nb - 1;
        for (uint32_t i = 0; i < s->n_slots; i++) {
            if (s->slots[i] != NULL && s->slots[i]->indexed) {
                kidx_link(s, s->slots[i]);
            }
        }
    }
    kidx_link(s, d);
    d->indexed = 1;
    s->kcount++;
}

void lkv__kidx_remove(lkv_store *s, doc *d)
{
    assert(d->indexed);
    uint32_t *p = &s->kidx[(uint32_t)lkv_dockey_hash64(&d->key) & s->kmask];
    while (*p != d->slot) {
        assert(*p != NIL);
        p = &s->slots[*p]->next;
    }
    *p = d->next;
    d->next = NIL;
    d->indexed = 0;
    s->kcount--;
}

doc *lkv__kidx_find(lkv_store *s, const lkv_dockey *k)
{
    for (uint32_t i = s->kidx[(uint32_t)lkv_dockey_hash64(k) & s->kmask]; i != NIL;
         i = s->slots[i]->next) {
        if (memcmp(s->slots[i]->key.b, k->b, LKV_DOCKEY_BYTES) == 0) {
            return s->slots[i];
        }
    }
    return NULL;
}

doc *lkv__pid_find(lkv_store *s, uint64_t pid)
{
    if (pid & STAGE_BIT) {
        uint64_t slot = pid & ~STAGE_BIT;
        return slot < s->n_slots ? s->slots[slot] : NULL;
    }
    for (uint32_t i = s->kidx[(uint32_t)pid & s->kmask]; i != NIL; i = s->slots[i]->next) {
        if (s->slots[i]->pid == pid) {
            return s->slots[i];
        }
    }
    return NULL;
}

static void cidx_link(lkv_store *s, doc *d)
{
    uint32_t b = (uint32_t)d->content_hash & s->cmask;
    d->cnext = s->cidx[b];
    s->cidx[b] = d->slot;
}

void lkv__cidx_insert(lkv_store *s, doc *d)
{
    assert(!d->cindexed);
    if (s->ccount + 1 > s->cmask + 1) {
        uint32_t nb = (s->cmask + 1) * 2;
        free(s->cidx);
        s->cidx = lkv_xmalloc(sizeof(uint32_t) * nb);
        memset(s->cidx, 0xff, sizeof(uint32_t) * nb);
        s->cmask = nb - 1;
        for (uint32_t i = 0; i < s->n_slots; i++) {
            if (s->slots[i] != NULL && s->slots[i]->cindexed) {
                cidx_link(s, s->slots[i]);
            }
        }
    }
    cidx_link(s, d);
    d->cindexed = 1;
    s->ccount++;
}

void lkv__cidx_remove(lkv_store *s, doc *d)
{
    assert(d->cindexed);
    uint32_t *p = &s->cidx[(uint32_t)d->content_hash & s->cmask];
    while (*p != d->slot) {
        assert(*p != NIL);
        p = &s->slots[*p]->cnext;
    }
    *p = d->cnext;
    d->cnext = NIL;
    d->cindexed = 0;
    s->ccount--;
}

int lkv__cidx_has(lkv_store *s, uint64_t h)
{
    for (uint32_t i = s->cidx[(uint32_t)h & s->cmask]; i != NIL; i = s->slots[i]->cnext) {
        if (s->slots[i]->content_hash == h) {
            return 1;
        }
    }
    return 0;
}

/* Remembers key k as gone for cause. */
void lkv__gone_add(lkv_store *s, const lkv_dockey *k, int cause)
{
    gone_ent *e = &s->gone[s->gone_pos];
    if (e->used) {
        uint32_t *p = &s->gone_b[(uint32_t)e->h & s->gone_bmask];
        while (*p != s->gone_pos) {
            assert(*p != NIL);
            p = &s->gone[*p].next;
        }
        *p = e->next;
    }
    e->h = lkv_dockey_hash64(k);
    e->cause = (uint8_t)cause;
    e->used = 1;
    uint32_t b = (uint32_t)e->h & s->gone_bmask;
    e->next = s->gone_b[b];
    s->gone_b[b] = s->gone_pos;
    s->gone_pos = (s->gone_pos + 1) % s->gone_cap;
}

/* Returns the remembered cause of k, or LKV_MISS_NEVER. */
int lkv__gone_find(lkv_store *s, const lkv_dockey *k)
{
    uint64_t h = lkv_dockey_hash64(k);
    for (uint32_t i = s->gone_b[(uint32_t)h & s->gone_bmask]; i != NIL; i = s->gone[i].next) {
        if (s->gone[i].h == h) {
            return s->gone[i].cause;
        }
    }
    return LKV_MISS_NEVER;
}
