#!/usr/bin/env bash
# envpipe-entrypoint: `worker` runs sshd on 2222 in the foreground (pdsh/deepspeed connect to it);
# `launcher` (or any other command) prepares the ssh client and runs that command; `node CMD...` is one
# pod of an Indexed Job: sshd as in `worker` on every node, and node 0 (JOB_COMPLETION_INDEX 0) also
# runs CMD, the job's launcher, whose exit status is the container's.
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
    if [ "${JOB_COMPLETION_INDEX:-0}" != 0 ]; then exec /usr/sbin/sshd -D -e -f "$SSHD_CONFIG"; fi
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
