/*
 * etcd_harness.h: a real etcd (Debian's etcd-server 3.4) for tests, on loopback ports picked at
 * start, with its data in a temp folder; stop (SIGKILL or SIGTERM) and restart on the same
 * ports and data. Tests skip (exit 77) when etcd is not installed.
 */
#ifndef LKV_ETCD_HARNESS_H
#define LKV_ETCD_HARNESS_H

typedef struct lkv_etcd {
    int pid;         /* 0 when stopped. */
    int client_port; /* 127.0.0.1:client_port speaks gRPC (and HTTP). */
    int peer_port;
    char dir[256];     /* Data folder (removed by lkv_etcd_destroy). */
    char endpoint[64]; /* "127.0.0.1:PORT". */
} lkv_etcd;

/* 1 if the etcd and etcdctl binaries exist. */
int lkv_etcd_available(void);

/* Picks ports, starts etcd and waits until it answers (10 s at most). 0 or -1. */
int lkv_etcd_start(lkv_etcd *e);

/* Starts it again on the same ports and data (after lkv_etcd_stop). 0 or -1. */
int lkv_etcd_restart(lkv_etcd *e);

/* Stops it with sig (SIGKILL or SIGTERM) and reaps it. */
void lkv_etcd_stop(lkv_etcd *e, int sig);

/* Stops it and removes its data. */
void lkv_etcd_destroy(lkv_etcd *e);

/* Runs "etcdctl --endpoints ENDPOINT args" (ETCDCTL_API=3); its stdout into out (len bytes).
 * Returns the exit status. */
int lkv_etcdctl(const lkv_etcd *e, const char *args, char *out, int len);

/* A free loopback TCP port (bound and released). */
int lkv_free_port(void);

#endif
