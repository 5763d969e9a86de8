"""An independent reference: a pre-activation ResNet trained on a CIFAR image folder in plain PyTorch.

It imports nothing from keras_preact or training, so it can judge their speed and their accuracy.
Network, as fb.resnet.torch ``models/preresnet.lua`` (CIFAR):
a 3x3 conv 3->16, three stages of n basic units (16/32/64 channels, strides 1/2/2; the first unit of
every stage pre-activates the input its shortcut reads, ``both_preact``), option-A shortcuts (strided
identity, zero channels), BN-ReLU, global average pooling, a linear layer. Depth 9n+2 (164, 1001) takes
bottleneck units instead (64/128/256 channels, the stride on the first 1x1 conv, option-B 1x1 projections
where the shape changes: ``resnet-pre-act.lua``). Initialisation as the official
code: convs N(0, sqrt(2 / (k*k*out))), BN weight 1 bias 0; the linear layer Glorot-uniform with a zero
bias (keras-preact's ``Dense``; fb.resnet.torch keeps Torch's default there). Recipe as
``keras-preact-train --preset cifar10-folder-resnet20-short``: ``torch.optim.SGD`` (momentum 0.9,
Nesterov, weight decay 1e-4 on every parameter: coupled, as ``optim.sgd``), ``nn.BatchNorm2d``
(momentum 0.1, eps 1e-5), lr warm-up 0.01 -> 0.1 then cosine to 0 (Keras' ``CosineDecay``), batch 128,
per-channel normalisation, pad 4 with zeros after normalisation + random crop + horizontal flip.

Input: the JPEG folder (``DIR/train/<class>/*.jpg``, ``DIR/test/<class>/*.jpg``), decoded once with
Pillow and cached as ``.npy``. Augmentation runs on whole batches in torch on the training thread (no
worker processes: on a 2-core machine they would take cores from the step), on the CPU with the seeded CPU
generator; ``--device`` (default ``auto``: CUDA where PyTorch sees a GPU, else the CPU) holds the network
and runs the step, so a run draws the same crops and flips on either, and resumes on either.

Writes ``history.csv`` (epoch, loss, accuracy, val_loss, val_accuracy, lr, train_seconds,
eval_seconds; the columns keras-preact's ``history.csv`` has) and ``metrics.json`` to ``--out``, and at every
epoch end ``checkpoint.pt`` (model, augmentation generator, history) and ``optimizer-<step>.pt`` (the momentum
buffers): each written to a temporary name and renamed, the optimizer's first, ``checkpoint.pt`` (which names it)
last, then the older optimizer files removed, so a kill at any moment leaves a checkpoint and the optimizer state
of its step. The same command re-run on ``--out`` resumes after the last finished epoch, on this machine or
another one that has the folder (copy ``--out``'s files but ``metrics.json``), with the weights of a run that
never stopped.

    python benchmarks/reference_torch_cifar.py --data-dir /tmp/cifar10-jpeg --epochs 15 --out /tmp/ref
    python benchmarks/reference_torch_cifar.py --data-dir /tmp/cifar10-jpeg --total-steps 64000 \
        --schedule piecewise --out runs/ref-paper-seed0     # the paper's length, as preset
        cifar10-folder-resnet20-paper
    python benchmarks/reference_torch_cifar.py --data-dir /tmp/cifar10-jpeg --device cuda ...  # on a GPU
"""

import argparse
import csv
import hashlib
import json
import math
import os
import pathlib
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

# fb.resnet.torch datasets/cifar10.lua per-channel statistics, 0-255 units (keras-preact's "cifar10").
MEAN = (125.3, 123.0, 113.9)
STD = (63.0, 62.1, 66.7)
PAD = 4


# ------------------------------------------------------------------------------------------ data
def _list_split(split_dir):
    classes = sorted(p.name for p in split_dir.iterdir() if p.is_dir())
    files, labels = [], []
    for label, name in enumerate(classes):
        for f in sorted((split_dir / name).iterdir()):
            if f.suffix.lower() in (".jpg", ".jpeg", ".png"):
                files.append(f)
                labels.append(label)
    return files, np.asarray(labels, np.int64), classes


