#!/bin/sh
# Tests /init's rebound.net handling under busybox sh (`make check` runs it with
# `busybox sh test_init_net.sh ../init`): sources the init's functions (REBOUND_INIT_FUNCS
# stops it before it mounts anything), with a fake /sys/class/net and a fake `ip` that
# logs its arguments and renames the fake interfaces.
init=${1:-../init}
tmp=$(mktemp -d /tmp/rebound-init-test.XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT
failures=0

# If the guard failed, the init's body must not touch this machine.
mount() { echo "init body ran: mount $*" >&2; exit 1; }
REBOUND_INIT_FUNCS=1
. "$init"
SYSNET=$tmp/net
log=$tmp/ip.log

ip() {
	echo "$*" >>"$log"
	case "$*" in "link set "*" name "*) mv "$SYSNET/$3" "$SYSNET/$5" ;; esac
}
sleep() { :; } # waiting for a NIC that never comes takes no time here

nics() { # name=mac ...
	rm -rf "$SYSNET" "$log"
	mkdir -p "$SYSNET/lo"
	echo 00:00:00:00:00:00 >"$SYSNET/lo/address"
	for nm; do
		mkdir -p "$SYSNET/${nm%%=*}"
		echo "${nm#*=}" >"$SYSNET/${nm%%=*}/address"
	done
	: >"$log"
}

check() { # description, command...
	what=$1
	shift
	if ! "$@"; then
		echo "FAIL: $what" >&2
		failures=$((failures + 1))
	fi
}

has() { grep -qF -- "$1" "$2"; }
said() { has "$1" "$tmp/out"; }
run() { net_from_cmdline "$1" >"$tmp/out" 2>&1; }

USER=52:54:00:12:34:56
CL=52:54:00:77:00:0b

# The cluster NIC second: configured where it is, eth0 untouched.
nics eth0=$USER eth1=$CL
check "exit status" run "console=ttyS0 rebound.net=52:54:00:77:00:0B@10.77.0.11/24 quiet"
check "address" has "addr add 10.77.0.11/24 dev eth1" "$log"
check "up" has "link set eth1 up" "$log"
check "console line" said "rebound-init: eth1 (52:54:00:77:00:0b) 10.77.0.11/24 (cluster network)"
check "eth0 untouched" sh -c "! grep -q eth0 '$log'"

# The cluster NIC probed first (eth0): names swapped, eth0 is the user NIC again.
nics eth0=$CL eth1=$USER
run "rebound.net=$CL@10.77.0.12/16"
check "swap: eth0 is the user NIC" has "$USER" "$SYSNET/eth0/address"
check "swap: eth1 is the cluster NIC" has "$CL" "$SYSNET/eth1/address"
check "swap: address" has "addr add 10.77.0.12/16 dev eth1" "$log"
check "swap: said" said "cluster NIC came up as eth0: renamed it eth1"

# Any name: found by MAC.
nics eth0=$USER enp0s4=$CL
run "rebound.net=$CL@10.77.0.13/24"
check "other name" has "addr add 10.77.0.13/24 dev enp0s4" "$log"

# No NIC has the MAC: said, nothing configured, boot goes on.
nics eth0=$USER eth1=52:54:00:77:00:99
check "missing MAC status" run "rebound.net=$CL@10.77.0.11/24"
check "missing MAC said" said "rebound.net: no interface has MAC $CL: cluster network not configured"
check "missing MAC: no ip" sh -c "! [ -s '$log' ]"

# No rebound.net: nothing said, nothing done.
nics eth0=$USER eth1=$CL
run "console=ttyS0 rebound.workload=peer"
check "absent: silent" sh -c "! [ -s '$tmp/out' ] && ! [ -s '$log' ]"

# Malformed values: said, nothing configured.
for v in "" garbage "$CL" "@10.77.0.11/24" "$CL@" "$CL@10.77.0.11" "$CL@10.77.0.11/" "$CL@/24" \
	"$CL@10.77.0.11/0" "$CL@10.77.0.11/33" "$CL@10.77.0.11/024" "$CL@10.77.0.11/24/1" "$CL@10.77.0.256/24" \
	"$CL@10.77.0/24" "$CL@10.77.0.1.2/24" "$CL@10.77..11/24" "$CL@.10.77.0.11/24" "$CL@10.77.0.11./24" \
	"$CL@10.77.0.1111/24" "$CL@10.77.0.*/24" "$CL@a.b.c.d/24" "52:54:00:77:00@10.77.0.11/24" \
	"52:54:00:77:00:0g@10.77.0.11/24" "52-54-00-77-00-0b@10.77.0.11/24" "$CL:00@10.77.0.11/24" \
	"$CL@10.77.0.11/24@x"; do
	nics eth0=$USER eth1=$CL
	check "malformed '$v': status" run "rebound.net=$v"
	check "malformed '$v': said" said "cluster network not configured"
	check "malformed '$v': no ip" sh -c "! [ -s '$log' ]"
done

if [ $failures -ne 0 ]; then
	echo "$failures /init rebound.net check(s) failed" >&2
	exit 1
fi
echo "/init rebound.net tests passed"
