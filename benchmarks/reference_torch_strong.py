"""The strong reference: the plain PyTorch loop a PyTorch expert would write for a GPU, same network and recipe.

``reference_torch_cifar.py`` augments on the CPU with a seeded CPU generator (so a run resumes bit for bit on either
device); on a GPU that host-side work sets its pace. This loop keeps everything on the device instead:

- the decoded training and test sets live on the device as uint8 (150 MB for CIFAR-10);
- each epoch's order is a ``torch.randperm`` on the device; a batch is one index into the uint8 set;
- normalisation, pad-4 zeros (the mean after normalisation), random crop and horizontal flip are tensor ops on the
  device: the crop offsets and the flip fold into one gather (``augment``);
- ``channels_last`` memory (on by default), ``--precision bf16`` (``torch.autocast`` bfloat16; the loss and the
  weights stay float32), ``--compile`` (``torch.compile`` of the model, a mode to choose), the fused SGD kernel
  on CUDA;
- no host synchronisation inside an epoch: loss and accuracy are summed on the device.

Network: ``reference_torch_cifar.PreActResNet`` (fb.resnet.torch's pre-activation ResNet, basic units for 6n+2,
bottleneck units for 9n+2: ResNet-20, 110 and 164 with keras-preact's parameter counts). Recipe as
``keras-preact-train``'s: ``torch.optim.SGD`` (momentum 0.9, Nesterov, coupled weight decay 1e-4 on every
parameter), batch 128, the paper's piecewise schedule (0.01 for the first 400 of 64,000 iterations, 0.1, divided
by 10 at 50% and 75%) or cosine with warm-up (``--schedule``).

Writes ``history.csv`` (keras-preact-train's columns: epoch, loss, accuracy, val_loss, val_accuracy, lr,
train_seconds, eval_seconds) and ``metrics.json`` to ``--out``; ``train_seconds`` ends with a synchronisation, so
images/s from it are the device's. No checkpoints: this loop is for speed; ``reference_torch_cifar.py`` resumes.

    python benchmarks/reference_torch_strong.py --data-dir /tmp/cifar10-jpeg --depth 110 --epochs 3 \\
        --steps-per-epoch 100 --precision bf16 --compile default --out /tmp/strong
    python benchmarks/reference_torch_strong.py --synthetic 512 --image-size 16 --depth 8 --epochs 2 \\
        --steps-per-epoch 2 --batch-size 16 --out /tmp/strong-tiny     # no data: random images, a CPU check
"""

import argparse
import json
import math
import os
import pathlib
import time

import numpy as np
import torch
import torch.nn.functional as F

if __package__:
    from . import reference_torch_cifar as base
else:  # run as a script: benchmarks/ is sys.path[0]
    import reference_torch_cifar as base

COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
PRECISIONS = ("float32", "bf16")


def augment(x, generator, pad=base.PAD):
    """Pad ``pad`` zeros on each side, crop back at a random offset and flip half the images, per image.

    ``x``: normalised float NHWC ``[B, H, W, C]`` on any device; ``generator``: a ``torch.Generator`` of that device.
    One gather: the crop's rows and columns (reversed for a flipped image) index the padded batch.
    """
    b, h, w, _ = x.shape
    padded = F.pad(x, (0, 0, pad, pad, pad, pad))
    offsets = torch.randint(0, 2 * pad + 1, (2, b, 1), generator=generator, device=x.device)
    flip = torch.rand(b, 1, generator=generator, device=x.device) < 0.5
    rows = offsets[0] + torch.arange(h, device=x.device)
    cols = torch.arange(w, device=x.device)
    cols = offsets[1] + torch.where(flip, cols.flip(0), cols)
    batch = torch.arange(b, device=x.device)[:, None, None]
    return padded[batch, rows[:, :, None], cols[:, None, :]]


def normalize(uint8_nhwc):
    """uint8 NHWC -> float32 NHWC with fb.resnet.torch's per-channel CIFAR statistics (the reference's)."""
    mean = torch.tensor(base.MEAN, device=uint8_nhwc.device)
    std = torch.tensor(base.STD, device=uint8_nhwc.device)
    return (uint8_nhwc.float() - mean) / std


def to_nchw(x_nhwc, channels_last):
    """NHWC -> the network's NCHW; a permuted NHWC tensor already has channels_last strides."""
    x = x_nhwc.permute(0, 3, 1, 2)
    return x if channels_last else x.contiguous()


