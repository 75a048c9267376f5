/*
 * lkv_tls.c: TLS material checks over OpenSSL 3 (contract in lkv_tls.h). Everything is parsed
 * from memory BIOs; nothing is kept.
 */
#include "lkv_tls.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "lkv_err.h"
#include "lkv_log.h"

/* The reason of the last OpenSSL error, or "". */
static const char *ssl_reason(void)
{
    unsigned long e = ERR_get_error();
    const char *r = e != 0 ? ERR_reason_error_string(e) : NULL;
    ERR_clear_error();
    return r != NULL ? r : "";
}

static X509 *first_cert(const char *pem)
{
    BIO *b = BIO_new_mem_buf(pem, -1);
    X509 *x = b != NULL ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    return x;
}

int lkv_tls_check(const char *cert_pem, const char *key_pem, const char *ca_pem, char *subject,
                  size_t len, time_t *not_after, char *why, size_t whylen)
{
    int rc = LKV_ECONFIG;
    EVP_PKEY *key = NULL;
    X509 *ca = NULL;
    X509 *x = first_cert(cert_pem);
    if (x == NULL) {
        snprintf(why, whylen, "no certificate could be parsed (%s)", ssl_reason());
        goto out;
    }
    BIO *b = BIO_new_mem_buf(key_pem, -1);
    key = b != NULL ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    if (key == NULL) {
        snprintf(why, whylen, "no private key could be parsed (%s)", ssl_reason());
        goto out;
    }
    if (X509_check_private_key(x, key) != 1) {
        ERR_clear_error();
        snprintf(why, whylen, "the private key does not match the certificate");
        goto out;
    }
    if (X509_cmp_current_time(X509_get0_notBefore(x)) >= 0) {
        snprintf(why, whylen, "the certificate is not valid yet");
        goto out;
    }
    if (X509_cmp_current_time(X509_get0_notAfter(x)) <= 0) {
        snprintf(why, whylen, "the certificate has expired");
        goto out;
    }
    if (ca_pem != NULL && (ca = first_cert(ca_pem)) == NULL) {
        snprintf(why, whylen, "the CA bundle holds no certificate (%s)", ssl_reason());
        goto out;
    }
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    *not_after = ASN1_TIME_to_tm(X509_get0_notAfter(x), &tm) == 1 ? timegm(&tm) : 0;
    X509_NAME_oneline(X509_get_subject_name(x), subject, (int)len);
    rc = 0;
out:
    X509_free(ca);
    EVP_PKEY_free(key);
    X509_free(x);
    return rc;
}

char *lkv_tls_read_pem(const char *path, char *why, size_t len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(why, len, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 8192, n = 0;
    char *buf = lkv_xmalloc(cap);
    for (;;) {
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (n < cap - 1) {
            break;
        }
        if (cap >= (16u << 20)) {
            snprintf(why, len, "%s is larger than 16 MiB", path);
            fclose(f);
            free(buf);
            return NULL;
        }
        cap *= 2;
        buf = lkv_xrealloc(buf, cap);
    }
    fclose(f);
    buf[n] = '\0';
    if (strstr(buf, "-----BEGIN ") == NULL) {
        snprintf(why, len, "%s holds no PEM block", path);
        free(buf);
        return NULL;
    }
    return buf;
}
