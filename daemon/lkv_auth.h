/*
 * lkv_auth.h: tenants, roles and bearer-token authentication (DESIGN.md sections 3 and 6).
 *
 * A tenant is a name, a set of roles, the hash of its bearer token and a 32-byte salt. The salt
 * goes into every document key the tenant makes (storage/), so two tenants that store the same
 * tokens get different keys: one tenant can neither read nor probe another's documents.
 *
 * Roles (a bit mask):
 *   data    Put, Lookup, Get, Delete (the RAG pipeline).
 *   worker  Attach, Release (maps the hot arena: trusted with every tenant's bytes).
 *   admin   Stats and the other lazykv.v1.Admin methods.
 * grpc.health.v1.Health needs no role and no token.
 *
 * Tokens. The client sends "authorization: Bearer <token>" metadata. The daemon keeps only
 * hash = BLAKE2b-256(key = auth_key or none, message = "lazykv-token-v1:" || token) (libsodium
 * crypto_generichash; Python: hashlib.blake2b(msg, digest_size=32, key=auth_key)). A fast keyed
 * hash, not crypto_pwhash, because every RPC authenticates and generated tokens carry 256 random
 * bits (lkv_auth_token_new): a slow password hash protects low-entropy secrets, which these are
 * not, and would cost tens of milliseconds per call. The optional daemon-wide auth_key makes a
 * leaked tenant table useless without the key. A presented token is hashed and compared with
 * every tenant's hash by crypto_verify_32 (constant time), without stopping at a match, so the
 * time taken reveals neither the token nor which tenant matched.
 *
 * Anonymous callers. A call without an authorization header from a loopback peer is the
 * default tenant (LKV_AUTH_DEFAULT_TENANT, with the store's default salt of 32 zero bytes,
 * storage/lkv_dockey.h lkv_tenant_salt_default) with the table's loopback roles (all roles
 * unless configured otherwise; 0 requires a token on loopback too). A call that does carry a header
 * is always checked, on loopback too: a wrong token is never downgraded to anonymous. Binding a
 * non-loopback address without tenants is refused (lkv_auth_check_bind) unless the operator
 * explicitly allows it. Caution: behind a proxy in the same network namespace (an Istio/Envoy
 * sidecar, kubectl port-forward) remote callers arrive from 127.0.0.x, so such deployments must set
 * loopback_roles = none.
 *
 * Config (one section per tenant; parsed entry by entry with lkv_tenant_init/set/finish):
 *
 *     [tenant alice]
 *     token_hash = blake2b:<64 hex digits>   # python3 -m lazykv.tenant new alice (required)
 *     roles      = data,worker               # comma list of data, worker, admin (required)
 *     salt       = <64 hex digits>           # optional; default lkv_auth_tenant_salt(name)
 *     max_hot_bytes = 1GiB   max_cold_bytes = 10GiB   max_docs = 10000   # optional quotas
 *     rate_calls = 500       rate_bytes = 256MiB                        # optional, per second
 *
 * A configured salt lets a tenant be renamed without losing its documents, or lets two tenants
 * share a cache on purpose (same salt). Derived salts are deterministic, so documents survive
 * restarts; they are not secret (isolation comes from the token, not from the salt).
 *
 * Tenant names: 1..63 characters of [A-Za-z0-9._-]. "default" is reserved for anonymous
 * loopback callers (a configured tenant may not use it).
 *
 * Daemon options that go with the sections (proposed for lkv_config):
 *     loopback_roles      = data,worker,admin   # anonymous loopback callers; "none": token needed
 *     allow_insecure_bind = false               # serve a non-loopback listen without tenants
 *     auth_key            = <64 hex digits>     # optional key of the token hashes
 *
 * Wiring at the RPC edge (the engine's admission hook, lkv_server_opts.admit, ctx = the table):
 *     n = lkv_rpc_metadata(rpc, "authorization", buf, sizeof buf);   (buf: 8 KiB + 1)
 *     rc = lkv_auth_check(auth, n >= 0 ? buf : NULL, n >= 0 ? n : 0,
 *                         lkv_auth_peer_is_loopback(lkv_rpc_peer(rpc)),
 *                         lkv_auth_method_roles(path, strlen(path)), &tenant, msg, sizeof msg);
 *     LKV_EUNAUTH -> UNAUTHENTICATED, LKV_EPERM -> PERMISSION_DENIED (msg as the details);
 *     then lkv_rpc_set_principal(rpc, tenant), and tenant->salt keys every store call.
 * A header that is present but too long for buf must be refused (LKV_EUNAUTH), never treated as
 * absent: size buf to gRPC's metadata limit (8 KiB by default), or tell the two apart.
 * tests/daemon/auth_edge_server.c is this recipe running on the daemon's RPC engine.
 *
 * Thread safety: a table is built single-threaded, then only read; lkv_auth_check and every
 * other const function may run on any number of threads at once.
 */