def build(depth, num_classes, device, channels_last=True, compile_mode="off"):
    """(model, the callable that runs it: compiled or the model itself)."""
    layout = torch.channels_last if channels_last else torch.contiguous_format
    model = base.PreActResNet(depth, num_classes).to(device, memory_format=layout)
    return model, (model if compile_mode == "off" else torch.compile(model, mode=compile_mode))


def make_optimizer(model, device):
    """Nesterov SGD, momentum 0.9, coupled weight decay 1e-4 on every parameter (keras-preact-train's
    ``TorchSGD``); the fused kernel on CUDA (one launch for all parameters)."""
    kwargs = dict(lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4)
    if device.type == "cuda":
        kwargs["fused"] = True
    return torch.optim.SGD(model.parameters(), **kwargs)


def train_step(run, optimizer, x, y, lr, bf16):
    """One SGD step; returns (loss, correct) as device tensors (no synchronisation)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = run(x)
    loss = F.cross_entropy(logits.float(), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach(), (logits.argmax(1) == y).sum()


def evaluate(run, model, images, labels, batch_size, channels_last, bf16):
    """(mean loss, accuracy) over a uint8 NHWC set on the device, BN in inference mode."""
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=images.device)
    correct = torch.zeros((), dtype=torch.int64, device=images.device)
    with torch.no_grad(), torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=bf16):
        for start in range(0, len(labels), batch_size):
            x = to_nchw(normalize(images[start:start + batch_size]), channels_last)
            y = labels[start:start + batch_size]
            logits = run(x).float()
            loss_sum += F.cross_entropy(logits, y, reduction="sum")
            correct += (logits.argmax(1) == y).sum()
    model.train()
    return loss_sum.item() / len(labels), correct.item() / len(labels)


def load_data(args):
    """(train images, train labels, test images, test labels) as numpy: the folder's or random ones."""
    if args.synthetic:
        rng = np.random.default_rng(args.seed)
        size = args.image_size
        make = lambda n: (rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8),  # noqa: E731
                          rng.integers(0, 10, n).astype(np.int64))
        return (*make(args.synthetic), *make(max(args.batch_size, args.synthetic // 5)))
    data_dir = pathlib.Path(args.data_dir)
    if not (data_dir / "train").is_dir() or not (data_dir / "test").is_dir():
        raise SystemExit(f"reference_torch_strong: --data-dir {data_dir} needs train/ and test/ class folders")
    return (*base.load_split(data_dir / "train", args.cache_dir), *base.load_split(data_dir / "test", args.cache_dir))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--data-dir", help="folder with train/ and test/ class folders")
    source.add_argument("--synthetic", type=int, metavar="N", help="N random training images instead (a check)")
    p.add_argument("--image-size", type=int, default=32, help="--synthetic images' side (default 32)")
    p.add_argument("--out", default="runs/reference-torch-strong", help="where history.csv and metrics.json go")
    p.add_argument("--cache-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "keras_preact"))
    p.add_argument("--depth", type=int, default=20, help="6n+2 basic units (20, 110), 9n+2 bottleneck (164)")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--total-steps", type=int, default=None, help="iterations in all, instead of --epochs")
    p.add_argument("--steps-per-epoch", type=int, default=None, help="default: train size // batch")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--eval-batch-size", type=int, default=1000)
    p.add_argument("--schedule", choices=sorted(base.SCHEDULES), default="piecewise",
                   help="the paper's piecewise (default) or cosine with linear warm-up")
    p.add_argument("--schedule-steps", type=int, default=None,
                   help="the iterations the schedule spans (default: the run's; 64000 for the paper's schedule "
                   "in a short timing run)")
    p.add_argument("--warmup-steps", type=int, default=400, help="0.01 before 0.1 (the paper's 400)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--precision", choices=PRECISIONS, default="float32", help="bf16: torch.autocast bfloat16")
    p.add_argument("--compile", choices=COMPILE_MODES, default="off", help="torch.compile the model in this mode")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: CUDA where PyTorch sees a GPU, else the CPU")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--no-eval", dest="eval", action="store_false", help="skip the test set after each epoch")
    args = p.parse_args(argv)
    for name in ("depth", "epochs", "batch_size", "eval_batch_size", "total_steps", "steps_per_epoch",
                 "synthetic", "image_size", "schedule_steps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.warmup_steps < 0:
        p.error(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    if args.synthetic is not None and args.synthetic < args.batch_size:
        p.error(f"--synthetic {args.synthetic} must be >= --batch-size {args.batch_size}")
    return args


def main(argv=None):
    args = parse_args(argv)
    base.depth_block(args.depth)  # an invalid depth is refused before any data is read
    if args.threads:
        torch.set_num_threads(args.threads)
    device = base.resolve_device(args.device)
    torch.manual_seed(args.seed)
    train_x, train_y, test_x, test_y = load_data(args)
    train_x, train_y = torch.from_numpy(train_x).to(device), torch.from_numpy(train_y).to(device)
    test_x, test_y = torch.from_numpy(test_x).to(device), torch.from_numpy(test_y).to(device)
    num_classes = int(train_y.max().item()) + 1 if not args.synthetic else 10
    model, run = build(args.depth, num_classes, device, args.channels_last, args.compile)
    optimizer = make_optimizer(model, device)
    bf16 = args.precision == "bf16"
    steps_per_epoch = args.steps_per_epoch or len(train_y) // args.batch_size
    total = args.total_steps or args.epochs * steps_per_epoch
    epochs = math.ceil(total / steps_per_epoch)
    schedule_steps = args.schedule_steps or total
    warmup = min(args.warmup_steps, schedule_steps)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"[strong-reference] torch {torch.__version__} on {base.device_name(device)}, pre-act ResNet-{args.depth} "
          f"({sum(p.numel() for p in model.parameters()):,} params), {len(train_y)} train images on the device, "
          f"{total} iterations ({epochs} epochs x {steps_per_epoch}), batch {args.batch_size}, "
          f"precision={args.precision}, channels_last={args.channels_last}, compile={args.compile}", flush=True)
    rows, step, order, cursor, started = [], 0, None, 0, time.time()
    for epoch in range(epochs):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        correct = torch.zeros((), dtype=torch.int64, device=device)
        epoch_steps = min(steps_per_epoch, total - step)
        for _ in range(epoch_steps):
            if order is None or cursor + args.batch_size > len(order):
                order, cursor = torch.randperm(len(train_y), generator=generator, device=device), 0
            index = order[cursor:cursor + args.batch_size]
            cursor += args.batch_size
            x = to_nchw(augment(normalize(train_x[index]), generator), args.channels_last)
            lr = base.SCHEDULES[args.schedule](step, schedule_steps, warmup)
            loss, hits = train_step(run, optimizer, x, train_y[index], lr, bf16)
            loss_sum += loss
            correct += hits
            step += 1
        loss_sum, correct = loss_sum.item(), correct.item()  # waits for the epoch's last step
        train_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        val_loss, val_acc = (evaluate(run, model, test_x, test_y, args.eval_batch_size, args.channels_last, bf16)
                             if args.eval else (float("nan"), float("nan")))
        eval_seconds = time.perf_counter() - t0
        rows.append(dict(epoch=epoch, loss=loss_sum / epoch_steps, accuracy=correct / (epoch_steps * args.batch_size),
                         val_loss=val_loss, val_accuracy=val_acc, lr=lr, train_seconds=round(train_seconds, 3),
                         eval_seconds=round(eval_seconds, 3)))
        print(f"[strong-reference] epoch {epoch + 1}/{epochs}: loss {rows[-1]['loss']:.4f} acc "
              f"{rows[-1]['accuracy']:.4f} val_acc {val_acc:.4f} | train "
              f"{epoch_steps * args.batch_size / train_seconds:.1f} img/s", flush=True)
        base._write_history(out / "history.csv", rows)
    metrics = dict(test_accuracy=rows[-1]["val_accuracy"], test_loss=rows[-1]["val_loss"], epochs=len(rows),
                   steps=step, train_seconds=round(sum(r["train_seconds"] for r in rows), 3),
                   wall_time_s=round(time.time() - started, 1), torch=torch.__version__,
                   device=base.device_name(device), depth=args.depth, precision=args.precision,
                   channels_last=args.channels_last, compile=args.compile, batch_size=args.batch_size,
                   params=sum(p.numel() for p in model.parameters()), seed=args.seed)
    tmp = out / f"metrics.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(metrics, indent=2))
    os.replace(tmp, out / "metrics.json")
    return metrics


if __name__ == "__main__":
    main()
