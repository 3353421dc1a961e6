#!/bin/sh
# The preload tests: preload_test with and without the shim over the fake driver.
# usage: run_preload_tests.sh check|torch|bench PRELOAD_TEST SHIM LIBDIR [TORCH_PLUGIN]
set -eu
mode=$1 test=$2 shim=$3 libdir=$4
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
case "$mode" in
check)
  without=$(VRAMLEDGER_PRELOAD_LOG=0 "$test" check | grep '^RESULT')
  LD_PRELOAD="$shim" "$test" check >with.out 2>stderr.preload || { cat stderr.preload; exit 1; }
  cat stderr.preload
  with=$(grep '^RESULT' with.out)
  grep -q '^vramledger-preload: tracking' stderr.preload || { echo "no load log line"; exit 1; }
  if [ "$without" != "$with" ]; then
    echo "results differ with the shim:"; echo "$without" > without.txt; echo "$with" > with.txt
    diff without.txt with.txt || true
    exit 1
  fi
  echo "identical results with and without the shim ($(echo "$with" | wc -l) calls)"
  # The load line can be silenced.
  [ -z "$(LD_PRELOAD="$shim" VRAMLEDGER_PRELOAD_LOG=0 "$test" check 2>&1 >/dev/null | grep vramledger-preload || true)" ]
  ;;
route)
  # Routing on (default set): the cache beside the shim serves user cuMemAlloc / cudaMalloc.
  LD_PRELOAD="$shim" VRAMLEDGER_PRELOAD_ROUTE=1 "$test" route 2>stderr.route || { cat stderr.route; exit 1; }
  cat stderr.route
  grep -q '^vramledger-preload: routing cuMemAlloc/cudaMalloc of ' stderr.route || { echo "no routing log line"; exit 1; }
  # A malformed setting: one clear line, nothing routed, the program unaffected.
  LD_PRELOAD="$shim" VRAMLEDGER_PRELOAD_ROUTE=cublas,torch "$test" check >/dev/null 2>stderr.bad || { cat stderr.bad; exit 1; }
  grep -q "NOT routing.*'torch' is not a routable library" stderr.bad || { cat stderr.bad; echo "no refusal line"; exit 1; }
  LD_PRELOAD="$shim" VRAMLEDGER_PRELOAD_ROUTE=1 VRAMLEDGER_PRELOAD_ROUTE_CONF=round_bytes:3 "$test" check >/dev/null 2>stderr.bad || { cat stderr.bad; exit 1; }
  grep -q "NOT routing.*ROUTE_CONF" stderr.bad || { cat stderr.bad; echo "no config refusal line"; exit 1; }
  echo "routing: checks passed, malformed settings refused"
  ;;
torch)
  LD_PRELOAD="$shim" VRAMLEDGER_PRELOAD_INSTALL_TORCH=1 VRAMLEDGER_TORCH_PLUGIN="$5" "$test" torch
  ;;
bench)
  echo "without shim:"; "$test" bench 300000
  echo "with shim:"; LD_PRELOAD="$shim" VRAMLEDGER_PRELOAD_LOG=0 "$test" bench 300000
  ;;
esac
