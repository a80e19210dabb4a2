#!/usr/bin/env bash
# On a machine with a GPU, a gpu test that skipped for want of a device is a failure (the build
# or the driver is broken), never a pass. Skips for want of more GPUs than the machine has stay
# skips. usage: tests/gpu/check_no_device_skips.sh LOG...   (ctest or pytest output)
set -u
nvidia-smi -L >/dev/null 2>&1 || exit 0
bad=$(grep -hE "SKIPPED.*(no CUDA device|no usable device|cannot run here|no usable CUDA)" "$@" 2>/dev/null | sort | uniq -c)
if [ -n "$bad" ]; then
  echo "FAIL: gpu tests skipped on a machine with a GPU:"
  echo "$bad"
  exit 1
fi
echo "no gpu test skipped for want of a device"
