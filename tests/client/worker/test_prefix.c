/*
 * test_prefix.c: client.worker.prefix. The prefix cache's pool (client/worker/lkv_prefix.c):
 * block names are a chain (a name depends on every token before it, on the block boundaries and
 * on where documents start), the pool hands out each of its pages to one block at a time and only
 * its own pages, a pinned block is never evicted and is always found, a full pinned pool refuses
 * (changing nothing), remove frees only unpinned blocks, a pending block (admitted, KV not yet
 * written) is not found until it is ready, and over 200,000 random operations the
 * LRU pool evicts exactly what a naive LRU model (recency = when a block was last unpinned)
 * evicts, with every page in use by one block only.
 */
#include <stdlib.h>

#include "lkv_policy.h"
#include "lkv_prefix.h"
#include "lkv_test.h"

static void test_chain(void)
{
    int a[] = {5, 6, 7, 8}, b[] = {5, 6, 7, 9};
    uint64_t h0 = LKV_PREFIX_CHAIN0;
    uint64_t x = lkv_prefix_chain(h0, a, 4, 1);
    ASSERT_EQ(x, lkv_prefix_chain(h0, a, 4, 1)); /* Deterministic. */
    ASSERT_TRUE(x != lkv_prefix_chain(h0, b, 4, 1));
    ASSERT_TRUE(x != lkv_prefix_chain(h0, a, 4, 0)); /* Opening a document or not. */
    ASSERT_TRUE(x != lkv_prefix_chain(h0, a, 3, 1)); /* Length. */
    /* The same block after different prefixes has different names. */
    uint64_t p1 = lkv_prefix_chain(h0, a, 4, 1), p2 = lkv_prefix_chain(h0, b, 4, 1);
    ASSERT_TRUE(lkv_prefix_chain(p1, a, 4, 0) != lkv_prefix_chain(p2, a, 4, 0));
    /* [5 6][7] and [5][6 7] differ. */
    uint64_t s1 = lkv_prefix_chain(lkv_prefix_chain(h0, a, 2, 1), a + 2, 1, 0);
    uint64_t s2 = lkv_prefix_chain(lkv_prefix_chain(h0, a, 1, 1), a + 1, 2, 0);
    ASSERT_TRUE(s1 != s2);
    /* Never 0 (0 marks an empty slot). */
    for (int i = 0; i < 100000; i++) {
        int t = i;
        ASSERT_TRUE(lkv_prefix_chain((uint64_t)i * 0x9e37u, &t, 1, i & 1) != 0);
    }
}

static void test_pool(void)
{
    lkv_prefix *p;
    ASSERT_ERR(lkv_prefix_create(LKV_POLICY_LRU, 0, 0, 4096, &p), LKV_EINVAL);
    ASSERT_OK(lkv_prefix_create(LKV_POLICY_LRU, 100, 4, 4096, &p));
    uint32_t pg[6], seen = 0;
    for (uint64_t h = 1; h <= 4; h++) {
        ASSERT_OK(lkv_prefix_put(p, h * 11, &pg[h]));
        ASSERT_OK(lkv_prefix_ready(p, h * 11));
        ASSERT_TRUE(pg[h] >= 100 && pg[h] < 104);
        ASSERT_TRUE((seen & (1u << (pg[h] - 100))) == 0);
        seen |= 1u << (pg[h] - 100);
    }
    ASSERT_ERR(lkv_prefix_put(p, 22, &pg[0]), LKV_EEXIST);
    /* All pinned: no room, nothing changes. */
    ASSERT_ERR(lkv_prefix_put(p, 55, &pg[5]), LKV_ENOSPC);
    lkv_prefix_stats st;
    lkv_prefix_stats_get(p, &st);
    ASSERT_EQ(st.blocks, 4);
    ASSERT_EQ(st.pinned, 4);
    ASSERT_EQ(st.refused, 1);
    ASSERT_EQ(st.bytes_used, 4 * 4096);
    /* Found blocks are pinned again; each pin needs its unpin. */
    uint32_t q;
    ASSERT_EQ(lkv_prefix_get(p, 33, &q), 1);
    ASSERT_EQ(q, pg[3]);
    ASSERT_EQ(lkv_prefix_get(p, 99, &q), 0);
    ASSERT_OK(lkv_prefix_unpin(p, 33));
    ASSERT_OK(lkv_prefix_unpin(p, 33));
    ASSERT_ERR(lkv_prefix_unpin(p, 33), LKV_EINVAL);
    ASSERT_ERR(lkv_prefix_unpin(p, 99), LKV_ENOTFOUND);
    ASSERT_OK(lkv_prefix_unpin(p, 11));
    /* 33 was released before 11: the LRU victim is 33. */
    ASSERT_OK(lkv_prefix_put(p, 55, &pg[5]));
    ASSERT_EQ(pg[5], pg[3]); /* 33's page, reused. */
    /* 55 is pending (its KV not written yet): a lookup misses it, a second put says EEXIST,
     * ready makes it found. */
    ASSERT_EQ(lkv_prefix_get(p, 55, &q), 0);
    ASSERT_ERR(lkv_prefix_put(p, 55, &q), LKV_EEXIST);
    ASSERT_ERR(lkv_prefix_ready(p, 77), LKV_ENOTFOUND);
    ASSERT_OK(lkv_prefix_ready(p, 55));
    ASSERT_EQ(lkv_prefix_get(p, 55, &q), 1);
    ASSERT_EQ(q, pg[5]);
    ASSERT_OK(lkv_prefix_unpin(p, 55));
    ASSERT_EQ(lkv_prefix_get(p, 33, &q), 0);
    ASSERT_EQ(lkv_prefix_get(p, 11, &q), 1); /* Still there (pinned again now). */
    /* Remove: only unpinned blocks. */
    ASSERT_ERR(lkv_prefix_remove(p, 11), LKV_EBUSY);
    ASSERT_OK(lkv_prefix_unpin(p, 11));
    ASSERT_OK(lkv_prefix_remove(p, 11));
    ASSERT_ERR(lkv_prefix_remove(p, 11), LKV_ENOTFOUND);
    ASSERT_EQ(lkv_prefix_get(p, 11, &q), 0);
    ASSERT_OK(lkv_prefix_put(p, 66, &q));
    ASSERT_EQ(q, pg[1]); /* The removed block's page. */
    /* A pending block never written (its request failed) is removed like any other. */
    ASSERT_OK(lkv_prefix_unpin(p, 66));
    ASSERT_OK(lkv_prefix_remove(p, 66));
    ASSERT_OK(lkv_prefix_put(p, 66, &q));
    ASSERT_OK(lkv_prefix_ready(p, 66));
    lkv_prefix_stats_get(p, &st);
    ASSERT_EQ(st.blocks, 4);
    ASSERT_EQ(st.evictions, 1);
    lkv_prefix_destroy(p);
}

