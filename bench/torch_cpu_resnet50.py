"""PyTorch's CPU training step, driven by `npm run bench` (bench/torch-cpu.ts) beside ours.

torchvision ResNet-50, channels_last, f32 or bf16 autocast (f32 master weights), SGD with momentum 0.9
and weight decay 1e-4 (lr 0.01), cross-entropy, one fixed synthetic batch: the step bench/run.ts
times for resnet-cuda. Eager, or the model under torch.compile with --compile.

It builds the model, runs the warm-up steps, prints `READY {json}`, then reads commands on stdin,
one per line: `run N` times N steps and prints `RESULT {json}` (milliseconds per step); `quit` or
the end of input ends it. The driver alternates these runs with its own steps.

    python3 bench/torch_cpu_resnet50.py --dtype bf16 --batch 16 --size 224 [--compile]
"""
import argparse
import json
import sys
import time

import torch
import torchvision

parser = argparse.ArgumentParser()
parser.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
parser.add_argument("--batch", type=int, default=16)
parser.add_argument("--size", type=int, default=224)
parser.add_argument("--warmup", type=int, default=2)
parser.add_argument("--compile", action="store_true")
args = parser.parse_args()

torch.manual_seed(1)
bf16 = args.dtype == "bf16"
model = torchvision.models.resnet50(num_classes=1000).to(memory_format=torch.channels_last)
model.train()
net = torch.compile(model) if args.compile else model
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
criterion = torch.nn.CrossEntropyLoss()
images = torch.randn(args.batch, 3, args.size, args.size).contiguous(memory_format=torch.channels_last)
labels = torch.arange(args.batch) % 1000


def step():
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = criterion(net(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss


def emit(kind, payload):
    print(kind + " " + json.dumps(payload), flush=True)


for _ in range(args.warmup):
    step()
emit(
    "READY",
    {
        "impl": "pytorch compile" if args.compile else "pytorch eager",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "onednn": torch.backends.mkldnn.is_available(),
    },
)
for line in sys.stdin:
    words = line.split()
    if not words or words[0] == "quit":
        break
    if words[0] != "run" or len(words) != 2 or not words[1].isdigit() or int(words[1]) < 1:
        emit("ERROR", {"message": "expected 'run N' (N >= 1) or 'quit', got " + repr(line.strip())})
        continue
    steps = int(words[1])
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = float(step())
        times.append((time.perf_counter() - start) * 1000)
    emit("RESULT", {"stepMs": times, "loss": loss})
