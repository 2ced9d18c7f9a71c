#!/usr/bin/env bash
# Builds Debian packages of gpuctld, gpud and gpuctl into target/debian/ (cargo-deb;
# installed with `cargo install cargo-deb` when missing). Each carries its program, its
# systemd unit (gpuctld, gpud), and: the reference config /etc/gpuctl/gpuctld.toml, the
# alert rules and Grafana dashboard (gpuctld); the man page and bash, zsh and fish
# completions (gpuctl).
#
#   scripts/build-debs.sh        then: apt install ./target/debian/gpuctld_*.deb ...
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
command -v cargo-deb >/dev/null 2>&1 || cargo install --locked cargo-deb
cargo build --release -p gpuctl -p gpuctld -p gpud -p gpuctl-sim
assets=target/release/assets
mkdir -p "$assets"
target/release/gpuctl man >"$assets/gpuctl.1"
target/release/gpuctl completions bash >"$assets/gpuctl.bash"
target/release/gpuctl completions zsh >"$assets/_gpuctl"
target/release/gpuctl completions fish >"$assets/gpuctl.fish"
for p in gpuctld gpud gpuctl; do
  cargo deb --no-build -p "$p"
done
ls -l target/debian/*.deb
