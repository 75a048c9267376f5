/*
 * lkv_config.h: lazykvd's configuration: embedded defaults, one config file, command-line
 * overrides, validation with errors that name the option.
 *
 * File format (daemon/lazykvd.conf documents every option, its default and unit):
 *
 *     # comment (also after a value: "hot_bytes = 1GiB   # the arena")
 *     key = value
 *     [profile NAME]          keys below set model profile NAME (until the next section)
 *     key = value
 *
 * Keys before the first section are daemon options; keys inside "[profile NAME]" are profile
 * fields; keys inside "[tenant NAME]" are tenant fields (token_hash, roles, salt: see
 * daemon/lkv_auth.h; on the command line "--set tenant.NAME.field=value"). A section naming an
 * existing profile (a built-in one, or one declared earlier) edits it; a new name starts from the
 * profile template (f16, block 16, RoPE theta 10000 half-split, no scaling) and must set at least
 * n_layers, n_q_heads, n_kv_heads, head_dim and vocab_size. Built-in profiles: "stories260k" and
 * "llama-3.1-8b" (see lkv_config_defaults).
 *
 * Values: sizes are bytes with an optional binary suffix (K, KiB, M, MiB, G, GiB, T, TiB; case
 * does not matter); durations are milliseconds, or a number with a suffix ms, s or m ("5s");
 * values may be quoted ("...").
 *
 * Precedence: embedded defaults < config file (--config FILE) < command-line overrides, which
 * apply in order: "--set key=value", "--key value", "--key=value" (dashes in key names may be
 * written as underscores and vice versa); profile fields as "--set profile.NAME.key=value".
 *
 * Errors: every function returns LKV_ECONFIG with a one-line message in err naming the option
 * (and file:line or the command-line argument); lazykvd prints it and exits with status 2.
 */
#ifndef LKV_CONFIG_H
#define LKV_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "lkv_auth.h"
#include "lkv_profile.h"
#include "lkv_store.h"

#define LKV_CONFIG_MAX_PROFILES 32
#define LKV_CONFIG_MAX_TENANTS  256
#define LKV_CONFIG_ERR_MAX      512 /* Suggested size of err buffers. */

/* get_staging: how a Get sends hot blocks that are not host-mapped (a CUDA arena). */
enum lkv_get_staging {
    LKV_GET_STAGING_AUTO = 0,   /* Through the pinned staging ring (storage/lkv_stage.h). */
    LKV_GET_STAGING_OFF = 1,    /* A blocking copy into a per-call buffer, then packed. */
    LKV_GET_STAGING_ALWAYS = 2, /* The ring for a host arena too (tests, benchmarks). */
};

