/*
 * test_tenancy.c: the live tenant view (daemon/lkv_tenancy.c) without the RPC edge: slots stay
 * with their tenant's name across reloads that remove and re-add it; a reload publishes a new
 * table while earlier tenant pointers stay valid; what cannot change live (a salt, turning
 * tenants on or off) refuses the whole reload and changes nothing; per-tenant statistics are
 * registered once per slot with the tenant's name. (Admission, rates and quotas go through a
 * real daemon: integration.reload, integration.quota.)
 */
#include <stdlib.h>
#include <string.h>

#include "lkv_config.h"
#include "lkv_err.h"
#include "lkv_stats.h"
#include "lkv_tenancy.h"
#include "lkv_test.h"

#define HASH_A                                                                                     \
    "blake2b:"                                                                                     \
    "00000000000000000000000000000000000000000000000000000000000000a1"
#define HASH_B                                                                                     \
    "blake2b:"                                                                                     \
    "00000000000000000000000000000000000000000000000000000000000000b2"
#define HASH_C                                                                                     \
    "blake2b:"                                                                                     \
    "00000000000000000000000000000000000000000000000000000000000000c3"

static char dir[] = "/tmp/lkv-tenancy-test-XXXXXX";
static char err[LKV_CONFIG_ERR_MAX];

static void load(lkv_config *c, const char *text)
{
    lkv_config_defaults(c);
    char dd[128];
    snprintf(dd, sizeof(dd), "data_dir = %s\n", dir);
    char *full = malloc(strlen(text) + strlen(dd) + 1);
    strcpy(full, dd);
    strcat(full, text);
    if (lkv_config_load_string(c, full, "t.conf", err, sizeof(err)) != 0 ||
        lkv_config_validate(c, err, sizeof(err)) != 0) {
        LKV_FAIL("%s", err);
    }
    free(full);
}

static int slot_of(lkv_tenancy *t, const char *name)
{
    const lkv_tenant *tn = lkv_auth_find(lkv_tenancy_auth(t), name);
    return tn != NULL ? lkv_tenancy_index(t, tn) : -1;
}

typedef struct seen {
    int alice_hits, carol_docs, carol_all;
} seen;

static int visit(void *ctx, const lkv_stat_desc *d, double v)
{
    seen *s = ctx;
    (void)v;
    s->alice_hits += strcmp(d->name, "tenant_hits") == 0 && strstr(d->labels, "tenant=alice,");
    s->carol_docs += strcmp(d->name, "tenant_docs") == 0 && strcmp(d->labels, "tenant=carol") == 0;
    s->carol_all += strncmp(d->labels, "tenant=carol", 12) == 0;
    return 0;
}

