"""Calibration faults for measuring the power of `privseed audit` (tests and benchmarks/audit_power.py only).

Two faults per mechanism, both a factor 2 in the privacy loss with the claim kept:

* ``half_noise()``: the secure sampler adds noise of half the scale it is asked for (every mechanism's draw goes
  through it), while the ledger still records the scale and the epsilon of the correct mechanism;
* ``half_sensitivity(mechanism)``: the mechanism's sensitivity is counted half where the code builds it (its
  factory in ``SENSITIVITY_FACTORIES``), so its noise is calibrated to half the shift one document really makes;
  the ledger then records the halved sensitivity and scale, and the claimed epsilon is unchanged.

These are context managers that patch module attributes for the duration of a ``with`` block in this process: no
command-line flag, configuration field or environment variable reaches them, so no run can weaken its own noise
with them. The audit must call both faults VIOLATED for every mechanism (tests/test_audit.py).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from privseed.tasks.mechanisms import (LAPLACE_THRESHOLD, GaussianMechanism, LaplaceMechanism,
                                       LaplaceThresholdMechanism, SecureNoise, Sensitivity)

#: Where each audited mechanism's mechanism object is built: (module, factory). Every stage looks the factory up
#: on its module when it draws, so patching the attribute reaches the flow's own code path.
SENSITIVITY_FACTORIES: dict[str, tuple[str, str]] = {
    "vocabulary": ("privseed.tasks.vocabulary", "vocabulary_mechanism"),
    "kde": ("privseed.tasks.kde", "sketch_mechanism"),
    "histogram": ("privseed.tasks.histogram_seeds", "build_mechanism"),
    "markov": ("privseed.tasks.histogram_seeds", "pair_mechanism"),
    "augpe": ("privseed.tasks.evolution", "vote_mechanism"),
    "secpe": ("privseed.tasks.evolution", "secpe_round_mechanism"),
    # the variants of stage 1 are built by the same factory as histogram's, for their own kind and contribution
    "histogram-unit-l2": ("privseed.tasks.histogram_seeds", "build_mechanism"),
    "histogram-rank-l2": ("privseed.tasks.histogram_seeds", "build_mechanism"),
    "histogram-rank-rare-l2": ("privseed.tasks.histogram_seeds", "build_mechanism"),
    "histogram-threshold": ("privseed.tasks.histogram_seeds", "build_mechanism"),
}
FAULTS = ("half-noise", "half-sensitivity")


def halved(mechanism: Any) -> Any:
    """The same mechanism with its sensitivity counted half: Laplace's scale follows (sensitivity / epsilon), a
    Gaussian's sigma is halved with it (sigma is a noise multiplier times the sensitivity), and the thresholded
    histogram is calibrated again by its kind for half the L1 (half the scale, and the threshold OpenDP's map then
    gives); epsilon and delta, the claim, stay."""
    if isinstance(mechanism, LaplaceThresholdMechanism):
        sensitivity = Sensitivity(l2=math.sqrt(mechanism.sensitivity / 2), l1=mechanism.sensitivity / 2,
                                  l0=mechanism.l0, linf=mechanism.linf)
        return LAPLACE_THRESHOLD.calibrated(sensitivity, mechanism.epsilon, mechanism.delta)
    if isinstance(mechanism, LaplaceMechanism):
        return dataclasses.replace(mechanism, sensitivity=mechanism.sensitivity / 2)
    if isinstance(mechanism, GaussianMechanism):
        return dataclasses.replace(mechanism, sensitivity=mechanism.sensitivity / 2, sigma=mechanism.sigma / 2)
    raise TypeError(f"no sensitivity fault for {type(mechanism).__name__}")


@contextmanager
def _patched(owner: Any, attribute: str, replacement: Any) -> Iterator[None]:
    original = getattr(owner, attribute)
    setattr(owner, attribute, replacement)
    try:
        yield
    finally:
        setattr(owner, attribute, original)


@contextmanager
def half_sensitivity(mechanism: str) -> Iterator[None]:
    """Within the block, ``mechanism``'s factory returns ``halved`` mechanisms."""
    if mechanism not in SENSITIVITY_FACTORIES:
        raise KeyError(f"no sensitivity fault for {mechanism!r}; known: {', '.join(SENSITIVITY_FACTORIES)}")
    module_name, attribute = SENSITIVITY_FACTORIES[mechanism]
    module = importlib.import_module(module_name)
    factory: Callable[..., Any] = getattr(module, attribute)

    @functools.wraps(factory)
    def counted_half(*args: Any, **kwargs: Any) -> Any:
        return halved(factory(*args, **kwargs))

    with _patched(module, attribute, counted_half):
        yield


@contextmanager
def half_noise() -> Iterator[None]:
    """Within the block, the secure sampler draws Laplace, discrete Laplace and Gaussian noise at half the scale
    it is given (the Bernoulli sampling of SecPE is left alone)."""
    originals = {name: getattr(SecureNoise, name) for name in ("laplace", "discrete_laplace", "gaussian")}

    def at_half(draw: Callable[..., Any]) -> Callable[..., Any]:
        def drawn(self: SecureNoise, exact: Any, scale: float) -> Any:
            return draw(self, exact, scale / 2)

        return drawn

    try:
        for name, draw in originals.items():
            setattr(SecureNoise, name, at_half(draw))
        yield
    finally:
        for name, draw in originals.items():
            setattr(SecureNoise, name, draw)


@contextmanager
def fault(name: str | None, mechanism: str) -> Iterator[None]:
    """``half_noise()`` for "half-noise", ``half_sensitivity(mechanism)`` for "half-sensitivity", nothing for
    None (the correct mechanism)."""
    if name is None:
        yield
    elif name == "half-noise":
        with half_noise():
            yield
    elif name == "half-sensitivity":
        with half_sensitivity(mechanism):
            yield
    else:
        raise KeyError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