typedef struct lkv_config {
    char listen[256];           /* host:port to bind; port 0 picks a free port. */
    char data_dir[1024];        /* Cold tier (RocksDB) directory, created if absent. */
    int hot_backend;            /* enum lkv_hot_backend. */
    int cuda_device;            /* CUDA device ordinal for the hot arena. */
    uint64_t hot_bytes;         /* Hot tier budget (arena size), bytes. */
    uint64_t cold_bytes;        /* Cold tier budget, bytes of block payload; 0 = unlimited. */
    int policy_kind;            /* enum lkv_policy_kind, both tiers. */
    int policy_cost_bytes;      /* 1: GDSF cost = bytes (byte hit rate); 0: cost 1 per doc. */
    int durability;             /* enum lkv_durability. */
    int hot_admission;          /* enum lkv_hot_admission: always / door (lkv_store.h). */
    int get_staging;            /* enum lkv_get_staging. */
    uint32_t get_stage_slots;   /* Slots of the Get staging ring. */
    uint64_t get_stage_wait_ms; /* Longest wait for a slot before the copying path (0: none). */
    int get_stage_streams; /* CUDA streams of the staging copies (lkv_store cuda_read_streams). */
    int threads;           /* gRPC polling threads (one completion queue each). */
    int pool_threads;      /* Worker threads for blocking work (0: run it inline). */
    uint64_t max_message_bytes;        /* Largest gRPC message received or sent, bytes. */
    uint64_t max_request_bytes;        /* Largest Lookup/Attach request, bytes (lkv_method). */
    uint32_t max_lookup_docs;          /* Documents per Lookup. */
    uint32_t max_connections;          /* Connections open at once (0: from RLIMIT_NOFILE). */
    uint32_t max_connections_per_peer; /* ... from one IP address (0: no cap). */
    uint32_t max_calls_per_peer;       /* Calls in flight from one IP address (0: no cap). */
    uint32_t tls_max_streams;          /* TLS: streams open at once per connection (0: gRPC's). */
    uint64_t tls_handshake_timeout_ms; /* TLS: handshake deadline, ms (0: gRPC's, 120 s). */
    uint64_t tls_idle_timeout_ms;      /* TLS: idle connections closed after, ms (0: never). */
    int grpc_listener;                 /* 1: gRPC's own accept loop (lkv_server_opts). */
    int log_level;                     /* enum lkv_log_level. */
    uint64_t shutdown_grace_ms;        /* SIGTERM: how long in-flight calls may finish, ms. */
    uint32_t evicted_memory;           /* Evicted/deleted keys remembered for miss causes. */
    uint64_t cold_min_blob_bytes;      /* RocksDB min_blob_size, bytes. */
    uint64_t cold_min_free_bytes;      /* Disk headroom kept free under data_dir, bytes. */
    int cold_on_corruption;            /* enum lkv_cold_on_corruption. */
    uint64_t wb_max_backlog_bytes;     /* Write-back backlog bound, bytes (0 = unbounded). */
    int wb_wal;                        /* Write-back through the WAL (0: memtable flushes). */
    int n_profiles;                    /* Profiles in use (built-in + configured). */
    lkv_profile profiles[LKV_CONFIG_MAX_PROFILES]; /* Finished by lkv_config_validate. */
    char source[1024]; /* The config file read, or "" for embedded defaults only. */
    /* Tenants and authentication (daemon/lkv_auth.h). */
    uint32_t loopback_roles; /* Roles of anonymous loopback callers (enum lkv_role mask). */
    int allow_insecure_bind; /* Serve a non-loopback listen address without tenants. */
    int have_auth_key;       /* 1 if auth_key is set. */
    uint8_t auth_key[LKV_AUTH_KEY_BYTES];       /* Key of the token hashes. */
    int n_tenants;                              /* Configured tenants ([tenant NAME] sections). */
    lkv_tenant tenants[LKV_CONFIG_MAX_TENANTS]; /* Finished by lkv_config_validate. */
    /* Operation and transport security (issue 13). Empty strings mean "off". */
    char metrics_listen[256];      /* Prometheus endpoint host:port (lkv_metrics.h), or "". */
    int metrics_tls;               /* Serve the metrics over HTTPS with tls_cert/key_file. */
    char tls_cert_file[1024];      /* Server certificate chain (PEM), or "": plaintext. */
    char tls_key_file[1024];       /* Its private key (PEM). */
    char tls_client_ca_file[1024]; /* CA bundle verifying client certificates: when set, every
                                    * client must present one it signed; "" = none asked. */
    int allow_plaintext_tokens;    /* Accept bearer tokens over non-TLS non-loopback calls. */
    /* Zero-copy leases (daemon/lkv_lease.h). */
    uint32_t max_leases;       /* Live leases at once. */
    uint32_t max_lease_docs;   /* Documents per lease. */
    uint64_t max_lease_ttl_ms; /* Longest TTL an Attach may ask for, ms. */
    /* Cluster (daemon/cluster/lkv_cluster.h; "cluster_*" options, checked by validate). */
    char cluster_mode[16];               /* none, etcd, static, dns. */
    char cluster_id[128];                /* Member id ("": the advertised address). */
    char cluster_advertise[128];         /* host:port peers and clients use ("": listen's). */
    char cluster_etcd[512];              /* etcd endpoints host:port[,host:port]. */
    char cluster_prefix[128];            /* etcd key prefix of member records. */
    uint64_t cluster_lease_ttl_ms;       /* etcd lease TTL, ms (whole seconds). */
    char cluster_members[4096];          /* static: host:port[=hot_bytes],... */
    char cluster_dns[256];               /* dns: name:port. */
    uint64_t cluster_dns_refresh_ms;     /* dns: re-resolve period, ms. */
    uint64_t cluster_health_interval_ms; /* Peer health probe period, ms. */
    uint64_t cluster_down_after_ms;      /* Silent this long: marked down, ms. */
    char cluster_token_file[1024];       /* File holding the cluster-internal bearer token. */
    char wirekey_secret_file[1024];      /* Shared wire-key secret (else DATA_DIR's own). */
    uint64_t cluster_replica_ttl_ms;     /* Local replicas for Attach live this long (0: none). */
    /* Residency (storage/lkv_store.h): class holds applied at every start (runtime Admin Hold
     * of a profile or tenant is not persisted; these are). Comma-separated names, "" = none. */
    char hold_profiles[1024]; /* Profiles held (validated: each must be configured). */
    char hold_tenants[1024];  /* Tenants held ("default" or a [tenant NAME]; validated). */
} lkv_config;

