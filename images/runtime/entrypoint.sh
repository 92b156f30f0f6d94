#!/usr/bin/env bash
# envpipe-entrypoint: `worker` runs sshd on 2222 in the foreground (pdsh/deepspeed connect to it);
# `launcher` (or any other command) prepares the ssh client and runs that command; `node CMD...` is one
# pod of an Indexed Job: sshd as in `worker` on every node, and node 0 (JOB_COMPLETION_INDEX 0) also
# runs CMD, the job's launcher, whose exit status is the container's. With ENVPIPE_LAUNCHER_NODE=HOST:PORT
# (node 0's sshd), a node > 0 ends, with status 0, once node 0, reached before, stops answering three times in
# a row (ENVPIPE_LAUNCHER_POLL_S apart, default 5): so the Job completes where the cluster has no Job
# successPolicy to end it on node 0's success (Kubernetes before 1.31).
# Keys: ENVPIPE_SSH_AUTHORIZED_KEYS (text) or a file mounted at $ENVPIPE_SSH_DIR/authorized_keys;
# the launcher's private key at $ENVPIPE_SSH_DIR/id_ed25519. Host keys are made at start, per pod.
set -euo pipefail

SSH_DIR="${ENVPIPE_SSH_DIR:-/etc/envpipe/ssh}"
SSHD_CONFIG="${ENVPIPE_SSHD_CONFIG:-/etc/ssh/sshd_envpipe_config}"
HOME_SSH="${HOME}/.ssh"

die() { echo "envpipe-entrypoint: $*" >&2; exit 2; }

install_client_config() {
  mkdir -p "$HOME_SSH" && chmod 700 "$HOME_SSH"
  if [ -f "$SSH_DIR/id_ed25519" ]; then
    install -m 600 "$SSH_DIR/id_ed25519" "$HOME_SSH/id_ed25519"
  fi
  # Workers are pods that come and go: their host keys are new on every start.
  cat > "$HOME_SSH/config" <<CFG
Host *
  Port 2222
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
CFG
  chmod 600 "$HOME_SSH/config"
}

install_authorized_keys() {
  local keys="${ENVPIPE_SSH_AUTHORIZED_KEYS:-}"
  if [ -z "$keys" ] && [ -f "$SSH_DIR/authorized_keys" ]; then
    keys="$(cat "$SSH_DIR/authorized_keys")"
  fi
  [ -n "$keys" ] || die "worker needs a public key: set ENVPIPE_SSH_AUTHORIZED_KEYS or mount $SSH_DIR/authorized_keys"
  printf '%s\n' "$keys" > "$HOME_SSH/authorized_keys"
  chmod 600 "$HOME_SSH/authorized_keys"
}

# The pod's own variables reach the processes that pdsh starts through sshd (see sshd_config).
install_session_environment() {
  local names name file="$HOME_SSH/environment"
  names="$(awk '$1 == "PermitUserEnvironment" { print $2 }' "$SSHD_CONFIG" | tr ',' ' ')"
  : > "$file"
  chmod 600 "$file"
  for name in $names; do
    if [ -n "${!name+set}" ]; then printf '%s=%s\n' "$name" "${!name}" >> "$file"; fi
  done
}

generate_host_keys() {
  local dir="$HOME_SSH/hostkeys"
  mkdir -p "$dir" && chmod 700 "$dir"
  [ -f "$dir/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$dir/ssh_host_ed25519_key"
  [ -f "$dir/ssh_host_rsa_key" ] || ssh-keygen -q -t rsa -b 3072 -N '' -f "$dir/ssh_host_rsa_key"
}

# sshd until node 0 (the job's launcher, at $1 = HOST:PORT) has ended; sshd's own end is the node's.
serve_until_launcher_ends() {
  local host="${1%:*}" port="${1##*:}" poll="${ENVPIPE_LAUNCHER_POLL_S:-5}" seen=0 missed=0 sshd
  /usr/sbin/sshd -D -e -f "$SSHD_CONFIG" &
  sshd=$!
  trap 'kill "$sshd" 2>/dev/null; wait "$sshd"; exit 143' TERM INT
  while kill -0 "$sshd" 2>/dev/null; do
    if timeout "$poll" bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$host" "$port" 2>/dev/null; then
      seen=1 missed=0
    elif [ "$seen" = 1 ]; then
      missed=$((missed + 1))
      if [ "$missed" -ge 3 ]; then
        echo "envpipe-entrypoint: node 0 ($1) has ended: stopping sshd" >&2
        kill "$sshd"
        wait "$sshd" || true
        exit 0
      fi
    fi
    sleep "$poll" &
    wait "$!"
  done
  wait "$sshd"
}

mode="${1:-worker}"
case "$mode" in
  worker)
    install_client_config
    install_authorized_keys
    install_session_environment
    generate_host_keys
    exec /usr/sbin/sshd -D -e -f "$SSHD_CONFIG"
    ;;
  node)
    shift
    [ "$#" -gt 0 ] || die "node needs the command that node 0 runs, e.g. 'node deepspeed --hostfile /job/hostfile train.py'"
    install_client_config
    install_authorized_keys
    install_session_environment
    generate_host_keys
    if [ "${JOB_COMPLETION_INDEX:-0}" != 0 ]; then
      if [ -n "${ENVPIPE_LAUNCHER_NODE:-}" ]; then serve_until_launcher_ends "$ENVPIPE_LAUNCHER_NODE"; fi
      exec /usr/sbin/sshd -D -e -f "$SSHD_CONFIG"
    fi
    # node 0: its sshd in the background (pdsh logs into every node, this one too); the command takes
    # this process's place, so tini's signals reach it and its exit status ends the container
    /usr/sbin/sshd -D -e -f "$SSHD_CONFIG" &
    exec "$@"
    ;;
  launcher)
    shift
    [ "$#" -gt 0 ] || die "launcher needs a command, e.g. 'launcher deepspeed --hostfile /job/hostfile train.py'"
    install_client_config
    exec "$@"
    ;;
  *)
    install_client_config
    exec "$@"
    ;;
esac