static void test_slots_and_reload(void)
{
    static lkv_config c;
    lkv_stats *r;
    ASSERT_OK(lkv_stats_create(&r));
    load(&c, "[tenant alice]\ntoken_hash = " HASH_A "\nroles = data\n"
             "[tenant bob]\ntoken_hash = " HASH_B "\nroles = data\n");
    lkv_tenancy *t;
    ASSERT_OK(lkv_tenancy_create(&c, r, NULL, &t, err, sizeof(err)));
    ASSERT_EQ(lkv_tenancy_count(t), 2);
    ASSERT_EQ(lkv_tenancy_isolated(t), 1);
    int a = slot_of(t, "alice"), b = slot_of(t, "bob");
    ASSERT_TRUE(a >= 1 && b >= 1 && a != b);
    ASSERT_TRUE(strcmp(lkv_tenancy_names(t)[a], "alice") == 0);
    ASSERT_TRUE(strcmp(lkv_tenancy_names(t)[0], "default") == 0);
    ASSERT_EQ(lkv_tenancy_index(t, lkv_auth_default_tenant(lkv_tenancy_auth(t))), 0);
    ASSERT_EQ(lkv_tenancy_index(t, NULL), 0);
    ASSERT_EQ(lkv_tenancy_named(t), 3); /* default, alice, bob */
    int n0 = lkv_stats_count(r);
    const lkv_tenant *old_alice = lkv_auth_find(lkv_tenancy_auth(t), "alice");
    const lkv_auth *old_table = lkv_tenancy_auth(t);

    /* Alice removed, carol added: bob keeps his slot, carol gets a new one. */
    load(&c, "[tenant bob]\ntoken_hash = " HASH_B "\nroles = data,admin\n"
             "[tenant carol]\ntoken_hash = " HASH_C "\nroles = data\n");
    ASSERT_OK(lkv_tenancy_reload(t, &c, err, sizeof(err)));
    ASSERT_TRUE(lkv_tenancy_auth(t) != old_table);
    ASSERT_EQ(slot_of(t, "alice"), -1);
    ASSERT_EQ(slot_of(t, "bob"), b);
    int cs = slot_of(t, "carol");
    ASSERT_TRUE(cs != a && cs != b && cs >= 1);
    ASSERT_EQ(lkv_tenancy_named(t), 4);
    ASSERT_EQ(lkv_auth_find(lkv_tenancy_auth(t), "bob")->roles, LKV_ROLE_DATA | LKV_ROLE_ADMIN);
    /* A call admitted before still holds a valid tenant of the old table. */
    ASSERT_TRUE(strcmp(old_alice->name, "alice") == 0);
    ASSERT_EQ(lkv_tenancy_index(t, old_alice), a);
    seen s0 = {0};
    ASSERT_OK(lkv_stats_foreach(r, NULL, visit, &s0));
    ASSERT_TRUE(s0.carol_all > 0);
    ASSERT_EQ(lkv_stats_count(r), n0 + s0.carol_all); /* Carol's slot: one more group. */

    /* Alice back: her old slot (and counters). */
    load(&c, "[tenant alice]\ntoken_hash = " HASH_A "\nroles = data\n"
             "[tenant carol]\ntoken_hash = " HASH_C "\nroles = data\n");
    ASSERT_OK(lkv_tenancy_reload(t, &c, err, sizeof(err)));
    ASSERT_EQ(slot_of(t, "alice"), a);
    ASSERT_EQ(slot_of(t, "carol"), cs);
    ASSERT_EQ(lkv_stats_count(r), n0 + s0.carol_all); /* No new registration. */
    seen s = {0};
    ASSERT_OK(lkv_stats_foreach(r, NULL, visit, &s));
    ASSERT_EQ(s.alice_hits, 2); /* hot and cold, once. */
    ASSERT_EQ(s.carol_docs, 1);

    /* Refused reloads change nothing. */
    const lkv_auth *before = lkv_tenancy_auth(t);
    load(&c, "[tenant alice]\ntoken_hash = " HASH_A "\nroles = data\nsalt = "
             "abababababababababababababababababababababababababababababababab\n");
    ASSERT_ERR(lkv_tenancy_reload(t, &c, err, sizeof(err)), LKV_ECONFIG);
    ASSERT_TRUE(strstr(err, "salt") != NULL && strstr(err, "alice") != NULL);
    load(&c, "");
    ASSERT_ERR(lkv_tenancy_reload(t, &c, err, sizeof(err)), LKV_ECONFIG);
    ASSERT_TRUE(strstr(err, "restart") != NULL);
    /* A new tenant in a refused reload gets no slot name (no phantom in Stats). */
    load(&c, "[tenant dave]\ntoken_hash = " HASH_B "\nroles = data\n"
             "[tenant alice]\ntoken_hash = " HASH_A "\nroles = data\nsalt = "
             "abababababababababababababababababababababababababababababababab\n");
    ASSERT_ERR(lkv_tenancy_reload(t, &c, err, sizeof(err)), LKV_ECONFIG);
    for (int i = 0; i < LKV_TENANCY_SLOTS; i++) {
        const char *nm = lkv_tenancy_names(t)[i];
        ASSERT_TRUE(nm == NULL || strcmp(nm, "dave") != 0);
    }
    ASSERT_TRUE(lkv_tenancy_auth(t) == before);
    ASSERT_EQ(lkv_tenancy_named(t), 4); /* dave was never named. */
    ASSERT_EQ(slot_of(t, "alice"), a);
    lkv_tenancy_destroy(t);
    ASSERT_EQ(lkv_stats_count(r), 0);
    lkv_stats_destroy(r);
}

static void test_without_tenants(void)
{
    static lkv_config c;
    load(&c, "");
    lkv_tenancy *t;
    ASSERT_OK(lkv_tenancy_create(&c, NULL, NULL, &t, err, sizeof(err)));
    ASSERT_EQ(lkv_tenancy_isolated(t), 0);
    ASSERT_EQ(lkv_tenancy_count(t), 0);
    load(&c, "[tenant alice]\ntoken_hash = " HASH_A "\nroles = data\n");
    ASSERT_ERR(lkv_tenancy_reload(t, &c, err, sizeof(err)), LKV_ECONFIG);
    ASSERT_TRUE(strstr(err, "without") != NULL);
    load(&c, "loopback_roles = data\n");
    ASSERT_OK(lkv_tenancy_reload(t, &c, err, sizeof(err)));
    ASSERT_EQ(lkv_auth_default_tenant(lkv_tenancy_auth(t))->roles, LKV_ROLE_DATA);
    lkv_tenancy_destroy(t);
}

int main(void)
{
    if (mkdtemp(dir) == NULL) {
        return 1;
    }
    LKV_RUN(test_slots_and_reload);
    LKV_RUN(test_without_tenants);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : 1;
}
