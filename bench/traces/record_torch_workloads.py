#!/usr/bin/env python3
"""Records allocation traces of real models under PyTorch's own allocator.

Each workload runs in a fresh process with torch's memory history on, then its snapshot is
converted to a vramledger workload trace (docs/workload_trace_format.md) and PyTorch's own
figures for that run (peak reserved, peak requested) are stored next to it.

    python3 bench/traces/record_torch_workloads.py --out bench/traces/corpus [--only gpt2_train]
    python3 bench/traces/record_torch_workloads.py --alloc-conf expandable_segments:True ...

Models are built from configurations with random weights: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch_snapshot_to_workload as converter  # noqa: E402


def _seed(seed: int = 0) -> random.Random:
    import torch

    torch.manual_seed(seed)
    return random.Random(seed)


def gpt2_train(steps: int) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    rng = _seed()
    model = GPT2LMHeadModel(GPT2Config()).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(steps):
        seq = rng.choice(range(128, 1025, 64))
        ids = torch.randint(0, 50257, (8, seq), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def llama_train(steps: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    rng = _seed()
    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                         num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                         max_position_embeddings=2048)
    model = LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(steps):
        seq = rng.choice(range(128, 2049, 128))
        ids = torch.randint(0, 32000, (4, seq), device="cuda")
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def gpt2_generate(steps: int) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    rng = _seed()
    model = GPT2LMHeadModel(GPT2Config()).to(device="cuda", dtype=torch.float16).eval()
    with torch.no_grad():
        for _ in range(steps):
            batch = rng.choice([1, 2, 4, 8, 16])
            prompt = rng.choice(range(16, 257, 16))
            new = rng.choice(range(16, 129, 16))
            ids = torch.randint(0, 50257, (batch, prompt), device="cuda")
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                           min_new_tokens=new, do_sample=False, pad_token_id=0)


def _vision_train(model, steps: int, batches, size: int, autocast: bool) -> None:
    import torch

    rng = _seed()
    model = model.cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(steps):
        batch = rng.choice(batches)
        x = torch.randn(batch, 3, size, size, device="cuda").to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def resnet50_train(steps: int) -> None:
    import torchvision

    _vision_train(torchvision.models.resnet50(weights=None), steps, [32, 48, 64, 96, 128], 224,
                  autocast=False)


def vit_train(steps: int) -> None:
    import torchvision

    _vision_train(torchvision.models.vit_b_16(weights=None), steps, [16, 24, 32, 48, 64], 224,
                  autocast=True)


def t5_train(steps: int) -> None:
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    rng = _seed()
    config = T5Config(num_layers=6, num_decoder_layers=6, d_model=512, d_ff=2048, num_heads=8,
                      vocab_size=32128, decoder_start_token_id=0, pad_token_id=0)
    model = T5ForConditionalGeneration(config).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(steps):
        src = rng.choice(range(64, 513, 32))
        tgt = rng.choice(range(16, 257, 16))
        inputs = torch.randint(0, 32128, (16, src), device="cuda")
        labels = torch.randint(0, 32128, (16, tgt), device="cuda")
        loss = model(input_ids=inputs, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def segmentation_train(steps: int) -> None:
    """Conv-heavy dense prediction (DeepLabV3-ResNet50) with variable image sizes."""
    import torch
    import torchvision

    rng = _seed()
    model = torchvision.models.segmentation.deeplabv3_resnet50(
        weights=None, weights_backbone=None, num_classes=21, aux_loss=False).cuda()
    model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(steps):
        size = rng.choice([256, 320, 384, 448, 512])
        x = torch.randn(8, 3, size, size, device="cuda").to(memory_format=torch.channels_last)
        y = torch.randint(0, 21, (8, size, size), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x)["out"], y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def two_stream(steps: int) -> None:
    """Inputs copied on a side stream, handed over with record_stream, consumed on the main one."""
    import torch

    rng = _seed()
    model = torch.nn.Sequential(
        torch.nn.Linear(4096, 8192), torch.nn.GELU(), torch.nn.Linear(8192, 8192), torch.nn.GELU(),
        torch.nn.Linear(8192, 4096)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    side = torch.cuda.Stream()
    host = [torch.randn(rows, 4096).pin_memory() for rows in (512, 1024, 2048, 4096, 8192)]
    for _ in range(steps * 4):
        batch = rng.choice(host)
        with torch.cuda.stream(side):
            x = batch.to("cuda", non_blocking=True)
            y = (x * 2).sum(dim=1, keepdim=True)
        torch.cuda.current_stream().wait_stream(side)
        x.record_stream(torch.cuda.current_stream())
        y.record_stream(torch.cuda.current_stream())
        loss = ((model(x).sum(dim=1, keepdim=True) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, y, loss


WORKLOADS = {
    "gpt2_train": (gpt2_train, 25),
    "llama_train": (llama_train, 20),
    "gpt2_generate": (gpt2_generate, 12),
    "resnet50_train": (resnet50_train, 20),
    "vit_train": (vit_train, 20),
    "t5_train": (t5_train, 20),
    "segmentation_train": (segmentation_train, 12),
    "two_stream": (two_stream, 20),
}


def run_one(name: str, out_dir: Path) -> None:
    """Child process: run one workload with history on and write its trace and figures."""
    import torch

    func, steps = WORKLOADS[name]
    # Only runs under the default allocator are traced (cudaMallocAsync cannot record history;
    # the others need only their figures).
    tracing = not os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if tracing:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                 max_entries=5_000_000)
    start = time.time()
    func(steps)
    torch.cuda.synchronize()
    seconds = time.time() - start
    snapshot = torch.cuda.memory._snapshot() if tracing else None
    if tracing:
        torch.cuda.memory._record_memory_history(enabled=None)
    stats = torch.cuda.memory_stats()
    figures = {
        "workload": name,
        "steps": steps,
        "seconds": round(seconds, 3),
        "torch_version": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "peak_reserved_bytes": stats["reserved_bytes.all.peak"],
        "peak_requested_bytes": stats["requested_bytes.all.peak"],
        "peak_allocated_bytes": stats["allocated_bytes.all.peak"],
        "num_alloc_retries": stats["num_alloc_retries"],
    }
    figures["overhead_ratio"] = figures["peak_reserved_bytes"] / figures["peak_requested_bytes"]
    tag = name if not figures["alloc_conf"] else name + "." + _conf_tag(figures["alloc_conf"])
    if tracing:
        summary = converter.write_workload(snapshot, out_dir / f"{name}.vlt.gz",
                                           source=f"torch {torch.__version__} {name}",
                                           torch_figures=figures)
        figures.update({"trace_" + k: v for k, v in summary.items()})
    (out_dir / f"{tag}.json").write_text(json.dumps(figures, indent=1) + "\n")
    print(json.dumps(figures))


def _conf_tag(conf: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in conf).strip("_")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE / "corpus")
    parser.add_argument("--only", action="append", choices=sorted(WORKLOADS))
    parser.add_argument("--alloc-conf", action="append", default=None,
                        help="also run under these PYTORCH_CUDA_ALLOC_CONF values (figures only)")
    parser.add_argument("--no-native", action="store_true",
                        help="skip the run under PyTorch's default allocator (and its trace)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        run_one(args.child, args.out)
        return 0
    failures = 0
    confs = ([] if args.no_native else [""]) + (args.alloc_conf or [])
    for name in args.only or list(WORKLOADS):
        for conf in confs:
            env = dict(os.environ)
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            if conf:
                env["PYTORCH_CUDA_ALLOC_CONF"] = conf
            result = subprocess.run([sys.executable, __file__, "--out", str(args.out), "--child",
                                     name], env=env)
            if result.returncode != 0:
                print(f"workload {name} (conf {conf!r}) failed: exit {result.returncode}",
                      file=sys.stderr)
                failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