def load_split(split_dir, cache_dir):
    """(uint8 images [N, H, W, 3], int64 labels [N]) of one split, cached as .npy."""
    files, labels, _ = _list_split(split_dir)
    if not files:
        raise SystemExit(f"reference_torch_cifar: no images under {split_dir}")
    key = hashlib.sha256("\n".join(f"{f}:{f.stat().st_size}" for f in files).encode()).hexdigest()[:16]
    path = pathlib.Path(cache_dir) / f"reference-{key}.npy"
    if path.exists():
        return np.load(path), labels
    images = np.stack([np.asarray(Image.open(f).convert("RGB")) for f in files])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
    np.save(tmp, images)
    os.replace(tmp, path)
    return images, labels


def normalize(uint8_nhwc, channels_last):
    """uint8 NHWC numpy -> normalised float32 NCHW tensor (channels_last memory if asked)."""
    x = torch.from_numpy(uint8_nhwc).permute(0, 3, 1, 2).float()
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    x = (x - mean) / std
    return x.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def augment(x, generator, channels_last):
    """Pad 4 with zeros (the mean, after normalisation), crop back at a random offset, flip; per image."""
    b, _, h, w = x.shape
    padded = F.pad(x, (PAD, PAD, PAD, PAD))
    oy, ox = torch.randint(0, 2 * PAD + 1, (2, b), generator=generator)
    rows = (oy[:, None] + torch.arange(h))[:, None, :, None].expand(b, x.shape[1], h, w + 2 * PAD)
    out = padded.gather(2, rows)
    cols = (ox[:, None] + torch.arange(w))[:, None, None, :].expand(b, x.shape[1], h, w)
    out = out.gather(3, cols)
    flip = torch.rand(b, generator=generator) < 0.5
    out = torch.where(flip[:, None, None, None], out.flip(3), out)
    return out.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


# ------------------------------------------------------------------------------------------ model
class PreActBasicUnit(nn.Module):
    """BN-ReLU-conv3x3-BN-ReLU-conv3x3 plus the option-A shortcut (paper Fig. 4e)."""

    def __init__(self, in_channels, out_channels, stride, preact_shortcut):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_channels, eps=1e-5, momentum=0.1)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels, eps=1e-5, momentum=0.1)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.stride, self.extra = stride, out_channels - in_channels
        self.preact_shortcut = preact_shortcut

    def shortcut(self, x):
        if self.stride > 1:
            x = x[:, :, :: self.stride, :: self.stride]
        if self.extra:
            x = F.pad(x, (0, 0, 0, 0, 0, self.extra))
        return x

    def forward(self, x):
        pre = F.relu(self.bn1(x))
        residual = self.conv2(F.relu(self.bn2(self.conv1(pre))))
        return residual + self.shortcut(pre if self.preact_shortcut else x)


