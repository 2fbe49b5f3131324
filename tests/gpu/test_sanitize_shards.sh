#!/bin/sh
# sanitize.sh's shards, without a GPU: a stand-in suite (five test cases, a GPU that answers)
# and a stand-in compute-sanitizer that prints the suite arguments it was given. The shards of
# one N must partition the cases; a shard that is not I/N, or holds no case, must fail.
# usage: test_sanitize_shards.sh SANITIZE_SH
set -e
script=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/suite" <<'SUITE'
#!/bin/sh
[ "$1" = --list_content ] && printf 'a*\nb*\nc*\nd*\ne*\n' >&2
exit 0
SUITE
cat >"$dir/compute-sanitizer" <<'TOOL'
#!/bin/sh
for a in "$@"; do case $a in --run_test=*) echo "${a#--run_test=}" ;; esac; done
TOOL
chmod +x "$dir/suite" "$dir/compute-sanitizer"
run() { PATH="$dir:$PATH" sh "$script" racecheck "$dir/suite" "$@"; }
for n in 1 2 3 5; do
  got=$(i=1; while [ $i -le $n ]; do run $i/$n | tail -n 1 | tr , '\n'; i=$((i + 1)); done | sort | paste -sd, -)
  [ "$got" = a,b,c,d,e ] || { echo "shards of $n: $got, not a,b,c,d,e"; exit 1; }
done
[ "$(run 2/2 | tail -n 1)" = b,d ] || { echo "shard 2/2 is not b,d"; exit 1; }
for bad in 0/2 3/2 x/2 /2 6/7; do  # 6/7: an empty shard
  if run $bad >/dev/null 2>&1; then echo "shard '$bad' was accepted"; exit 1; fi
done
echo "shards partition the suite"
