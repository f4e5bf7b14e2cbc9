"""The same training step in PyTorch, for a side-by-side comparison on one GPU.

torchvision ResNet-50, channels_last, autocast in bf16 or fp16 (with a GradScaler for fp16), SGD
with Nesterov momentum, label smoothing 0.1, synthetic uint8 images normalised on the GPU.
Prints one `RESULT {json}` line.

    python3 bench/torch_resnet50.py --dtype bf16 --batch 256 [--compile]
"""
import argparse
import json
import time

import torch
import torchvision

parser = argparse.ArgumentParser()
parser.add_argument("--dtype", choices=["bf16", "f16"], default="bf16")
parser.add_argument("--batch", type=int, default=256)
parser.add_argument("--size", type=int, default=224)
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--warmup", type=int, default=5)
parser.add_argument("--compile", action="store_true")
args = parser.parse_args()

torch.backends.cudnn.benchmark = True
device = torch.device("cuda")
amp_dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
model = torchvision.models.resnet50(num_classes=1000).to(device, memory_format=torch.channels_last)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5, nesterov=True)
criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
scaler = torch.amp.GradScaler("cuda", enabled=args.dtype == "f16")
mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
images = torch.randint(0, 256, (args.batch, args.size, args.size, 3), dtype=torch.uint8, device=device)
labels = torch.randint(0, 1000, (args.batch,), device=device)


def step():
    x = images.permute(0, 3, 1, 2).float().sub_(mean).div_(std).contiguous(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=amp_dtype):
        loss = criterion(model(x), labels)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss


if args.compile:
    step = torch.compile(step)
for _ in range(args.warmup):
    step()
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
start = time.perf_counter()
for _ in range(args.steps):
    loss = step()
torch.cuda.synchronize()
ms = (time.perf_counter() - start) * 1000 / args.steps
result = {
    "impl": "pytorch eager" if not args.compile else "pytorch compile",
    "dtype": args.dtype,
    "batch": args.batch,
    "size": args.size,
    "stepMs": ms,
    "imagesPerSecond": args.batch * 1000 / ms,
    "peakMemoryGiB": torch.cuda.max_memory_allocated() / 2**30,
    "loss": float(loss),
    "torch": torch.__version__,
    "cudnn": torch.backends.cudnn.version(),
}
print("RESULT " + json.dumps(result), flush=True)