class PreActBottleneckUnit(nn.Module):
    """BN-ReLU-conv1x1(stride)-BN-ReLU-conv3x3-BN-ReLU-conv1x1 (4x) plus a 1x1 projection where the shape changes
    (option B), as fb.resnet.torch ``resnet-pre-act.lua`` (paper Sec. 4, ResNet-164 and 1001)."""

    def __init__(self, in_channels, out_channels, stride, preact_shortcut):
        super().__init__()
        inner = out_channels // 4
        self.bn1 = nn.BatchNorm2d(in_channels, eps=1e-5, momentum=0.1)
        self.conv1 = nn.Conv2d(in_channels, inner, 1, stride, 0, bias=False)
        self.bn2 = nn.BatchNorm2d(inner, eps=1e-5, momentum=0.1)
        self.conv2 = nn.Conv2d(inner, inner, 3, 1, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(inner, eps=1e-5, momentum=0.1)
        self.conv3 = nn.Conv2d(inner, out_channels, 1, 1, 0, bias=False)
        changes = stride > 1 or in_channels != out_channels
        self.projection = nn.Conv2d(in_channels, out_channels, 1, stride, 0, bias=False) if changes else None
        self.preact_shortcut = preact_shortcut

    def forward(self, x):
        pre = F.relu(self.bn1(x))
        residual = self.conv3(F.relu(self.bn3(self.conv2(F.relu(self.bn2(self.conv1(pre)))))))
        shortcut = pre if self.preact_shortcut else x
        return residual + (self.projection(shortcut) if self.projection is not None else shortcut)


# Depths that are both 6n+2 and 9n+2 take the paper's block (keras-preact's ``cifar_resnet`` likewise).
PAPER_BLOCKS = {164: "bottleneck", 1001: "bottleneck"}
BLOCKS = {"basic": (PreActBasicUnit, 2, (16, 32, 64)), "bottleneck": (PreActBottleneckUnit, 3, (64, 128, 256))}


def depth_block(depth, block=None):
    """(block, units per stage): 6n+2 basic (16/32/64 channels), 9n+2 bottleneck (64/128/256), the paper's
    choice for 164 and 1001."""
    name = block or PAPER_BLOCKS.get(depth) or ("basic" if (depth - 2) % 6 == 0 else "bottleneck")
    layers = BLOCKS[name][1]
    if depth <= 2 or (depth - 2) % (3 * layers):
        raise SystemExit(f"reference_torch_cifar: --depth {depth} is not 6n+2 (basic: 20, 32, 44, 56, 110) "
                         "or 9n+2 (bottleneck: 164, 1001)")
    return name, (depth - 2) // (3 * layers)


class PreActResNet(nn.Module):
    def __init__(self, depth=20, num_classes=10, block=None):
        super().__init__()
        block, n = depth_block(depth, block)
        unit, _, widths = BLOCKS[block]
        self.stem = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        units, channels = [], 16
        for width, stride in zip(widths, (1, 2, 2)):
            for i in range(n):
                units.append(unit(channels, width, stride if i == 0 else 1, preact_shortcut=i == 0))
                channels = width
        self.units = nn.Sequential(*units)
        self.bn = nn.BatchNorm2d(channels, eps=1e-5, momentum=0.1)
        self.fc = nn.Linear(channels, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.xavier_uniform_(self.fc.weight)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x):
        x = F.relu(self.bn(self.units(self.stem(x))))
        return self.fc(x.mean((2, 3)))


# --------------------------------------------------------------------------------------- schedule
def learning_rate(step, total, warmup, base_lr=0.1, warmup_lr=0.01):
    """Keras ``CosineDecay(warmup_lr, total - warmup, warmup_target=base_lr, warmup_steps=warmup)``."""
    if step < warmup:
        return warmup_lr + (base_lr - warmup_lr) * step / warmup
    done = min(step - warmup, total - warmup) / max(1, total - warmup)
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * done))


def piecewise_learning_rate(step, total, warmup, base_lr=0.1, warmup_lr=0.01):
    """The paper's: ``warmup_lr`` for the first ``warmup`` iterations, then ``base_lr``, divided by 10 at
    50% and 75% of the run (32k and 48k of 64k), as ``keras_preact_training.recipe.schedules.piecewise``."""
    if step < warmup:
        return warmup_lr
    return base_lr * 0.1 ** sum(step >= round(total * f) for f in (0.5, 0.75))


SCHEDULES = {"cosine": learning_rate, "piecewise": piecewise_learning_rate}


# ------------------------------------------------------------------------------------------- loop
def evaluate(model, images, labels, batch_size, channels_last, device="cpu"):
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    with torch.no_grad():
        for start in range(0, len(labels), batch_size):
            x = normalize(images[start:start + batch_size], channels_last).to(device)
            y = torch.from_numpy(labels[start:start + batch_size]).to(device)
            logits = model(x)
            loss_sum += F.cross_entropy(logits, y, reduction="sum")
            correct += (logits.argmax(1) == y).sum()
    model.train()
    return loss_sum.item() / len(labels), correct.item() / len(labels)


