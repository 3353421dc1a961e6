# Replays the trace corpus (bench/traces/corpus) on the real backends of GPU 0: peak reserved
# against peak requested, driver calls and host time per trace and backend. Needs CLI11: the
# device call carries it in .deps/include (copy /usr/include/CLI there and name .deps in carry).
if ! run_step replay_build 240 "$LOGS/replay_build.log" ninja -C "$BUILD" bench/replay/vramledger-replay; then
  add_summary "replay: not built (see replay_build.log; CLI11 missing?)"
  FAILURES=$((FAILURES + 1))
else
  replay_confs=(--conf backend:vmm --conf backend:cuda_malloc --conf backend:malloc_async)
  (( QUICK )) && replay_confs=(--conf backend:vmm --conf backend:cuda_malloc)
  if run_step replay 180 "$LOGS/replay.txt" "$BUILD/bench/replay/vramledger-replay" --check \
       "${replay_confs[@]}" "$REPO"/bench/traces/corpus/*.vlt.gz; then
    add_summary "replay: $(grep -c ' on vmm' "$LOGS/replay.txt") traces on vmm; table in replay.txt"
  else
    add_summary "replay: failed (see replay.txt)"
    FAILURES=$((FAILURES + 1))
  fi
  [[ -n "${OUT:-}" ]] && cp "$LOGS/replay.txt" "$OUT/replay.txt"
fi
