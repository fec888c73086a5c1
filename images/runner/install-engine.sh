#!/bin/sh
# Downloads one IaC engine release (OpenTofu or Terraform) and installs its binary, verified twice:
#
#   1. the vendor's SHA256SUMS file must carry a good signature made by the key whose primary fingerprint
#      is FINGERPRINT (pinned in the Dockerfile), not merely by whatever key KEY_URL serves;
#   2. the archive's SHA-256 must be the one that signed file lists for it, and, when EXPECTED_SHA256 is
#      given, that one too (a build that pins the archive itself).
#
# Anything else (a download error, an unsigned or tampered checksum file, another signer, an archive
# missing from the list or with another hash, no binary in the archive) stops with exit 1 and a message.
#
# usage: install-engine.sh BINARY VERSION RELEASE_URL SIGNATURE_SUFFIX KEY_URL FINGERPRINT EXPECTED_SHA256 DEST
#
#   BINARY            tofu or terraform: the artifacts are BINARY_VERSION_linux_ARCH.zip,
#                     BINARY_VERSION_SHA256SUMS and BINARY_VERSION_SHA256SUMS.SIGNATURE_SUFFIX
#   VERSION           the release, e.g. 1.10.6; empty: install nothing (say so and exit 0)
#   RELEASE_URL       the URL of the directory holding that release's artifacts (a mirror works)
#   SIGNATURE_SUFFIX  gpgsig (OpenTofu) or sig (HashiCorp): the detached signature of the SHA256SUMS file
#   KEY_URL           where the vendor's public key (armored) is
#   FINGERPRINT       the primary fingerprint that must have made the signature (spaces are ignored)
#   EXPECTED_SHA256   the archive's SHA-256, or empty
#   DEST              the directory that receives the BINARY executable
#
# ARCH is TARGETARCH (set by BuildKit), else dpkg's architecture (amd64, arm64).
# Needs curl, gpg, sha256sum and python3 (which unpacks the zip archive).
set -eu

if [ "$#" -ne 8 ]; then
    sed -n 's/^# usage: //p' "$0" >&2
    exit 2
fi
binary=$1 version=$2 release_url=${3%/} suffix=$4 key_url=$5 expected_sha256=$7 dest=$8
fingerprint=$(printf '%s' "$6" | tr -d ' ' | tr 'a-f' 'A-F')

fail() {
    echo "install-engine: $binary $version: $*" >&2
    exit 1
}

if [ -z "$version" ]; then
    echo "install-engine: $binary: no version given, not installed"
    exit 0
fi
arch=${TARGETARCH:-$(dpkg --print-architecture)}
archive="${binary}_${version}_linux_${arch}.zip"
sums="${binary}_${version}_SHA256SUMS"
signature="$sums.$suffix"

work=$(mktemp -d)
trap 'gpgconf --homedir "$work/gnupg" --kill all 2>/dev/null; rm -rf "$work"' EXIT
cd "$work"

fetch() {
    curl --fail --silent --show-error --location --retry 3 --proto '=https,http' -o "$2" "$1" \
        || fail "cannot download $1"
}
fetch "$key_url" key.asc
fetch "$release_url/$sums" "$sums"
fetch "$release_url/$signature" "$signature"
fetch "$release_url/$archive" "$archive"

# 1. The signature, in a keyring of its own holding only the downloaded key.
export GNUPGHOME="$work/gnupg"
mkdir -m 0700 "$GNUPGHOME"
gpg --batch --quiet --import key.asc 2>/dev/null || fail "$key_url holds no usable OpenPGP key"
# VALIDSIG's last field is the fingerprint of the primary key of the (sub)key that signed.
signer=$(gpg --batch --status-fd 1 --verify "$signature" "$sums" 2>/dev/null \
    | awk '$1 == "[GNUPG:]" && $2 == "VALIDSIG" { print $NF }') || true
[ -n "$signer" ] || fail "$sums has no good signature ($signature) by the key from $key_url"
[ "$signer" = "$fingerprint" ] || fail "$sums is signed by $signer, not by the pinned key $fingerprint"

# 2. The archive against the signed list, and against the pinned hash when there is one.
listed=$(awk -v name="$archive" '$2 == name || $2 == "*" name { print $1 }' "$sums")
[ -n "$listed" ] || fail "$sums does not list $archive"
actual=$(sha256sum "$archive" | cut -d ' ' -f 1)
[ "$actual" = "$listed" ] || fail "$archive has SHA-256 $actual, but $sums says $listed"
if [ -n "$expected_sha256" ] && [ "$actual" != "$expected_sha256" ]; then
    fail "$archive has SHA-256 $actual, but the build pins $expected_sha256"
fi

python3 - "$archive" "$binary" "$dest" <<'PYTHON' || fail "$archive holds no $binary executable"
import os, shutil, sys, zipfile
archive, name, dest = sys.argv[1:]
with zipfile.ZipFile(archive) as z, z.open(name) as source:
    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(dest, name), "wb") as target:
        shutil.copyfileobj(source, target)
os.chmod(os.path.join(dest, name), 0o755)
PYTHON
echo "install-engine: $binary $version ($arch) verified (signed by $signer, SHA-256 $actual): $dest/$binary"
