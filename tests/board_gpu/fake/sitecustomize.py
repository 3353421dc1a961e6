"""Put first on PYTHONPATH by tests/board_gpu/test_offline.py: every process of the run (driver,
instances, `vramledger top`) gets the stand-ins: `torch` from this folder, and before anything
imports them, `_common` and `vramledger._C` replaced by fake_common and fake_native."""

import sys

import fake_common
import fake_native

sys.modules["_common"] = fake_common
sys.modules["vramledger._C"] = fake_native
