"""A torchvision ResNet's weights and outputs, for test/torch-checkpoint.test.ts.

    python torchvision-resnet.py DEPTH OUT_DIR

Builds torchvision.models.resnet<DEPTH>() with seeded random weights and batch-norm statistics
(so that the statistics matter), saves its state dict with torch.save to OUT_DIR/weights.pth (a
training checkpoint {'model': DataParallel state dict, 'epoch': 1} as OUT_DIR/checkpoint.pth),
and writes a seeded NCHW input batch (input.f32), the eval-mode logits (logits.f32) and the
pooled features fc reads (features.f32), little-endian f32, with their shapes in shapes.json.
"""

import json
import os
import sys

import torch
import torchvision

depth, out = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(depth)
model = getattr(torchvision.models, f"resnet{depth}")()
with torch.no_grad():
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-0.2, 0.2)
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 2.0)
            m.num_batches_tracked.fill_(depth)
model.eval()
x = torch.randn(2, 3, 64, 64)
with torch.no_grad():
    logits = model(x)
    head = model.fc
    model.fc = torch.nn.Identity()
    features = model(x)
    model.fc = head
torch.save(model.state_dict(), os.path.join(out, "weights.pth"))
torch.save({"model": torch.nn.DataParallel(model).state_dict(), "epoch": 1}, os.path.join(out, "checkpoint.pth"))
for name, t in [("input", x), ("logits", logits), ("features", features)]:
    t.contiguous().numpy().astype("<f4").tofile(os.path.join(out, f"{name}.f32"))
with open(os.path.join(out, "shapes.json"), "w") as f:
    json.dump({"input": list(x.shape), "logits": list(logits.shape), "features": list(features.shape)}, f)
