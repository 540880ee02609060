"""PyTorch's scaled-dot-product attention on the GPU at the shapes of
cuda_cases.py's attention bench (Llama-3-8B: 32 query heads over 8 KV heads
of 128, causal, bf16, batch 1, 2,048 and 8,192 tokens): the anchor parax's
attention kernels are measured against on the same card in the same run
(scripts/gpu-check.sh). Each of PyTorch's SDPA backends that takes the shape
(flash, cuDNN, memory-efficient), forward and forward + backward, timed by
CUDA events: the median of 20 after 5 warm-ups. FLOPs count the causal half
as cuda_cases.py does (forward 4·B·H·D·S(S+1)/2, backward 2.5 times that).

    python3 bench/torch_attention.py OUT.json
"""

import json
import statistics
import sys


def main():
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    out = sys.argv[1] if len(sys.argv) > 1 else "torch-attention.json"
    results = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
               "cudnn": torch.backends.cudnn.version(), "cases": []}
    B, H, KH, D = 1, 32, 8, 128
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}

    def timed(fn, reps=20, warm=5):
        for _ in range(warm):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    for S in (2048, 8192):
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
        k = torch.randn(B, KH, S, D, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
        v = torch.randn(B, KH, S, D, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
        dy = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        flops = 4 * B * H * D * S * (S + 1) / 2
        for name, backend in backends.items():
            case = {"seq": S, "backend": name}
            try:
                # GQA as the backend takes it, else the KV heads repeated
                # (the same FLOPs, 4x the K/V reads).
                gqa = True
                def forward():
                    if gqa:
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                    return F.scaled_dot_product_attention(q, k.repeat_interleave(H // KH, 1),
                                                          v.repeat_interleave(H // KH, 1), is_causal=True)
                with sdpa_kernel([backend]):
                    try:
                        forward()
                    except RuntimeError:
                        gqa = False
                        forward()
                    fwd = timed(lambda: forward())
                    both = timed(lambda: torch.autograd.grad(forward(), (q, k, v), dy))
                case.update({"gqa": gqa, "forward_ms": fwd, "forward_tflops": flops / fwd / 1e9,
                             "backward_ms": both - fwd, "backward_tflops": 2.5 * flops / (both - fwd) / 1e9})
            except Exception as e:  # a backend that refuses the shape
                case["error"] = str(e)[-300:]
            results["cases"].append(case)
            print(json.dumps(case), flush=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
