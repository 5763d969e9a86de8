"""The console scripts: TensorFlow's C++ start-up log lines hidden (``training.machine.start_up``), then the command."""

from training.machine.start_up import quiet_tensorflow_start_up


def serve(argv=None):
    """``keras-preact-serve``."""
    quiet_tensorflow_start_up()
    from serving import main

    return main(argv)


def serve_ray(argv=None):
    """``keras-preact-serve-ray``."""
    quiet_tensorflow_start_up()
    from serving import main_ray

    return main_ray(argv)
