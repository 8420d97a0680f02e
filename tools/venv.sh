#!/usr/bin/env bash
# The Python environment (.venv/): Debian's python3 with python/requirements.txt, every
# package pinned. Made again only when the file changed (its hash is kept beside it), as
# npm ci is for the browser tests. The first one downloads torch's Linux wheels (several
# GB). Called by tools/setup.sh and bench/run.sh; needs python3 and python3-venv.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/requirements.sha256
want=$(sha256sum python/requirements.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing python/requirements.txt into .venv/ (the first time: a few minutes)"
  rm -rf .venv
  /usr/bin/python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r python/requirements.txt
  echo "$want" >"$stamp"
fi
