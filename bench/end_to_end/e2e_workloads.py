"""The real-model workloads of the end-to-end comparison (compare_allocators.py): how each model
is built, the seeded schedule of shapes it runs, and one step. torch is imported only by the
child processes, so these functions take it as an argument."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple


def global_mean_pool(torch):
    """A module that stands in for AdaptiveAvgPool2d(1), whose CUDA backward has no
    deterministic kernel (the same figures, computed as a mean)."""

    class GlobalMeanPool(torch.nn.Module):
        def forward(self, x):
            return x.mean(dim=(2, 3), keepdim=True)

    return GlobalMeanPool()


def class_loss(torch, logits, labels):
    """Cross-entropy through log_softmax + gather: gather's backward is deterministic under
    use_deterministic_algorithms, torch's CUDA nll_loss has no deterministic implementation."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -logp.gather(-1, labels.unsqueeze(-1)).mean()


def build_on_gpu(torch, make: Callable[[], Any]) -> Tuple[Any, str]:
    """Builds a model with its parameters created (and randomly initialised) on the GPU, which
    is several times quicker than on the CPU; falls back to the CPU if a library refuses."""
    try:
        with torch.device("cuda"):
            return make(), "cuda"
    except Exception as error:  # noqa: BLE001 -- any refusal: the slow path still works
        print(f"building on the GPU failed ({error!r}); building on the CPU", flush=True)
        return make().cuda(), "cpu"


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    steps: int
    warmup: int
    record_kind: str                                   # "loss_hex" or "tokens_sha256"
    schedule: Callable[[random.Random, int], List[Dict[str, int]]]
    build: Callable[[Any], Dict[str, Any]]             # torch -> state
    step: Callable[[Any, Dict[str, Any], Dict[str, int]], Any]


def _gpt2_train_schedule(rng: random.Random, steps: int) -> List[Dict[str, int]]:
    return [{"batch": 8, "seq": rng.choice(range(128, 1025, 64))} for _ in range(steps)]


def _gpt2_train_build(torch) -> Dict[str, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config()
    model, built_on = build_on_gpu(torch, lambda: GPT2LMHeadModel(config))
    model.train()
    return {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=1e-4),
            "vocab": config.vocab_size, "built_on": built_on}


def _lm_train_step(torch, state, shape, autocast: bool):
    ids = torch.randint(0, state["vocab"], (shape["batch"], shape["seq"]), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        logits = state["model"](input_ids=ids).logits
    loss = class_loss(torch, logits[:, :-1], ids[:, 1:])
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad(set_to_none=True)
    return loss.detach()


def _llama_train_schedule(rng: random.Random, steps: int) -> List[Dict[str, int]]:
    return [{"batch": 4, "seq": rng.choice(range(128, 2049, 128))} for _ in range(steps)]


def _llama_train_build(torch) -> Dict[str, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                         num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                         max_position_embeddings=2048)
    model, built_on = build_on_gpu(torch, lambda: LlamaForCausalLM(config))
    model = model.to(dtype=torch.bfloat16).train()
    return {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=1e-4),
            "vocab": config.vocab_size, "built_on": built_on}


def _gpt2_generate_schedule(rng: random.Random, steps: int) -> List[Dict[str, int]]:
    return [{"batch": rng.choice([1, 2, 4, 8, 16]), "prompt": rng.choice(range(16, 257, 16)),
             "new_tokens": rng.choice(range(8, 65, 8))} for _ in range(steps)]


def _gpt2_generate_build(torch) -> Dict[str, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config()
    model, built_on = build_on_gpu(torch, lambda: GPT2LMHeadModel(config))
    model = model.to(dtype=torch.float16).eval()
    return {"model": model, "vocab": config.vocab_size, "built_on": built_on}


def _gpt2_generate_step(torch, state, shape):
    ids = torch.randint(0, state["vocab"], (shape["batch"], shape["prompt"]), device="cuda")
    with torch.no_grad():
        out = state["model"].generate(ids, attention_mask=torch.ones_like(ids),
                                      max_new_tokens=shape["new_tokens"],
                                      min_new_tokens=shape["new_tokens"], do_sample=False,
                                      pad_token_id=0)
    return out.cpu()  # tokens go back to the host, as a server's would


def _resnet50_schedule(rng: random.Random, steps: int) -> List[Dict[str, int]]:
    return [{"batch": rng.choice([32, 48, 64, 96, 128]), "size": 224} for _ in range(steps)]


def _resnet50_build(torch) -> Dict[str, Any]:
    import torchvision

    def make():
        model = torchvision.models.resnet50(weights=None)
        model.avgpool = global_mean_pool(torch)
        return model

    model, built_on = build_on_gpu(torch, make)
    model = model.to(memory_format=torch.channels_last).train()
    return {"model": model, "built_on": built_on,
            "opt": torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)}


def _resnet50_step(torch, state, shape):
    x = torch.randn(shape["batch"], 3, shape["size"], shape["size"], device="cuda")
    x = x.to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (shape["batch"],), device="cuda")
    loss = class_loss(torch, state["model"](x), y)
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad(set_to_none=True)
    return loss.detach()