#ifndef LKV_AUTH_H
#define LKV_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define LKV_AUTH_SALT_BYTES      32  /* Tenant salt. */
#define LKV_AUTH_HASH_BYTES      32  /* Token hash (BLAKE2b-256). */
#define LKV_AUTH_KEY_BYTES       32  /* Optional daemon-wide hashing key. */
#define LKV_AUTH_TOKEN_MAX       512 /* Longest bearer token accepted, in bytes. */
#define LKV_AUTH_TOKEN_NEW_BYTES 48  /* Buffer for lkv_auth_token_new: "lkv_" + 43 + NUL. */
#define LKV_TENANT_NAME_MAX      64  /* Buffer size for a name: at most 63 chars + NUL. */
#define LKV_AUTH_DEFAULT_TENANT  "default"
#define LKV_AUTH_HASH_PREFIX     "blake2b:" /* Prefix of token_hash values in the config. */

/* Role bits. Values are stable (they may appear in logs and stats). */
enum lkv_role {
    LKV_ROLE_DATA = 1u << 0,
    LKV_ROLE_WORKER = 1u << 1,
    LKV_ROLE_ADMIN = 1u << 2,
    LKV_ROLE_ALL = (1u << 3) - 1u,
};

/* One tenant. Plain data: copied by value, owns no pointers. */
typedef struct lkv_tenant {
    char name[LKV_TENANT_NAME_MAX];          /* NUL-terminated, [A-Za-z0-9._-]{1,63}. */
    uint32_t roles;                          /* Mask of enum lkv_role. */
    uint8_t token_hash[LKV_AUTH_HASH_BYTES]; /* lkv_auth_hash_token of the bearer token. */
    uint8_t salt[LKV_AUTH_SALT_BYTES];       /* Document-key salt of this tenant. */
    /* Quotas and rates (0 = unlimited; daemon/lkv_tenancy.h enforces them). */
    uint64_t max_hot_bytes;  /* Hot-tier bytes the tenant's documents may hold. */
    uint64_t max_cold_bytes; /* Cold-tier bytes the tenant's documents may hold. */
    uint64_t max_docs;       /* Documents (hot or cold) the tenant may hold. */
    uint64_t rate_calls;     /* Calls per second (token bucket, burst: one second's worth). */
    uint64_t rate_bytes;     /* Put payload bytes per second (same bucket rule). */
    int t_slot;              /* The daemon's stable per-tenant slot (lkv_tenancy), 0 = none. */
    uint8_t t_have_hash;     /* 1 once token_hash was set (parsing state). */
    uint8_t t_have_roles;    /* 1 once roles was set (parsing state). */
} lkv_tenant;

typedef struct lkv_auth lkv_auth; /* Opaque tenant table. */

/* ---- Tenant entries (config parsing) ---------------------------------------------------- */

