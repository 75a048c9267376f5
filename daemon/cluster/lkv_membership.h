/*
 * lkv_membership.h: who is in the cluster and who answers (DESIGN.md section 5).
 *
 * Sources of members, one per daemon (config option cluster_mode):
 *   etcd    each daemon registers KEY = prefix + id, VALUE = its record, under an etcd lease of
 *           lease_ttl seconds kept alive (LeaseKeepAlive stream, every ttl/3), and watches the
 *           prefix (Watch stream from the revision of its initial Range). A lost session (etcd
 *           down, lease expired, e.g. after SIGSTOP) changes nothing the daemon serves: the last
 *           view stays, health checks go on, and the daemon re-registers (new lease, Range,
 *           Watch) as soon as etcd answers, once a second at most.
 *   static  a fixed comma list "host:port[=hot_bytes],..." (self included or not).
 *   dns     "name:port" resolved every dns_refresh (getaddrinfo): each address is a member
 *           ("ip:port"), e.g. a Kubernetes headless Service of a StatefulSet.
 * Static and DNS members have no record: their weight is their "=hot_bytes" or 1 GiB.
 *
 * Record (the etcd value; one line of space-separated key=value, unknown keys ignored, so a
 * rolling upgrade can add fields): "addr=10.0.0.5:7070 version=0.1.0 hot_bytes=85899345920".
 * version tells old members from new ones.
 *
 * Health: every member but self is probed with grpc.health.v1.Health/Check every
 * health_interval (one probe in flight per member, deadline max(health_interval,
 * down_after / 2, 200 ms)). States: JOINING (known, never answered yet),
 * UP (answered SERVING within down_after), DOWN (no good answer for down_after). A DOWN member
 * that answers is UP again. Self is always UP. Live members = UP ones (with self): the router's
 * set. Each change of a member (joined, left, up, down, record changed) is one log line
 * ("cluster: member 127.0.0.1:5002 down (no answer for 1500 ms)").
 *
 * Threads: one membership thread (registration, re-registration, DNS, timers) plus the peer
 * engine's thread (stream and health callbacks); the public functions are thread-safe.
 */
#ifndef LKV_MEMBERSHIP_H
#define LKV_MEMBERSHIP_H

#include <stddef.h>
#include <stdint.h>

#include "lkv_peer.h"

#define LKV_MEMBER_ID_MAX   128
#define LKV_MEMBER_ADDR_MAX 128
#define LKV_MEMBERS_MAX     256

enum lkv_member_state {
    LKV_MEMBER_JOINING = 0,
    LKV_MEMBER_UP = 1,
    LKV_MEMBER_DOWN = 2,
};

enum lkv_cluster_mode {
    LKV_CLUSTER_NONE = 0,
    LKV_CLUSTER_ETCD = 1,
    LKV_CLUSTER_STATIC = 2,
    LKV_CLUSTER_DNS = 3,
};

/* One member as seen by this daemon (plain data). */
typedef struct lkv_member {
    char id[LKV_MEMBER_ID_MAX];     /* Unique name (etcd key suffix; static/DNS: the address). */
    char addr[LKV_MEMBER_ADDR_MAX]; /* host:port its gRPC server listens on for peers. */
    char version[32];               /* lazykvd version from its record ("" if unknown). */
    uint64_t hot_bytes;             /* Hot capacity: the rendezvous weight. */
    int state;                      /* enum lkv_member_state. */
    int self;                       /* 1 for this daemon. */
} lkv_member;

typedef struct lkv_membership_config {
    int mode;                /* enum lkv_cluster_mode (not NONE). */
    const char *self_id;     /* This daemon's id (NULL or "": self_addr). */
    const char *self_addr;   /* Advertised host:port (required). */
    const char *version;     /* Written into the record. */
    uint64_t hot_bytes;      /* Written into the record (weight). */
    const char *etcd;        /* etcd endpoints "host:port[,host:port]" (mode etcd). */
    const char *prefix;      /* etcd key prefix (NULL: "/lazykv/members/"). */
    int lease_ttl_s;         /* etcd lease TTL, seconds (>= 2). */
    const char *members;     /* mode static: "host:port[=hot_bytes],...". */
    const char *dns;         /* mode dns: "name:port". */
    uint64_t dns_refresh_ms; /* mode dns: re-resolve period. */
    uint64_t health_interval_ms;
    uint64_t down_after_ms;
    lkv_peer_engine *engine; /* Borrowed until stop. */
    /* Called (on either thread, no lock held) after the live set or a record changed. */
    void (*on_change)(void *ctx);
    void *ctx;
} lkv_membership_config;

typedef struct lkv_membership lkv_membership; /* Opaque. */

/* Starts membership (cfg and its strings are copied). *out owned by the caller:
 * lkv_membership_stop. Returns 0, LKV_EINVAL (bad config: err says what). Never waits for etcd:
 * registration happens on the membership thread. */
int lkv_membership_start(const lkv_membership_config *cfg, lkv_membership **out, char *err,
                         size_t errlen);

/* Sets (or clears, fn NULL) the on_change hook after start (thread-safe; a call already
 * running may still use the old hook until it returns). */
void lkv_membership_set_hook(lkv_membership *m, void (*fn)(void *ctx), void *ctx);

/* Stops the thread, revokes the etcd lease (best effort, 500 ms), frees m. NULL allowed. */
void lkv_membership_stop(lkv_membership *m);

/* Copies up to cap members (self included, sorted by id) into out; returns how many there are
 * (may be > cap). *epoch (may be NULL) receives a counter bumped on every change. */
size_t lkv_membership_snapshot(lkv_membership *m, lkv_member *out, size_t cap, uint64_t *epoch);

/* A channel to addr (borrowed: valid until lkv_membership_stop; one per address). */
lkv_peer_chan *lkv_membership_chan(lkv_membership *m, const char *addr);

/* 1 while the etcd session is up (mode etcd), else 0. */
int lkv_membership_etcd_up(lkv_membership *m);

/* Parses a record line (borrowed) into *out (addr, version, hot_bytes; other fields kept).
 * Returns 0, or LKV_EINVAL if addr is missing. */
int lkv_member_record_parse(const char *rec, size_t len, lkv_member *out);

/* Formats the record of *mb into buf (len bytes). */
void lkv_member_record_format(const lkv_member *mb, char *buf, size_t len);

/* "joining", "up", "down". */
const char *lkv_member_state_name(int state);

#endif
