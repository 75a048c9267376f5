/*
 * test_tls.c: the TLS material checks (daemon/lkv_tls.c) on certificates openssl makes here: a
 * good pair passes with its subject and expiry; an expired certificate, a not-yet-valid one, a
 * key of another certificate, garbage, an empty key, and a CA bundle without a certificate are
 * each refused with a reason naming the problem. Exits 77 (skip) without openssl.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lkv_err.h"
#include "lkv_test.h"
#include "lkv_tls.h"

static char dir[] = "/tmp/lkv-tls-test-XXXXXX";

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    char full[4200];
    snprintf(full, sizeof(full), "cd %s && (%s) >/dev/null 2>&1", dir, cmd);
    if (system(full) != 0) {
        LKV_FAIL("command failed: %s", cmd);
    }
}

static char *slurp(const char *name)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    ASSERT_TRUE(f != NULL);
    char *buf = calloc(1, 65536);
    size_t n = fread(buf, 1, 65535, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

#define KEYGEN "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes"

static void make_all(void)
{
    sh("openssl req -x509 " KEYGEN " -keyout ca.key -out ca.pem -days 2 -subj /CN=test-ca");
    sh("openssl req " KEYGEN " -keyout a.key -out a.csr -subj /CN=server-a");
    sh("openssl x509 -req -in a.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out a.pem -days 1");
    sh("openssl req " KEYGEN " -keyout b.key -out b.csr -subj /CN=server-b");
    /* Expired and not yet valid: `openssl ca` sets the dates. */
    sh("touch index.txt && echo 01 > serial && printf '%s' > ca.cnf",
       "[ca]\\ndefault_ca = d\\n[d]\\ndatabase = index.txt\\nnew_certs_dir = .\\nserial = serial\\n"
       "default_md = sha256\\npolicy = p\\nunique_subject = no\\n[p]\\ncommonName = supplied\\n");
    sh("openssl ca -batch -config ca.cnf -cert ca.pem -keyfile ca.key -in b.csr -out old.pem "
       "-startdate 20200101000000Z -enddate 20200102000000Z -notext");
    sh("openssl ca -batch -config ca.cnf -cert ca.pem -keyfile ca.key -in b.csr -out future.pem "
       "-startdate 20990101000000Z -enddate 20990102000000Z -notext");
}

static void test_checks(void)
{
    char *a = slurp("a.pem"), *ak = slurp("a.key"), *bk = slurp("b.key"), *ca = slurp("ca.pem");
    char *old = slurp("old.pem"), *future = slurp("future.pem");
    char subj[256], why[256];
    time_t na = 0;
    ASSERT_OK(lkv_tls_check(a, ak, NULL, subj, sizeof(subj), &na, why, sizeof(why)));
    ASSERT_TRUE(strstr(subj, "CN=server-a") != NULL);
    time_t now = time(NULL);
    ASSERT_TRUE(na > now + 3600 && na < now + 2 * 86400); /* -days 1 */
    ASSERT_OK(lkv_tls_check(a, ak, ca, subj, sizeof(subj), &na, why, sizeof(why)));
    /* A chain file (leaf then CA) checks its first certificate. */
    char *chain = malloc(strlen(a) + strlen(ca) + 1);
    strcpy(chain, a);
    strcat(chain, ca);
    ASSERT_OK(lkv_tls_check(chain, ak, NULL, subj, sizeof(subj), &na, why, sizeof(why)));
    ASSERT_TRUE(strstr(subj, "CN=server-a") != NULL);
    struct {
        const char *cert, *key, *ca, *want;
    } bad[] = {
        {old, bk, NULL, "expired"},
        {future, bk, NULL, "not valid yet"},
        {a, bk, NULL, "does not match"},
        {"-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n", ak, NULL,
         "no certificate"},
        {"", ak, NULL, "no certificate"},
        {a, "", NULL, "no private key"},
        {a, "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", NULL,
         "no private key"},
        {a, ak, "not a pem bundle", "CA bundle"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        why[0] = '\0';
        int rc = lkv_tls_check(bad[i].cert, bad[i].key, bad[i].ca, subj, sizeof(subj), &na, why,
                               sizeof(why));
        if (rc != LKV_ECONFIG || strstr(why, bad[i].want) == NULL) {
            LKV_FAIL("case %zu: rc %s, why \"%s\" (want \"%s\")", i, lkv_err_name(rc), why,
                     bad[i].want);
        }
    }
    free(a);
    free(ak);
    free(bk);
    free(ca);
    free(old);
    free(future);
    free(chain);
}

int main(void)
{
    if (system("command -v openssl >/dev/null 2>&1") != 0) {
        printf("SKIP: no openssl\n");
        return 77;
    }
    if (mkdtemp(dir) == NULL) {
        return 1;
    }
    make_all();
    LKV_RUN(test_checks);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : 1;
}
