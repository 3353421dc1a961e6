# Session 20: vramledger.stats()["policy"] (PolicyFigures, read without the census walk) on the GPU:
# two streams, a cross-stream free, empty_cache; every figure present and plausible.
import json, torch, vramledger
vramledger.install("backend:vmm")
keep = [torch.empty(k << 20, dtype=torch.uint8, device="cuda") for k in range(1, 24)]
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    other = torch.ones(1 << 22, device="cuda")
keep[3].record_stream(side)
del keep
torch.cuda.synchronize()
torch.cuda.empty_cache()
policy = vramledger.stats()["policy"]
print(json.dumps(policy))
need = ["stream_heaps", "lane_choices", "locked_allocations", "unmaps_in_background",
        "unmaps_on_demand", "unmaps_pending", "host_waits", "peak_active_bytes"]
missing = [k for k in need if not isinstance(policy.get(k), int)]
assert not missing, missing
assert policy["stream_heaps"] >= 2, policy
assert policy["peak_active_bytes"] >= sum(k << 20 for k in range(1, 24)), policy
print("POLICY CHECK OK")