/* The naive model: NB ids, present/pins/released-at. */
#define NIDS  64
#define PAGES 12

typedef struct model {
    int present[NIDS];
    int pins[NIDS];
    uint64_t released[NIDS]; /* Time of the last unpin to zero (or admission). */
    uint32_t page[NIDS];
} model;

static void test_random(void)
{
    lkv_prefix *p;
    ASSERT_OK(lkv_prefix_create(LKV_POLICY_LRU, 7, PAGES, 1000, &p));
    model m;
    memset(&m, 0, sizeof(m));
    uint64_t clock = 1, rng = 12345;
    for (int op = 0; op < 200000; op++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t r = (uint32_t)(rng >> 33);
        int id = (int)(r % NIDS);
        uint64_t h = (uint64_t)id * 0x1000193u + 1;
        int what = (int)((r >> 8) % 3);
        uint32_t pg;
        if (what == 0) { /* get */
            int f = lkv_prefix_get(p, h, &pg);
            ASSERT_EQ(f, m.present[id]);
            if (f) {
                ASSERT_EQ(pg, m.page[id]);
                m.pins[id]++;
            }
        } else if (what == 1 && !m.present[id]) { /* put */
            int n = 0, victim = -1;
            for (int i = 0; i < NIDS; i++) {
                n += m.present[i];
                if (m.present[i] && m.pins[i] == 0 &&
                    (victim < 0 || m.released[i] < m.released[victim])) {
                    victim = i;
                }
            }
            int rc = lkv_prefix_put(p, h, &pg);
            if (n == PAGES && victim < 0) {
                ASSERT_EQ(rc, LKV_ENOSPC);
                continue;
            }
            ASSERT_OK(rc);
            ASSERT_OK(lkv_prefix_ready(p, h));
            if (n == PAGES) {
                ASSERT_EQ(pg, m.page[victim]); /* The LRU victim's page. */
                m.present[victim] = 0;
            }
            ASSERT_TRUE(pg >= 7 && pg < 7 + PAGES);
            for (int i = 0; i < NIDS; i++) {
                ASSERT_TRUE(!m.present[i] || m.page[i] != pg); /* One block a page. */
            }
            m.present[id] = 1;
            m.pins[id] = 1;
            m.page[id] = pg;
        } else if (m.present[id] && m.pins[id] > 0) { /* unpin */
            ASSERT_OK(lkv_prefix_unpin(p, h));
            if (--m.pins[id] == 0) {
                m.released[id] = clock++;
            }
        }
    }
    lkv_prefix_stats st;
    lkv_prefix_stats_get(p, &st);
    int n = 0, pinned = 0;
    for (int i = 0; i < NIDS; i++) {
        n += m.present[i];
        pinned += m.present[i] && m.pins[i] > 0;
    }
    ASSERT_EQ(st.blocks, (uint64_t)n);
    ASSERT_EQ(st.pinned, (uint64_t)pinned);
    ASSERT_TRUE(st.evictions > 1000);
    lkv_prefix_destroy(p);
}

int main(void)
{
    LKV_RUN(test_chain);
    LKV_RUN(test_pool);
    LKV_RUN(test_random);
    return 0;
}
