#!/bin/sh
# Every include of an fpat/ header in the sources resolves at that path under include/ (no
# build-time links): an editor or a reader without a build follows it. Run from the source root.
status=0
for inc in $(grep -rhoE --include='*.cpp' --include='*.h' --include='*.cu' --include='*.cuh' \
  '#include [<"]fpat/[^">]+' src dsl include tests bench examples |
  sed 's/#include [<"]//' | sort -u); do
  [ -f "include/$inc" ] || {
    echo "check_includes: '$inc' is not at include/$inc"
    status=1
  }
done
exit $status