def _resnet50_side_stream_step(torch, state, shape):
    """Inputs made on a side stream (as a data loader's copy stream would), handed to the main
    stream with an event and record_stream: their blocks are freed while the other stream may
    still use them, which an allocator must not reuse too early or hold too long."""
    main = torch.cuda.current_stream()
    side = state.setdefault("side_stream", torch.cuda.Stream())
    generator = state.setdefault("side_generator", torch.Generator(device="cuda"))
    if "seeded" not in state:
        generator.manual_seed(1234)
        state["seeded"] = True
    with torch.cuda.stream(side):
        side.wait_stream(main)  # the previous step's reads of the last batch are ordered first
        raw = torch.randint(0, 256, (shape["batch"], shape["size"], shape["size"], 3),
                            dtype=torch.uint8, device="cuda", generator=generator)
        x = (raw.permute(0, 3, 1, 2).float() / 255.0).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (shape["batch"],), device="cuda", generator=generator)
        del raw
    main.wait_stream(side)
    x.record_stream(main)
    y.record_stream(main)
    loss = class_loss(torch, state["model"](x), y)
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad(set_to_none=True)
    return loss.detach()


def _vit_schedule(rng: random.Random, steps: int) -> List[Dict[str, int]]:
    return [{"batch": rng.choice([16, 32, 48, 64, 96])} for _ in range(steps)]


def _vit_build(torch) -> Dict[str, Any]:
    import torchvision

    model, built_on = build_on_gpu(torch, lambda: torchvision.models.vit_b_16(weights=None))
    model.train()
    return {"model": model, "built_on": built_on,
            "opt": torch.optim.AdamW(model.parameters(), lr=1e-4)}


def _vit_step(torch, state, shape):
    x = torch.randn(shape["batch"], 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (shape["batch"],), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = state["model"](x)
    loss = class_loss(torch, logits, y)
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad(set_to_none=True)
    return loss.detach()


def _t5_schedule(rng: random.Random, steps: int) -> List[Dict[str, int]]:
    return [{"batch": 16, "source": rng.choice(range(64, 513, 32)),
             "target": rng.choice(range(16, 129, 16))} for _ in range(steps)]


def _t5_build(torch) -> Dict[str, Any]:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(d_model=512, d_ff=2048, d_kv=64, num_layers=6, num_decoder_layers=6,
                      num_heads=8, vocab_size=32128, decoder_start_token_id=0, pad_token_id=0)
    model, built_on = build_on_gpu(torch, lambda: T5ForConditionalGeneration(config))
    model.train()
    return {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=1e-4),
            "vocab": config.vocab_size, "built_on": built_on}


def _t5_step(torch, state, shape):
    source = torch.randint(1, state["vocab"], (shape["batch"], shape["source"]), device="cuda")
    target = torch.randint(1, state["vocab"], (shape["batch"], shape["target"]), device="cuda")
    decoder_input = torch.nn.functional.pad(target[:, :-1], (1, 0))  # shifted right, start 0
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = state["model"](input_ids=source, decoder_input_ids=decoder_input).logits
    loss = class_loss(torch, logits, target)
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad(set_to_none=True)
    return loss.detach()


WORKLOADS: Dict[str, Workload] = {w.name: w for w in [
    Workload("gpt2_train", "GPT-2 small training, bf16 autocast, AdamW, batch 8, seq 128-1024",
             12, 3, "loss_hex", _gpt2_train_schedule, _gpt2_train_build,
             lambda torch, s, shape: _lm_train_step(torch, s, shape, autocast=True)),
    Workload("llama_train", "Llama-style 8 layers x 1024, bf16, AdamW, batch 4, seq 128-2048",
             12, 3, "loss_hex", _llama_train_schedule, _llama_train_build,
             lambda torch, s, shape: _lm_train_step(torch, s, shape, autocast=False)),
    Workload("gpt2_generate", "GPT-2 small fp16 greedy generate, batch 1-16, prompt 16-256, "
             "8-64 new tokens", 8, 2, "tokens_sha256", _gpt2_generate_schedule,
             _gpt2_generate_build, _gpt2_generate_step),
    Workload("resnet50_train", "ResNet-50 training, channels-last, fp32, SGD, batch 32-128",
             12, 3, "loss_hex", _resnet50_schedule, _resnet50_build, _resnet50_step),
    Workload("vit_train", "ViT-Base/16 training, bf16 autocast, AdamW, batch 16-96, 224 px",
             12, 3, "loss_hex", _vit_schedule, _vit_build, _vit_step),
    Workload("t5_train", "T5 (6+6 layers, d_model 512) training, bf16 autocast, AdamW, batch 16, "
             "source 64-512, target 16-128 tokens", 12, 3, "loss_hex", _t5_schedule, _t5_build,
             _t5_step),
    Workload("two_stream_train", "ResNet-50 training with inputs made on a side stream and "
             "handed over with record_stream, batch 32-128", 12, 3, "loss_hex",
             _resnet50_schedule, _resnet50_build, _resnet50_side_stream_step),
]}
QUICK_WORKLOADS = ["gpt2_train", "resnet50_train"]
