# shellcheck shell=bash
# wait_for_free_gpu: returns once the GPU's memory in use is under 2 GiB (at most 60 s), so a
# phase does not start while a process killed before it (a timed-out run) still holds the GPU:
# a process with 100+ GiB of pinned host memory takes seconds to exit. Sourced by the drivers.
wait_for_free_gpu() {
  local used waited
  for waited in $(seq 0 60); do
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2> /dev/null |
      head -n 1)
    [ -z "$used" ] || [ "$used" -lt 2048 ] && return 0
    [ "$waited" = 0 ] && echo "waiting for the GPU: ${used} MiB in use"
    sleep 1
  done
  echo "the GPU still has ${used} MiB in use after 60 s; going on"
}
