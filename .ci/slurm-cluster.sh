#!/usr/bin/env bash
# An emulated 2-node Slurm cluster on this one machine, for cibox's Slurm tests and
# bench (docs/interface.md §14): munged, one slurmctld, and two slurmd (`n1`, `n2`) on
# their own ports, each with 4 fake GPUs (`/dev/fakegpu0-3` and `/dev/fakegpu4-7`,
# character devices with NVIDIA's major number: Slurm needs only the files for GRES).
#
# Idempotent: what already runs with the same configuration is left alone; a changed
# configuration restarts the daemons. Run as root (setup-host.sh calls it).
set -euo pipefail

if [ "$(id -u)" != 0 ]; then
  echo "slurm-cluster: must run as root" >&2
  exit 1
fi

host=$(hostname)
conf_dir=/etc/slurm
state=/var/lib/slurm
logs=/var/log/slurm
run=/run/slurm

# munge: its own user owns its folders, or it refuses to start.
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
chmod 0755 /run/munge
if [ ! -s /etc/munge/munge.key ]; then
  # The package makes one; a machine without it gets a fresh random key.
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 status=none
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
fi
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  echo "slurm-cluster: starting munged"
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 1 20); do
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
    sleep 0.5
  done
fi

# The fake GPUs: 195 is NVIDIA's character-device major number.
for n in 0 1 2 3 4 5 6 7; do
  [ -c /dev/fakegpu$n ] || mknod -m 0666 /dev/fakegpu$n c 195 $n
done

mkdir -p "$conf_dir" "$state/slurmctld" "$state/slurmd" "$logs" "$run"

# Each emulated node claims 8 CPUs on this 2-core machine (config_overrides), so that
# GPUs, not cores, bound how many jobs share a node.
want_conf=$(cat <<EOF
# The emulated cibox test cluster (.ci/slurm-cluster.sh); rewritten by it.
ClusterName=cibox
SlurmctldHost=${host}(127.0.0.1)
SlurmctldPort=6817
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=${state}/slurmctld
SlurmdSpoolDir=${state}/slurmd/%n
SlurmctldPidFile=${run}/slurmctld.pid
SlurmdPidFile=${run}/slurmd-%n.pid
SlurmctldLogFile=${logs}/slurmctld.log
SlurmdLogFile=${logs}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=${logs}/jobcomp.log
JobAcctGatherType=jobacct_gather/none
KillWait=5
MinJobAge=600
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=n1 NodeHostname=${host} NodeAddr=127.0.0.1 Port=17001 CPUs=8 RealMemory=4000 Gres=gpu:4 State=UNKNOWN
NodeName=n2 NodeHostname=${host} NodeAddr=127.0.0.1 Port=17002 CPUs=8 RealMemory=4000 Gres=gpu:4 State=UNKNOWN
PartitionName=gpu Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
EOF
)
want_gres=$(cat <<'EOF'
# The emulated cibox test cluster's fake GPUs (.ci/slurm-cluster.sh).
NodeName=n1 Name=gpu File=/dev/fakegpu[0-3]
NodeName=n2 Name=gpu File=/dev/fakegpu[4-7]
EOF
)
changed=0
if [ "$(cat "$conf_dir/slurm.conf" 2>/dev/null)" != "$want_conf" ]; then
  printf '%s\n' "$want_conf" >"$conf_dir/slurm.conf"
  changed=1
fi
if [ "$(cat "$conf_dir/gres.conf" 2>/dev/null)" != "$want_gres" ]; then
  printf '%s\n' "$want_gres" >"$conf_dir/gres.conf"
  changed=1
fi
chmod 0644 "$conf_dir/slurm.conf" "$conf_dir/gres.conf"

# A daemon runs when its pid file names a live process of that program.
alive() { # pidfile program
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "$2" ]
}
stop() { # pidfile program
  if alive "$1" "$2"; then
    kill "$(cat "$1")"
    for _ in $(seq 1 40); do
      alive "$1" "$2" || return 0
      sleep 0.25
    done
    kill -9 "$(cat "$1")" 2>/dev/null || true
  fi
}
if [ "$changed" = 1 ]; then
  echo "slurm-cluster: configuration written; (re)starting the daemons"
  stop "$run/slurmd-n1.pid" slurmd
  stop "$run/slurmd-n2.pid" slurmd
  stop "$run/slurmctld.pid" slurmctld
fi
if ! alive "$run/slurmctld.pid" slurmctld; then
  echo "slurm-cluster: starting slurmctld"
  /usr/sbin/slurmctld
fi
for node in n1 n2; do
  if ! alive "$run/slurmd-$node.pid" slurmd; then
    echo "slurm-cluster: starting slurmd $node"
    mkdir -p "$state/slurmd/$node"
    /usr/sbin/slurmd -N "$node"
  fi
done

# Up when both nodes answer and can take jobs.
for _ in $(seq 1 60); do
  states=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u | tr '\n' ' ')
  case "$states" in
    *down* | *drain* | *unk* | *fail* | "") ;;
    *) break ;;
  esac
  sleep 1
done
for node in n1 n2; do
  st=$(sinfo -h -N -n "$node" -o '%t' 2>/dev/null | head -n1)
  case "$st" in
    down* | drain* | fail*)
      scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true
      ;;
  esac
done
states=$(sinfo -h -N -o '%N %t %G' 2>/dev/null | sort -u | tr '\n' ' ')
case "$states" in
  *n1*n2*) ;;
  *)
    echo "slurm-cluster: the cluster did not come up; sinfo says: ${states:-nothing}" >&2
    tail -n 20 "$logs/slurmctld.log" >&2 || true
    exit 1
    ;;
esac
echo "slurm-cluster: up: $states"
