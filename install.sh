#!/bin/sh
# Installs a cibox release binary, checking its checksum before anything of it runs:
#
#   sh install.sh --url URL --sha256 HEX [--to DIR]
#
# URL is the release's tarball for this machine (cibox-x86_64-unknown-linux-gnu.tar.gz
# or cibox-aarch64-unknown-linux-gnu.tar.gz, https:// or file://), HEX its sha256 from
# the release's SHA256SUMS, pinned by you (never read from where the tarball comes
# from). The tarball is downloaded to a temporary folder, checked, and only then
# unpacked; DIR (default ~/.local/bin) gets `cibox`, which then prints its version. A
# mismatch installs nothing and exits 1.
set -eu
url= sha= to=${HOME:-/root}/.local/bin
while [ $# -gt 0 ]; do
  case $1 in
    --url) url=${2:?--url needs a value}; shift 2 ;;
    --sha256) sha=${2:?--sha256 needs a value}; shift 2 ;;
    --to) to=${2:?--to needs a value}; shift 2 ;;
    *) echo "install.sh: unknown argument $1 (give --url URL --sha256 HEX [--to DIR])" >&2; exit 2 ;;
  esac
done
[ -n "$url" ] && [ -n "$sha" ] || { echo "install.sh: give --url URL --sha256 HEX" >&2; exit 2; }
case $sha in
  *[!0-9a-f]*) echo "install.sh: --sha256 must be 64 lower-case hex digits" >&2; exit 2 ;;
esac
[ ${#sha} -eq 64 ] || { echo "install.sh: --sha256 must be 64 lower-case hex digits" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
curl --fail --silent --show-error --location --proto '=https,file' --retry 3 \
  --output "$tmp/cibox.tar.gz" "$url"
if ! echo "$sha  $tmp/cibox.tar.gz" | sha256sum --check --status; then
  echo "install.sh: $url: sha256 $(sha256sum "$tmp/cibox.tar.gz" | cut -d' ' -f1), not the $sha given: nothing installed" >&2
  exit 1
fi
tar --extract --gzip --file "$tmp/cibox.tar.gz" --directory "$tmp" cibox
mkdir -p "$to"
install -m 0755 "$tmp/cibox" "$to/cibox.new"
mv -f "$to/cibox.new" "$to/cibox"
"$to/cibox" --version
