/*
 * fuzz_config.c: libFuzzer target for lazykvd's configuration (daemon/lkv_config.c). The first
 * input byte picks the entry point: even, the config file parser (lkv_config_load_string on
 * the rest, then lkv_config_validate, as --config does); odd, the command line
 * (lkv_config_from_args on the rest split at newlines into argv). Every path must end in 0 or
 * LKV_ECONFIG with a NUL-terminated message; a failed set must leave the config as it was.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "lkv_config.h"
#include "lkv_err.h"
#include "lkv_log.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    lkv_log_set_level(LKV_LOG_ERROR);
    return 0;
}

static lkv_config cfg, before;

static void check_rc(int rc, const char *err)
{
    if (rc != 0 && rc != LKV_ECONFIG) {
        abort(); /* Only LKV_ECONFIG is documented. */
    }
    if (rc != 0 && (memchr(err, '\0', LKV_CONFIG_ERR_MAX) == NULL || err[0] == '\0')) {
        abort(); /* An error without a message. */
    }
}

/* 1 if a and b hold the same configuration: every field, and the profile and tenant entries in
 * use (slots past n_profiles / n_tenants are scratch a refused set may have touched). */
static int same(const lkv_config *a, const lkv_config *b)
{
    const char *pa = (const char *)a, *pb = (const char *)b;
    size_t p0 = offsetof(lkv_config, profiles), s0 = offsetof(lkv_config, source);
    size_t t0 = offsetof(lkv_config, tenants), m0 = offsetof(lkv_config, max_leases);
    return memcmp(pa, pb, p0) == 0 &&
           memcmp(a->profiles, b->profiles, (size_t)a->n_profiles * sizeof(a->profiles[0])) == 0 &&
           memcmp(pa + s0, pb + s0, t0 - s0) == 0 &&
           memcmp(a->tenants, b->tenants, (size_t)a->n_tenants * sizeof(a->tenants[0])) == 0 &&
           memcmp(pa + m0, pb + m0, sizeof(*a) - m0) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 1 << 16) {
        return 0;
    }
    char *text = malloc(size);
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    char err[LKV_CONFIG_ERR_MAX];
    err[0] = '\0';
    int rc;
    if ((data[0] & 1) == 0) {
        lkv_config_defaults(&cfg);
        rc = lkv_config_load_string(&cfg, text, "fuzz.conf", err, sizeof(err));
        check_rc(rc, err);
        if (rc == 0) {
            rc = lkv_config_validate(&cfg, err, sizeof(err));
            check_rc(rc, err);
        }
        /* One key=value set through the API: refused means unchanged. */
        lkv_config_defaults(&cfg);
        char *eq = strchr(text, '=');
        if (eq != NULL) {
            *eq = '\0';
            before = cfg;
            rc = lkv_config_set(&cfg, NULL, text, eq + 1, err, sizeof(err));
            check_rc(rc, err);
            if (rc != 0 && !same(&before, &cfg)) {
                abort(); /* A failed set changed the config. */
            }
        }
    } else {
        char *argv[64];
        int argc = 0;
        argv[argc++] = "lazykvd";
        char *save = NULL;
        for (char *t = strtok_r(text, "\n", &save); t != NULL && argc < 63;
             t = strtok_r(NULL, "\n", &save)) {
            argv[argc++] = t;
        }
        argv[argc] = NULL;
        int action = 0;
        rc = lkv_config_from_args(&cfg, argc, argv, &action, err, sizeof(err));
        check_rc(rc, err);
    }
    free(text);
    return 0;
}
