#!/bin/bash
# show_gids (Mellanox OFED's script; not packaged in Debian) from sysfs:
# DEV PORT INDEX GID IPv4 VER NETDEV, non-zero GIDs only. Usage: show_gids.sh [DEV]
# Only bash builtins in the loop: rxe has 1024 GID entries, and a fork+exec per entry
# costs minutes in a TCG guest.
shopt -s nullglob
printf '%-8s %-4s %-5s %-39s %-15s %-7s %s\n' DEV PORT INDEX GID IPv4 VER NETDEV
for d in /sys/class/infiniband/${1:-*}; do
  for p in "$d"/ports/*; do
    for g in "$p"/gids/*; do
      i="${g##*/}"; gid=""
      read -r gid 2>/dev/null < "$g" || continue
      [[ -z "$gid" || "$gid" == 0000:0000:0000:0000:0000:0000:0000:0000 ]] && continue
      ip4=""
      [[ "$gid" == 0000:0000:0000:0000:0000:ffff:* ]] && \
        ip4="$((16#${gid:30:2})).$((16#${gid:32:2})).$((16#${gid:35:2})).$((16#${gid:37:2}))"
      t=""; read -r t 2>/dev/null < "$p/gid_attrs/types/$i"
      nd=""; read -r nd 2>/dev/null < "$p/gid_attrs/ndevs/$i"
      case "$t" in "RoCE v2") v=v2 ;; "IB/RoCE v1") v=v1 ;; *) v="$t" ;; esac
      printf '%-8s %-4s %-5s %-39s %-15s %-7s %s\n' "${d##*/}" "${p##*/}" "$i" "$gid" "$ip4" "$v" "$nd"
    done
  done
done
