/*
 * test_client.c: client.client. The parts of the client library that need no daemon:
 * key hex helpers, option checks, and calls to an address where nothing listens (LKV_EUNAVAIL /
 * LKV_ETIMEDOUT with a message, within the deadline). The status table is tested in
 * tests/proto/test_status.c.
 */
#include <string.h>
#include <time.h>

#include "lkv_client.h"
#include "lkv_test.h"

static void test_hex(void)
{
    uint8_t k[LKV_KEY_BYTES], k2[LKV_KEY_BYTES];
    for (int i = 0; i < LKV_KEY_BYTES; i++) {
        k[i] = (uint8_t)(i * 37 + 1);
    }
    char hex[65];
    lkv_key_to_hex(k, hex);
    ASSERT_EQ(strlen(hex), 64);
    ASSERT_OK(lkv_key_from_hex(hex, k2));
    ASSERT_TRUE(memcmp(k, k2, sizeof(k)) == 0);
    hex[5] = 'g';
    ASSERT_ERR(lkv_key_from_hex(hex, k2), LKV_EINVAL);
    ASSERT_ERR(lkv_key_from_hex("abcd", k2), LKV_EINVAL);
}

static void test_options(void)
{
    lkv_client_t *c = NULL;
    ASSERT_ERR(lkv_client_create("", NULL, &c), LKV_EINVAL);
    ASSERT_TRUE(lkv_client_last_error()[0] != '\0');
    ASSERT_EQ(lkv_client_last_status(), -1);
    lkv_client_options o = {0};
    o.bearer_token = "a\nb";
    ASSERT_ERR(lkv_client_create("127.0.0.1:1", &o, &c), LKV_EINVAL);
    o.bearer_token = "secret";
    ASSERT_OK(lkv_client_create("127.0.0.1:1", &o, &c));
    ASSERT_ERR(lkv_client_lookup(c, NULL, 0, 0, NULL), LKV_EINVAL);
    lkv_client_destroy(c);
}

static void test_unreachable(void)
{
    lkv_client_options o = {0};
    o.default_deadline_ms = 3000;
    lkv_client_t *c = NULL;
    ASSERT_OK(lkv_client_create("127.0.0.1:1", &o, &c));
    time_t t0 = time(NULL);
    int rc = lkv_client_ping(c, "", 0);
    ASSERT_TRUE(rc == LKV_EUNAVAIL || rc == LKV_ETIMEDOUT);
    ASSERT_TRUE(lkv_client_last_status() == 14 || lkv_client_last_status() == 4);
    ASSERT_TRUE(lkv_client_last_error()[0] != '\0');
    lkv_put_t *p = NULL;
    uint32_t tok[3] = {1, 2, 3};
    uint8_t blk[64] = {0};
    ASSERT_OK(lkv_client_put_begin(c, "x", tok, 3, 1, 0, &p));
    int r1 = lkv_put_block(p, 0, blk, sizeof(blk));
    int r2 = lkv_put_finish(p, NULL);
    ASSERT_TRUE(r1 == 0 || r1 == LKV_EUNAVAIL || r1 == LKV_ETIMEDOUT);
    ASSERT_TRUE(r2 == LKV_EUNAVAIL || r2 == LKV_ETIMEDOUT);
    ASSERT_TRUE(time(NULL) - t0 < 20);
    lkv_client_destroy(c);
}

/* Admin and lease calls: bad arguments are refused locally (status -1, nothing sent); an
 * unreachable daemon is LKV_EUNAVAIL / LKV_ETIMEDOUT, and out-parameters are left empty. */
static void test_admin_lease_args(void)
{
    lkv_client_options o = {0};
    o.default_deadline_ms = 3000;
    lkv_client_t *c = NULL;
    ASSERT_OK(lkv_client_create("127.0.0.1:1", &o, &c));
    lkv_lease l;
    ASSERT_ERR(lkv_client_attach(c, NULL, 0, NULL, 1000, 0, &l), LKV_EINVAL);
    ASSERT_EQ(lkv_client_last_status(), -1);
    ASSERT_TRUE(l.docs == NULL && l.n_docs == 0);
    lkv_docref bad = {NULL, NULL, NULL, 0}; /* Neither a key nor a profile. */
    ASSERT_ERR(lkv_client_attach(c, &bad, 1, NULL, 1000, 0, &l), LKV_EINVAL);
    ASSERT_ERR(lkv_client_evict(c, NULL, 0), LKV_EINVAL);
    ASSERT_ERR(lkv_client_release(c, NULL, 0, NULL), LKV_EINVAL);
    lkv_lease_free(NULL);
    lkv_lease_free(&l);

    uint8_t key[LKV_KEY_BYTES] = {1}, id[LKV_LEASE_ID_BYTES] = {2}, next[LKV_KEY_BYTES];
    lkv_doc_status *docs = (lkv_doc_status *)&key; /* Must be reset to NULL. */
    size_t n = 7;
    int more = 1;
    lkv_list_filter f = {"itest", LKV_WIRE_TIER_HOT, 5, key};
    int rc = lkv_client_list(c, &f, 0, &docs, &n, next, &more);
    ASSERT_TRUE(rc == LKV_EUNAVAIL || rc == LKV_ETIMEDOUT);
    ASSERT_TRUE(docs == NULL && n == 0 && more == 0);
    rc = lkv_client_evict(c, key, 0);
    ASSERT_TRUE(rc == LKV_EUNAVAIL || rc == LKV_ETIMEDOUT);
    lkv_docref ref = {key, NULL, NULL, 0};
    rc = lkv_client_attach(c, &ref, 1, id, 1000, 0, &l);
    ASSERT_TRUE(rc == LKV_EUNAVAIL || rc == LKV_ETIMEDOUT);
    ASSERT_TRUE(l.docs == NULL);
    rc = lkv_client_release(c, id, 0, NULL);
    ASSERT_TRUE(rc == LKV_EUNAVAIL || rc == LKV_ETIMEDOUT);
    lkv_client_destroy(c);
}

int main(void)
{
    LKV_RUN(test_hex);
    LKV_RUN(test_options);
    LKV_RUN(test_unreachable);
    LKV_RUN(test_admin_lease_args);
    return 0;
}
