"""PNG figures (matplotlib, Agg): norms against depth for several variants, Jacobian spectra."""

import os

import numpy as np

from keras_preact import scratch

MISSING_MATPLOTLIB = 'keras_preact.analysis draws its figures with matplotlib: pip install "keras-preact[analysis]"'


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ImportError(MISSING_MATPLOTLIB) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, dpi=110):
    """Write the figure to a temporary file next to ``path``, then rename (nothing half-written)."""
    plt = _pyplot()
    try:
        with scratch.atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    return os.fspath(path)


def _check_results(argument, results):
    if not isinstance(results, dict) or not results:
        raise ValueError(f"Invalid {argument}: a non-empty dict of label -> result is required.")


def plot_gradient_norms(results, path, title="Signal and gradient norms per residual unit"):
    """One figure, three panels against relative depth l / L (input side left): forward signal
    ||x_l||, input gradient ||dE/dx_l|| and weight gradient ||dE/dW_l||, one line per variant.

    ``results``: ``{label: GradientNorms}`` (e.g. ResNet-110 / ResNet-1001, original vs full
    pre-activation, constant scaling 0.5, dropout shortcut). Log scale: lambda^L decay is a line.

    Examples:
        >>> import os
        >>> import tempfile
        >>> import numpy as np
        >>> from keras_preact.analysis import GradientNorms, plot_gradient_norms
        >>> halving = GradientNorms(("u1", "u2", "u3"), np.ones(3), 0.5 ** np.arange(3), np.ones(3), 1.0, 0.125, 2.3)
        >>> with tempfile.TemporaryDirectory() as out:
        ...     path = plot_gradient_norms({"lambda = 0.5": halving}, os.path.join(out, "norms.png"))
        ...     open(path, "rb").read(4)
        b'\\x89PNG'
    """
    _check_results("results", results)
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = (("signal", "forward signal ||x_l||"), ("input_grad", "gradient ||dE/dx_l||"),
              ("weight_grad", "weight gradient ||dE/dW_l||"))
    for i, (label, norms) in enumerate(results.items()):
        units = len(norms.units)
        depth = (np.arange(units) + 1) / units
        for ax, (field, _) in zip(axes, panels):
            values = np.maximum(getattr(norms, field), 1e-300)
            ax.plot(depth, values, color=f"C{i % 10}", lw=1.2, label=f"{label} ({units} units)")
    for ax, (_, name) in zip(axes, panels):
        ax.set_yscale("log")
        ax.set_xlabel("relative depth l / L (input side left)")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_spectra(spectra, path, title="Input-output Jacobian of a stack of units at initialisation"):
    """Left: sorted singular values of the deepest stack of every variant (log scale). Right:
    median singular value and the 5-95% spread against depth.

    ``spectra``: ``{(variant, depth): Spectrum}`` as ``stack_spectra`` returns.

    Examples:
        >>> import os
        >>> import tempfile
        >>> import numpy as np
        >>> from keras_preact.analysis import Spectrum, plot_spectra
        >>> spectra = {("identity", depth): Spectrum(np.linspace(2.0, 0.5, 16) ** depth) for depth in (1, 2, 4)}
        >>> with tempfile.TemporaryDirectory() as out:
        ...     path = plot_spectra(spectra, os.path.join(out, "spectra.png"))
        ...     open(path, "rb").read(4)
        b'\\x89PNG'
    """
    _check_results("spectra", spectra)
    plt = _pyplot()
    variants = list(dict.fromkeys(v for v, _ in spectra))
    fig, (ax_sv, ax_depth) = plt.subplots(1, 2, figsize=(12, 4.5))
    floor = 1e-12
    for i, variant in enumerate(variants):
        depths = sorted(d for v, d in spectra if v == variant)
        deepest = spectra[(variant, depths[-1])].singular_values
        color = f"C{i % 10}"
        ax_sv.plot(np.arange(len(deepest)) / max(len(deepest) - 1, 1), np.maximum(deepest, floor),
                   color=color, label=f"{variant}, {depths[-1]} units")
        stats = np.array([np.percentile(np.maximum(spectra[(variant, d)].singular_values, floor),
                                        [5, 50, 95]) for d in depths])
        ax_depth.plot(depths, stats[:, 1], "-o", ms=3, color=color, label=variant)
        ax_depth.fill_between(depths, stats[:, 0], stats[:, 2], color=color, alpha=0.15)
    ax_sv.set_yscale("log")
    ax_sv.set_xlabel("rank / number of singular values")
    ax_sv.set_ylabel(f"singular value (floored at {floor:g})")
    ax_depth.set_xscale("log", base=2)
    ax_depth.set_yscale("log")
    ax_depth.set_xlabel("units in the stack")
    ax_depth.set_ylabel("singular values: median, 5-95% band")
    for ax in (ax_sv, ax_depth):
        ax.axhline(1.0, color="k", lw=0.6, ls=":")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)
