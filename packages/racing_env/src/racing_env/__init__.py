"""``ControllerLearning/CarRacing-v0``: a JAX vector env of a physical
four-wheel MuJoCo car, with NEXT_STEP autoreset on device."""

__version__ = "0.1.0"
