/*
 * lkv_wirekey.h: per-tenant wire keys, so that one tenant can neither see nor probe another's
 * documents by key (issue 4, item 1).
 *
 * The store keys a document by K = BLAKE2b(tenant salt, profile fingerprint, tokens). Salts are
 * derived from tenant names and are not secret, so anyone can compute another tenant's K from
 * its name and tokens; a daemon that accepted K from any caller would let tenant B look up,
 * read or delete tenant A's documents. So K never crosses the wire for a tenant. Instead each
 * tenant sees W = E_t(K), where E_t is a keyed pseudo-random permutation of 32-byte strings:
 * a 4-round Feistel network over two 16-byte halves whose round function is keyed BLAKE2b-128
 * (libsodium crypto_generichash), a strong PRP by Luby-Rackoff, keyed with
 * k_t = BLAKE2b-256(key = daemon secret, "lazykv wire key v1" || tenant salt). The daemon
 * secret is 32 random bytes kept in DATA_DIR/wirekey.secret (mode 0600, created at first start),
 * so keys a client saved stay valid across restarts.
 *
 * A key from a caller is decoded with the caller's own permutation: B's decoding of A's W (or of
 * A's K) is an unrelated 32-byte string, which is absent from the store (with overwhelming
 * probability), so Lookup says absent and Get/Delete/Attach say NOT_FOUND exactly as for a
 * document that was never stored. Tenants with the same salt (shared on purpose) share E_t.
 *
 * Identity mode. A daemon with no [tenant ...] sections serves one tenant only (the anonymous
 * default): there is nobody to isolate, so E is the identity and wire keys equal store keys
 * (and the keys of Admin List, which are always store keys). With tenants configured, every
 * tenant, the anonymous default one included, gets a real permutation.
 */
#ifndef LKV_WIREKEY_H
#define LKV_WIREKEY_H

#include <stdint.h>

#include "lkv_dockey.h"

#define LKV_WIREKEY_SECRET_BYTES 32

typedef struct lkv_wirekey {
    int identity;  /* 1: E is the identity (no tenants configured). */
    uint8_t k[32]; /* Permutation key (unused in identity mode). */
} lkv_wirekey;

/* Loads DATA_DIR/wirekey.secret (dir borrowed), creating it with 32 random bytes (mode 0600)
 * if absent. Returns 0, or LKV_EIO (logged) if it cannot be read or created, or is not 32
 * bytes. */
int lkv_wirekey_secret_load(const char *dir, uint8_t secret[LKV_WIREKEY_SECRET_BYTES]);

/* Loads a shared secret (a cluster: every member mounts the same file) from path: 64 hex
 * digits. If dir (the data dir) has its own wirekey.secret that differs, logs a warning: the
 * shared secret wins, wire keys handed out under the old one no longer decode to their
 * documents (store keys, and so documents named by tokens, do not depend on it), and the old
 * file is left alone. Returns 0, or LKV_EIO (logged) for a missing or malformed file. */
int lkv_wirekey_secret_load_shared(const char *path, const char *dir,
                                   uint8_t secret[LKV_WIREKEY_SECRET_BYTES]);

/* Initialises *w for a tenant of salt (32 bytes) under secret; identity if identity != 0. */
void lkv_wirekey_init(lkv_wirekey *w, const uint8_t secret[LKV_WIREKEY_SECRET_BYTES],
                      const uint8_t salt[LKV_SALT_BYTES], int identity);

/* wire = E(stored). */
void lkv_wirekey_encode(const lkv_wirekey *w, const lkv_dockey *stored, uint8_t wire[32]);

/* stored = E^-1(wire). */
void lkv_wirekey_decode(const lkv_wirekey *w, const uint8_t wire[32], lkv_dockey *stored);

#endif
