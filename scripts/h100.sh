#!/usr/bin/env bash
# The full run on the GPU machine: scripts/gpu/harness.sh suite (its header
# says what it writes under $OUT).
exec bash "$(dirname "${BASH_SOURCE[0]}")/gpu/harness.sh" suite "$@"