/* Starts a tenant entry for section "[tenant name]": checks the name, clears *t, sets its
 * salt to lkv_auth_tenant_salt(name). t is owned by the caller. Returns 0, or LKV_ECONFIG with
 * a message naming the problem in err (errlen bytes, NUL-terminated; err may be NULL). */
int lkv_tenant_init(lkv_tenant *t, const char *name, char *err, int errlen);

/* Applies one "key = value" line of the tenant's section (key and value already trimmed, both
 * borrowed). Keys: token_hash, roles, salt, max_hot_bytes, max_cold_bytes, max_docs (sizes
 * take K/KiB/M/MiB/G/GiB/T/TiB suffixes; 0 or "unlimited" = no limit), rate_calls, rate_bytes
 * (per second). Returns 0, or LKV_ECONFIG with a message that
 * names the tenant and the field ("tenant \"alice\": token_hash: ...") in err. */
int lkv_tenant_set(lkv_tenant *t, const char *key, const char *value, char *err, int errlen);

/* Ends a tenant entry: checks that every required field was given. 0 or LKV_ECONFIG (err). */
int lkv_tenant_finish(const lkv_tenant *t, char *err, int errlen);

/* Parses a whole section at once: init, set for each of the n (keys[i], values[i]) pairs,
 * finish. Arrays and strings are borrowed. 0 or LKV_ECONFIG (err names tenant and field). */
int lkv_tenant_parse(const char *name, const char *const *keys, const char *const *values, int n,
                     lkv_tenant *out, char *err, int errlen);

/* ---- The table ---------------------------------------------------------------------------- */

/* Creates an empty table. key: LKV_AUTH_KEY_BYTES of hashing key, or NULL for none (copied).
 * loopback_roles: the roles of anonymous loopback callers (LKV_ROLE_ALL by default; 0 means
 * a token is required on loopback too). *out is owned by the caller, freed with
 * lkv_auth_destroy. Returns 0 or LKV_EINTERNAL if libsodium cannot initialise. */
int lkv_auth_create(const uint8_t *key, uint32_t loopback_roles, lkv_auth **out);

/* Frees the table (NULL is a no-op). The key material is wiped. */
void lkv_auth_destroy(lkv_auth *a);

/* Adds a finished tenant (copied). LKV_ECONFIG (err) if its name is taken or reserved, or if
 * another tenant has the same token hash (one token must name one tenant). May move the table:
 * tenant pointers returned earlier become invalid, so add every tenant before serving. */
int lkv_auth_add(lkv_auth *a, const lkv_tenant *t, char *err, int errlen);

/* Number of configured tenants (the anonymous default tenant is not counted). */
int lkv_auth_count(const lkv_auth *a);

/* Returns the default tenant that anonymous loopback callers get (borrowed, valid until
 * lkv_auth_destroy). Its roles are the table's loopback roles. */
const lkv_tenant *lkv_auth_default_tenant(const lkv_auth *a);

/* Returns a dense index for per-tenant state (hit/miss counters, which must not be shown
 * across tenants): 0 for the default tenant, 1..lkv_auth_count(a) for configured ones. t must
 * come from this table (lkv_auth_check, lkv_auth_find or lkv_auth_default_tenant). */
int lkv_auth_index(const lkv_auth *a, const lkv_tenant *t);

/* Finds a configured tenant by name; borrowed pointer or NULL. */
const lkv_tenant *lkv_auth_find(const lkv_auth *a, const char *name);

/* ---- Per call ----------------------------------------------------------------------------- */

