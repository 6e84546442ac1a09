"""lightning-xpu: Intel GPU ("xpu") support for PyTorch Lightning as a patch series, its tooling and an emulated XPU."""

__version__ = "0.1.0"
