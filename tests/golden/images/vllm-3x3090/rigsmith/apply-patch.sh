#!/bin/sh
# rigsmith image-build helper: applies one patch inside `docker build` / `podman build`.
# usage: apply-patch.sh python-package|path PACKAGE|DIR STRIP PATCHFILE [PYTHON]
# python-package: the patch is applied in the directory that holds the installed package (site-packages),
# so a `git diff` of the package's source tree applies with STRIP=1.
set -eu
kind=$1 where=$2 strip=$3 file=$4 python=${5:-python3}
case $kind in
  python-package)
    dir=$("$python" -c 'import importlib.util, os, sys
spec = importlib.util.find_spec(sys.argv[1])
if spec is None or spec.origin is None:
    sys.exit("package " + sys.argv[1] + " is not installed")
print(os.path.dirname(os.path.dirname(spec.origin)))' "$where") || {
      echo "apply-patch: cannot locate python package $where with $python" >&2
      exit 1
    } ;;
  path) dir=$where ;;
  *) echo "apply-patch: unknown target kind $kind" >&2; exit 2 ;;
esac
cd "$dir"
patch -p"$strip" -N -i "$file" || {
  echo "apply-patch: $(basename "$file") does not apply in $dir (wrong base image or patch version?)" >&2
  exit 1
}
echo "apply-patch: applied $(basename "$file") in $dir"
