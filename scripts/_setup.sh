# Shared by scripts/lab and scripts/test: create .venv and install this checkout into it.
setup_venv() {
  local extras="$1"
  local python="${PYTHON:-python3}"
  if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "jupyter-gpu-pool needs Python 3.11 or newer; $python is $("$python" --version 2>&1). Set PYTHON=python3.11." >&2
    exit 1
  fi
  if [ ! -x .venv/bin/python ]; then
    echo "==> creating .venv"
    "$python" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
  fi
  # Reinstall only when the project's metadata changed since the last install.
  local stamp=".venv/.installed-$extras"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ -n "$(find labextension -newer "$stamp" -not -path '*/node_modules*' -not -path '*/lib/*' -not -path '*/test-build*' -not -name '*.tsbuildinfo' 2>/dev/null | head -1)" ]; then
    echo "==> installing jupyter-gpu-pool[$extras] into .venv (first time: a few minutes)"
    .venv/bin/python -m pip install -q -e ".[$extras]"
    touch "$stamp"
  fi
}