def resolve_device(name):
    """``--device``: ``auto`` is CUDA where PyTorch sees a GPU, else the CPU; ``cuda`` without one is refused."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("reference_torch_cifar: --device cuda, but PyTorch sees no GPU "
                         f"(torch {torch.__version__}); use --device cpu or auto")
    return torch.device(name)


def device_name(device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True, help="folder with train/ and test/ class folders")
    p.add_argument("--out", default="runs/reference-torch", help="where history.csv and metrics.json go")
    p.add_argument("--cache-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "keras_preact"))
    p.add_argument("--depth", type=int, default=20)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--total-steps", type=int, default=None,
                   help="iterations in all (the last epoch partial), instead of --epochs; 64000 is the paper's")
    p.add_argument("--steps-per-epoch", type=int, default=None, help="default: train size // batch")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--eval-batch-size", type=int, default=None, help="default: --batch-size")
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="cosine",
                   help="cosine with linear warm-up (preset cifar10-folder-resnet20-short) or the paper's "
                   "piecewise (cifar10-folder-resnet20-converged)")
    p.add_argument("--warmup-fraction", type=float, default=400 / 64000, help="of the run's iterations")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where the network trains: auto (CUDA where PyTorch sees a GPU, else the CPU), cpu, cuda")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (inductor)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--prepare-only", action="store_true", help="decode and cache the images, then exit")
    p.add_argument("--stop-at-accuracy", type=float, default=None,
                   help="stop after the first epoch whose test accuracy reaches this (time to accuracy)")
    args = p.parse_args(argv)
    for name in ("depth", "epochs", "batch_size", "total_steps"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def main(argv=None):
    args = parse_args(argv)
    data_dir = pathlib.Path(args.data_dir)
    if not (data_dir / "train").is_dir() or not (data_dir / "test").is_dir():
        raise SystemExit(f"reference_torch_cifar: --data-dir {data_dir} needs train/ and test/ class folders")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    torch.manual_seed(args.seed)
    train_x, train_y = load_split(data_dir / "train", args.cache_dir)
    test_x, test_y = load_split(data_dir / "test", args.cache_dir)
    if args.prepare_only:
        return None
    num_classes = int(train_y.max()) + 1
    layout = torch.channels_last if args.channels_last else torch.contiguous_format
    model = PreActResNet(args.depth, num_classes).to(device, memory_format=layout)
    step_fn = torch.compile(model) if args.compile else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4)
    steps_per_epoch = args.steps_per_epoch or len(train_y) // args.batch_size
    total = args.total_steps or args.epochs * steps_per_epoch
    epochs = math.ceil(total / steps_per_epoch)
    warmup = round(args.warmup_fraction * total)
    eval_batch = args.eval_batch_size or args.batch_size
    generator = torch.Generator().manual_seed(args.seed)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, step, first_epoch = [], 0, 0
    checkpoint = out / CHECKPOINT
    if checkpoint.is_file():
        state = torch.load(checkpoint, weights_only=False, map_location=device)
        if "optimizer" not in state:  # kept beside it (checkpoints before it was split hold it inside)
            state["optimizer"] = torch.load(out / state["optimizer_file"], weights_only=False, map_location=device)
        if state["run"] != _run_key(args, total):
            raise SystemExit(f"reference_torch_cifar: --out {out} holds a run of {state['run']}, this command "
                             f"trains {_run_key(args, total)}; pass another --out")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"].cpu())
        rows, step, first_epoch = state["rows"], state["step"], len(state["rows"])
        print(f"[reference] resuming at step {step} (epoch {first_epoch}) from {checkpoint}", flush=True)
    print(f"[reference] torch {torch.__version__} on {device_name(device)}, {torch.get_num_threads()} threads, "
          f"pre-act ResNet-{args.depth} "
          f"({sum(p.numel() for p in model.parameters()):,} params), {len(train_y)} train images, "
          f"{total} iterations ({epochs} epochs x {steps_per_epoch} steps), batch {args.batch_size}, "
          f"channels_last={args.channels_last}, compile={args.compile}", flush=True)
    started = time.time()
    stopped_early = args.stop_at_accuracy is not None and rows and rows[-1]["val_accuracy"] >= args.stop_at_accuracy
    for epoch in range(first_epoch, 0 if stopped_early else epochs):
        order = np.random.default_rng([args.seed, epoch]).permutation(len(train_y))
        t0 = time.perf_counter()
        # Summed on the device: no wait for the GPU at every step (the CPU sums the same float64 values).
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        correct = torch.zeros((), dtype=torch.int64, device=device)
        epoch_steps = min(steps_per_epoch, total - step)
        for i in range(epoch_steps):
            index = order[(i * args.batch_size) % len(order):][:args.batch_size]
            x = augment(normalize(train_x[index], args.channels_last), generator, args.channels_last).to(device)
            y = torch.from_numpy(train_y[index]).to(device)
            lr = SCHEDULES[args.schedule](step, total, warmup)
            for group in optimizer.param_groups:
                group["lr"] = lr
            logits = step_fn(x)
            loss = F.cross_entropy(logits, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
            correct += (logits.argmax(1) == y).sum()
            step += 1
        loss_sum, correct = loss_sum.item(), correct.item()  # waits for the epoch's last step
        train_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        val_loss, val_acc = evaluate(step_fn, test_x, test_y, eval_batch, args.channels_last, device)
        eval_seconds = time.perf_counter() - t0
        rows.append(dict(epoch=epoch, loss=loss_sum / epoch_steps,
                         accuracy=correct / (epoch_steps * args.batch_size), val_loss=val_loss,
                         val_accuracy=val_acc, lr=lr, train_seconds=train_seconds, eval_seconds=eval_seconds))
        print(f"[reference] epoch {epoch + 1}/{epochs}: loss {rows[-1]['loss']:.4f} acc "
              f"{rows[-1]['accuracy']:.4f} val_loss {val_loss:.4f} val_acc {val_acc:.4f} | train "
              f"{epoch_steps * args.batch_size / train_seconds:.1f} img/s, eval "
              f"{len(test_y) / eval_seconds:.1f} img/s", flush=True)
        _write_history(out / "history.csv", rows)
        save_checkpoint(out, dict(run=_run_key(args, total), model=model.state_dict(),
                                  generator=generator.get_state(), rows=rows, step=step), optimizer.state_dict())
        if args.stop_at_accuracy is not None and val_acc >= args.stop_at_accuracy:
            break
    metrics = dict(test_accuracy=rows[-1]["val_accuracy"], test_loss=rows[-1]["val_loss"], epochs=len(rows),
                   steps=step, train_seconds=round(sum(r["train_seconds"] for r in rows), 1),
                   eval_seconds=round(sum(r["eval_seconds"] for r in rows), 1),
                   wall_time_s=round(time.time() - started, 1), torch=torch.__version__,
                   threads=torch.get_num_threads(), device=device_name(device), channels_last=args.channels_last,
                   compile=args.compile,
                   depth=args.depth, seed=args.seed)
    tmp = out / f"metrics.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(metrics, indent=2))
    os.replace(tmp, out / "metrics.json")
    return metrics


CHECKPOINT = "checkpoint.pt"


def _run_key(args, total):
    """What a resume must keep: the network, data stream and recipe (not threads, not where things live)."""
    return dict(depth=args.depth, total_steps=total, steps_per_epoch=args.steps_per_epoch,
                batch_size=args.batch_size, schedule=args.schedule, warmup_fraction=args.warmup_fraction,
                seed=args.seed, channels_last=args.channels_last)


def save_checkpoint(out, state, optimizer_state):
    """``checkpoint.pt`` and the ``optimizer-<step>.pt`` it names, each renamed into place (module docstring)."""
    name = f"optimizer-{state['step']:07d}.pt"
    _save(out / name, optimizer_state)
    _save(out / CHECKPOINT, {**state, "optimizer_file": name})
    for old in out.glob("optimizer-*.pt"):
        if old.name != name:
            old.unlink()


def _save(path, state):
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _write_history(path, rows):
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
    sys.exit(0)
