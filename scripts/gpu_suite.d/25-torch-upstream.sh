# shellcheck shell=bash
# PyTorch's own allocator tests, native vs vramledger (scripts/torch_upstream_tests.sh; issue 12).
# Runs after 20-torch-plugin.sh, whose build ($BUILD) and staged package (build-torch-gpu-stage/)
# it reuses. The upstream file is git-ignored (.upstream/test_cuda_allocator.py, carried to the
# device machine by hand): without it this hook only says so. A measurement: failing tests do not
# fail the suite; a runner that breaks does.
# VRAMLEDGER_TORCH_UPSTREAM_MAX_S caps this hook (default 540 s) so later hooks keep time.
upstream_file=${VRAMLEDGER_UPSTREAM_TESTS:-.upstream/test_cuda_allocator.py}
if [[ ! -f "$upstream_file" ]]; then
  add_summary "torch upstream tests: skipped (no $upstream_file; see scripts/torch_upstream_tests.sh)"
else
  upstream_budget=$(( $(remaining) - 10 ))
  upstream_cap=${VRAMLEDGER_TORCH_UPSTREAM_MAX_S:-540}
  (( upstream_budget > upstream_cap )) && upstream_budget=$upstream_cap
  if (( upstream_budget < 150 )); then
    add_summary "torch upstream tests: skipped (only ${upstream_budget}s of budget left)"
  else
    upstream_args=("$upstream_file" --build-dir "$BUILD" --budget "$upstream_budget")
    (( QUICK )) && upstream_args+=(--run-max 120)
    # Its own limits keep it inside the budget; the outer timeout is a backstop.
    timeout --kill-after=10 $(( upstream_budget + 30 )) \
      bash scripts/torch_upstream_tests.sh "${upstream_args[@]}" >"$LOGS/torch_upstream.log" 2>&1
    upstream_status=$?
    add_summary "torch upstream: $(tail -n 1 "$LOGS/torch_upstream.log") (exit $upstream_status)"
    (( upstream_status != 0 )) && FAILURES=$((FAILURES + 1))
  fi
fi
