#!/usr/bin/env bash
# test_systemd.sh: deploy/lazykvd.service checked by systemd itself (ctest deploy.systemd).
#   1. `systemd-analyze verify` accepts the unit (with ExecStart pointed at the lazykvd just
#      built, since verify also checks that the binary exists and is executable);
#   2. the directives the deployment relies on are there: a dedicated user, the config under
#      /etc/lazykv, the data under /var/lib/lazykv, a descriptor limit, a restart policy that
#      does not loop on a bad config (exit 2), SIGHUP as the reload;
#   3. `systemd-analyze security --offline=true` rates the unit's exposure at most 3.0 ("OK");
#   4. the daemon accepts the unit's command line with the shipped config (--check-config).
# Usage: test_systemd.sh UNIT LAZYKVD CONF. Exit 77 (skip) without systemd-analyze.
set -euo pipefail
unit=$1 lazykvd=$2 conf=$3
if ! command -v systemd-analyze >/dev/null; then
    echo "SKIP: no systemd-analyze (Debian: apt-get install systemd)"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
sed "s#/usr/local/bin/lazykvd#$lazykvd#" "$unit" > "$tmp/lazykvd.service"
if ! out=$(systemd-analyze verify "$tmp/lazykvd.service" 2>&1) || [ -n "$out" ]; then
    echo "FAIL: systemd-analyze verify: $out"
    fail=1
fi
for want in '^User=lazykv$' '^Group=lazykv$' '^Restart=on-failure$' '^RestartPreventExitStatus=2$' \
            '^LimitNOFILE=[0-9]+$' '^StateDirectory=lazykv$' '^ConfigurationDirectory=lazykv$' \
            '^ExecStart=.* --config /etc/lazykv/lazykvd.conf .*data_dir=/var/lib/lazykv' \
            '^ExecReload=/bin/kill -HUP \$MAINPID$' '^NoNewPrivileges=yes$' '^ProtectSystem=strict$'; do
    if ! grep -Eq "$want" "$unit"; then
        echo "FAIL: $unit lacks a line matching $want"
        fail=1
    fi
done
score=$(systemd-analyze security --offline=true "$tmp/lazykvd.service" 2>&1 |
        sed -n 's/.*Overall exposure level for lazykvd.service: \([0-9.]*\).*/\1/p')
if [ -z "$score" ] || ! awk -v s="$score" 'BEGIN { exit !(s <= 3.0) }'; then
    echo "FAIL: systemd-analyze security exposure '${score}' (want <= 3.0)"
    fail=1
else
    echo "exposure $score"
fi
if ! "$lazykvd" --check-config --config "$conf" --set data_dir=/var/lib/lazykv >/dev/null; then
    echo "FAIL: lazykvd rejects the unit's command line with $conf"
    fail=1
fi
[ $fail -eq 0 ] && echo ok
exit $fail
