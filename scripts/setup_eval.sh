# Sourced by test.sh, or run: the environment of setup_env.sh plus the downstream suite's data
# (docs/evaluate.md), all from the package registries, read where they install:
#   Debian: promod3-data (PDB chains with DSSP), metastudent-data (Swiss-Prot with GO terms),
#           ncbi-blast+ (blastdbcmd reads those databases), mmseqs2 (homology-aware splits);
#   PyPI:   mavenn 1.1.4 (deep mutational scans), installed with --no-deps and never imported.
# As root the Debian packages are installed (apt-get update first); otherwise one sentence says
# which command to ask an administrator for.
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"

ADVPT_EVAL_DEBS=(promod3-data metastudent-data ncbi-blast+ mmseqs2)
missing_debs=()
for deb in "${ADVPT_EVAL_DEBS[@]}"; do
    dpkg -s "$deb" >/dev/null 2>&1 || missing_debs+=("$deb")
done
if [ "${#missing_debs[@]}" -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        echo "[advpt] installing ${missing_debs[*]} (Debian; about 600 MB)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing_debs[@]}" >/dev/null
    else
        echo "[advpt] the downstream suite needs: sudo apt-get install ${missing_debs[*]}" >&2
    fi
fi
if ! python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('mavenn') is None)"
then
    echo "[advpt] installing mavenn 1.1.4 (its data files only: --no-deps)"
    python -m pip install --quiet --no-deps mavenn==1.1.4
fi