/* Authenticates and authorises one call.
 *   authz, authz_len: the raw value of the "authorization" metadata (not NUL-terminated, as
 *       gRPC hands it over; borrowed), or NULL when the call has no such header. A call that
 *       carries the header twice should be refused by the caller as malformed (LKV_EUNAUTH).
 *   loopback: 1 if the peer is on loopback (see lkv_auth_peer_is_loopback), else 0.
 *   need: the role mask the method requires (lkv_auth_method_roles); 0 means none.
 * On success returns 0 and sets *out to the caller's tenant (borrowed, valid until
 * lkv_auth_destroy). Returns LKV_EUNAUTH when the header is missing (and anonymous access is
 * not allowed), malformed (not "Bearer <token68>") or names no tenant; LKV_EPERM when the
 * tenant lacks a required role (*out is still set, for logging). err (errlen bytes, may be
 * NULL) gets a message fit for the gRPC status details; it never contains the token. */
int lkv_auth_check(const lkv_auth *a, const char *authz, size_t authz_len, int loopback,
                   uint32_t need, const lkv_tenant **out, char *err, int errlen);

/* Role mask a fully qualified gRPC method ("/lazykv.v1.Cache/Put") requires: data for the data
 * plane, worker for Attach/Release, admin for lazykv.v1.Admin, 0 for grpc.health.v1.Health, and
 * admin for anything unknown (fail closed). method is borrowed, len bytes, not NUL-terminated. */
uint32_t lkv_auth_method_roles(const char *method, size_t len);

/* ---- Helpers ------------------------------------------------------------------------------ */

/* Hashes a bearer token: out = BLAKE2b-256(key, "lazykv-token-v1:" || token). key is
 * LKV_AUTH_KEY_BYTES or NULL. LKV_EINVAL if len is 0 or above LKV_AUTH_TOKEN_MAX. */
int lkv_auth_hash_token(const uint8_t *key, const char *token, size_t len,
                        uint8_t out[LKV_AUTH_HASH_BYTES]);

/* Writes a fresh random token ("lkv_" + base64url of 32 random bytes, 47 chars) into out
 * (outlen >= LKV_AUTH_TOKEN_NEW_BYTES). LKV_EINVAL if out is too small. */
int lkv_auth_token_new(char *out, size_t outlen);

/* Writes the config line "token_hash = blake2b:<hex>" for token (key as in hash_token) into
 * out (outlen >= 90). LKV_EINVAL for a bad token or a short buffer. */
int lkv_auth_hash_line(const uint8_t *key, const char *token, char *out, size_t outlen);

/* The default salt of a named tenant: the store's lkv_tenant_salt_derive(name), that is
 * BLAKE2b-256("lazykv tenant salt v1\0" || name) (storage/lkv_dockey.h owns the formula). */
void lkv_auth_tenant_salt(const char *name, uint8_t out[LKV_AUTH_SALT_BYTES]);

/* Parses a role list "data,worker,admin" (any order, spaces allowed around names; "none" or
 * "" is 0) into *mask. LKV_EINVAL (err names the bad role and lists the valid ones). */
int lkv_auth_roles_parse(const char *s, uint32_t *mask, char *err, int errlen);

/* Writes mask as "data,worker,admin" (or "none") into out (outlen >= 24). */
void lkv_auth_roles_format(uint32_t mask, char *out, size_t outlen);

/* Returns 1 if a gRPC peer string ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000",
 * "ipv6:%5B::1%5D:5000", "unix:/path") is a loopback or local-socket peer, else 0. */
int lkv_auth_peer_is_loopback(const char *peer);

/* Returns 1 if a listen address ("127.0.0.1:0", "localhost:50051", "[::1]:1", "ipv4:...",
 * "unix:/path") binds loopback or a local socket only, else 0 ("0.0.0.0:1", "[::]:1", ":1",
 * other host names and addresses). */
int lkv_auth_addr_is_loopback(const char *addr);

/* Refuses to serve a non-loopback address without tenants: returns 0 if addr is loopback, or
 * if have_tenants, or if allow_insecure; else LKV_ECONFIG with a message naming the address and
 * the two ways out (configure [tenant ...] sections, or set allow_insecure_bind = true). */
int lkv_auth_check_bind(const char *addr, int have_tenants, int allow_insecure, char *err,
                        int errlen);

#endif