/* Calls fn(ctx, name) for each comma-separated name of list (spaces trimmed, empty skipped);
 * stops at and returns fn's first non-zero value. name is valid during the call only. */
int lkv_config_each_name(const char *list, int (*fn)(void *ctx, const char *name), void *ctx);

/* What main should do after lkv_config_from_args. */
enum lkv_config_action {
    LKV_CONFIG_RUN = 0,     /* Start the daemon. */
    LKV_CONFIG_HELP = 1,    /* --help: print lkv_config_usage and exit 0. */
    LKV_CONFIG_VERSION = 2, /* --version: print the version and exit 0. */
    LKV_CONFIG_CHECK = 3,   /* --check-config: print the summary and exit 0. */
};

/* Fills *c (caller-owned) with the embedded defaults, including the built-in profiles
 * (unfinished: lkv_config_validate computes their fingerprints). Never fails. */
void lkv_config_defaults(lkv_config *c);

/* Sets one option from text. profile: NULL for a daemon option, else the profile section name
 * (created from the template if new). key, value, profile are borrowed. On error returns
 * LKV_ECONFIG and writes "option 'key': reason" (profile options: "profile 'P' option 'key':
 * reason") into err (errlen bytes); *c is unchanged then. */
int lkv_config_set(lkv_config *c, const char *profile, const char *key, const char *value,
                   char *err, size_t errlen);

/* Parses config text (borrowed, NUL-terminated) as if it were file name (used in messages).
 * Stops at the first error: LKV_ECONFIG, err = "name:line: ...". */
int lkv_config_load_string(lkv_config *c, const char *text, const char *name, char *err,
                           size_t errlen);

/* Reads and parses the file at path (borrowed). LKV_ECONFIG if it cannot be read (err names the
 * file and errno text) or on the first bad line. Records path in c->source. */
int lkv_config_load_file(lkv_config *c, const char *path, char *err, size_t errlen);

/* Checks cross-option constraints (listen address form, ranges, at least one profile, a block
 * of every profile fits in max_message_bytes and in hot_bytes, every tenant complete and the
 * tenant table consistent, a non-loopback listen address only with tenants or
 * allow_insecure_bind) and finishes every profile (fingerprint). LKV_ECONFIG with err naming
 * the option on failure. */
int lkv_config_validate(lkv_config *c, char *err, size_t errlen);

/* The whole start-up path: defaults, then --config FILE (if any), then the overrides in
 * argument order, then lkv_config_validate. argv is borrowed. Writes *action. Unknown
 * arguments and options are errors naming them. */
int lkv_config_from_args(lkv_config *c, int argc, char **argv, int *action, char *err,
                         size_t errlen);

/* Prints the usage text, with every daemon option, its default and unit, to f. */
void lkv_config_usage(FILE *f);

/* Writes a one-line summary of *c ("listen=... hot=host:1.0GiB ...") into buf (len bytes). */
void lkv_config_summary(const lkv_config *c, char *buf, size_t len);

/* Fills *out for lkv_store_open. out->data_dir and out->profiles borrow from c (keep c alive
 * until lkv_store_open returns). */
void lkv_config_to_store(const lkv_config *c, lkv_store_config *out);

/* Builds the tenant table of *c (after lkv_config_validate): *out is owned by the caller and
 * freed with lkv_auth_destroy. LKV_ECONFIG (err) on a table error. */
int lkv_config_auth(const lkv_config *c, lkv_auth **out, char *err, size_t errlen);

/* The largest request that names one document (GetRequest, DeleteRequest: a DocRef of at most
 * max_doc_tokens token ids of the longest profile, 5 bytes each, plus 4 KiB for the rest), capped
 * by max_request_bytes. Call after lkv_config_validate (max_doc_tokens is filled in then). */
uint64_t lkv_config_docref_bytes(const lkv_config *c);

/* Returns the profile named name (borrowed from c) or NULL. */
const lkv_profile *lkv_config_profile(const lkv_config *c, const char *name);

/* Formats a byte count in binary units ("1.0 GiB", "512 B") into buf (len bytes); returns buf. */
char *lkv_format_bytes(uint64_t n, char *buf, size_t len);

#endif
