#!/bin/sh
# Run a shell script as root in a throwaway copy of this machine, for package tests that
# install, upgrade and purge a .deb with dpkg's maintainer scripts without touching the
# host: a private mount namespace (unshare -m) holding an overlay of / whose writable
# layer is a tmpfs, chrooted into, with the host's /proc, /dev and /sys bound and fresh
# /tmp and /run (no /run/systemd/system: maintainer scripts start no unit).
# Everything written is gone when the script ends.
#
# Usage: unshare -m --propagation private deb_sandbox.sh WORKDIR SCRIPT [FILE...]
#   WORKDIR  an empty directory for the mounts
#   SCRIPT   run with /bin/sh inside the copy, from /sandbox, where each FILE is copied
set -eu

work=$1
script=$2
shift 2

mount -t tmpfs -o size=4g,mode=0755 edgegw-sandbox "$work"
mkdir "$work/upper" "$work/work" "$work/root"
mount -t overlay edgegw-sandbox \
	-o "lowerdir=/,upperdir=$work/upper,workdir=$work/work" "$work/root"
root=$work/root
mount --rbind /proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --rbind /sys "$root/sys"
mount -t tmpfs tmpfs "$root/tmp"
mount -t tmpfs tmpfs "$root/run"
mkdir -p "$root/sandbox"
cp "$script" "$root/sandbox/script.sh"
for file in "$@"; do
	cp "$file" "$root/sandbox/"
done
exec chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
	DEBIAN_FRONTEND=noninteractive sh -c 'cd /sandbox && exec sh ./script.sh' </dev/null
