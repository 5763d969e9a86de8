"""Gradient flow figures: norms against depth for several unit designs, Jacobian spectra of stacks.

    PYTHONPATH=. python benchmarks/analysis_gradient_flow.py --data-dir /tmp/cifar10-jpeg \
        [--depths 110,1001] [--batch 8] [--out runs/analysis]

Writes ``OUT/gradient_norms.png`` (signal / input-gradient / weight-gradient norm per unit, every
variant on one figure), ``OUT/jacobian_spectra.png`` and prints a table per figure. Networks are at
initialisation, normalization in training mode (batch statistics, dropout on), one batch of real
CIFAR-10 test images (``--data-dir``: the extracted JPEG folder) or of uniform noise without it.
"""

import argparse
import pathlib
import time

import keras
import numpy as np

from keras_preact.analysis import gradient_norms, plot_gradient_norms, plot_spectra, stack_spectra
from keras_preact.models import cifar_resnet, get_input_config

CIFAR_INPUT = get_input_config("cifar_resnet20")  # fb.resnet.torch statistics
MEAN, STD = np.array(CIFAR_INPUT.mean), np.array(CIFAR_INPUT.std)

# label -> unit options (Table 1's shortcut variants sit on the original unit, as in the paper)
NETWORK_VARIANTS = {
    "original (4a)": dict(ordering="original"),
    "full pre-activation (4e)": dict(ordering="full_preact"),
    "original + constant scaling 0.5 (2b)": dict(ordering="original", shortcut="constant_scaling",
                                                 shortcut_scale=0.5, residual_scale=1.0),
    "original + dropout shortcut 0.5 (2f)": dict(ordering="original", shortcut="dropout"),
}
DEEP_VARIANTS = ("original (4a)", "full pre-activation (4e)")  # also at the deeper depths

STACK_VARIANTS = {
    "full pre-activation": {},
    "original (ReLU after addition)": dict(ordering="original"),
    "full pre-act + constant scaling 0.5": dict(shortcut="constant_scaling", shortcut_scale=0.5),
    "full pre-act + dropout shortcut 0.5": dict(shortcut="dropout"),
    "full pre-act, zero-init residual": dict(zero_init_residual=True),
}


def load_batch(data_dir, batch):
    if data_dir is None:
        images = np.random.default_rng(0).uniform(0, 255, (batch, 32, 32, 3))
        return ((images - MEAN) / STD).astype("float32"), np.arange(batch) % 10
    import tensorflow as tf

    classes = sorted(p.name for p in (pathlib.Path(data_dir) / "test").iterdir())
    images, labels = [], []
    for i in range(batch):
        label = i % len(classes)
        path = sorted((pathlib.Path(data_dir) / "test" / classes[label]).iterdir())[i // len(classes)]
        images.append(tf.io.decode_image(tf.io.read_file(str(path)), channels=3).numpy())
        labels.append(label)
    return ((np.stack(images) - MEAN) / STD).astype("float32"), np.array(labels)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir")
    p.add_argument("--depths", default="110", help="comma-separated CIFAR depths; the first runs every "
                   "variant, the others only original vs full pre-activation (e.g. 110,1001)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--stack-depths", default="1,2,4,8,16,32")
    p.add_argument("--out", default="runs/analysis")
    args = p.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",")]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    images, labels = load_batch(args.data_dir, args.batch)

    results = {}
    print("| network | units | ‖x_L‖/‖x_1‖ | ‖dE/dx_1‖/‖dE/dx_L‖ | "
          "‖dE/dW_1‖/‖dE/dW_L‖ | seconds |")
    print("|---|---|---|---|---|---|")
    for d, depth in enumerate(depths):
        for label, options in NETWORK_VARIANTS.items():
            if d and label not in DEEP_VARIANTS:
                continue
            keras.utils.clear_session()
            keras.utils.set_random_seed(0)
            start = time.perf_counter()
            model = cifar_resnet(depth, **options)
            norms = gradient_norms(model, images, labels, training=True)
            name = f"ResNet-{depth} {label}"
            results[name] = norms
            print(f"| {name} | {len(norms.units)} | {norms.output_signal / norms.signal[0]:.3g} | "
                  f"{norms.input_grad[0] / norms.output_grad:.3g} | "
                  f"{norms.weight_grad[0] / norms.weight_grad[-1]:.3g} | {time.perf_counter() - start:.0f} |",
                  flush=True)
    plot_gradient_norms(results, out / "gradient_norms.png",
                        title=f"At initialisation, batch of {args.batch} CIFAR-10 images, BN in training mode")

    stack_depths = [int(d) for d in args.stack_depths.split(",")]
    keras.utils.clear_session()
    spectra = stack_spectra(STACK_VARIANTS, stack_depths, channels=8, size=4, batch=4)
    print()
    print("| stack (8 channels, 4x4, batch 4: 512x512 Jacobian) | units | σ_max | median σ | σ_min | "
          "fraction of σ in [0.5, 2] |")
    print("|---|---|---|---|---|---|")
    for (variant, depth), s in spectra.items():
        sv = s.singular_values
        inside = np.mean((sv >= 0.5) & (sv <= 2.0))
        print(f"| {variant} | {depth} | {sv[0]:.3g} | {np.median(sv):.3g} | {sv[-1]:.2g} | {inside:.2f} |")
    plot_spectra(spectra, out / "jacobian_spectra.png")
    print(f"\nwrote {out / 'gradient_norms.png'} and {out / 'jacobian_spectra.png'}")


if __name__ == "__main__":
    main()
