/*
 * lkv_tls.h: checks of TLS material before the daemon hands it to gRPC (OpenSSL, the library
 * gRPC itself uses on Debian). gRPC's certificate fetcher accepts whatever PEM text it is given
 * and, when the text is bad, only logs from deep inside the handshake; these checks let the RPC
 * engine (lkv_server.c) refuse a bad or expired certificate with a message naming the file and
 * keep the one in service instead.
 *
 * Thread safety: every function is thread-safe (no shared state).
 */
#ifndef LKV_TLS_H
#define LKV_TLS_H

#include <stddef.h>
#include <time.h>

/* Checks a server (or client) certificate chain and private key, both PEM text (borrowed,
 * NUL-terminated): the first certificate parses, the key parses and matches it, and now lies in
 * its validity period. ca_pem (NULL: none) must hold at least one certificate. On success
 * returns 0, writes the first certificate's subject (one line) into subject (len bytes) and its
 * expiry into *not_after. Returns LKV_ECONFIG with a reason in why (whylen bytes) otherwise. */
int lkv_tls_check(const char *cert_pem, const char *key_pem, const char *ca_pem, char *subject,
                  size_t len, time_t *not_after, char *why, size_t whylen);

/* Reads the PEM file path whole (at most 16 MiB) as a NUL-terminated string, malloc'ed and owned
 * by the caller (free), or NULL with the reason (naming the file) in why (len bytes): it cannot
 * be opened, is too large, or holds no PEM block. */
char *lkv_tls_read_pem(const char *path, char *why, size_t len);

#endif
