"""Sampling, clipping and noise: each checked statistically with bounds that a wrong implementation
(sigma^2 instead of sigma, shuffle-and-batch sampling, an unclipped vector) fails."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from uedp.privacy.primitives import PARALLEL_NOISE_VALUES, clip_l2, gaussian_noise, gaussian_noise_like
from uedp.privacy.randomness import Randomness


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 5000),
    scale=st.floats(1e-6, 1e6),
    bound=st.floats(1e-3, 1e3),
    seed=st.integers(0, 2**31),
)
def test_clipped_norm_never_exceeds_bound_and_small_vectors_are_untouched(n: int, scale: float, bound: float, seed: int) -> None:
    vector = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale
    clipped = clip_l2(vector, bound)
    norm = float(torch.linalg.vector_norm(clipped))
    assert norm <= bound * (1 + 1e-9)
    if float(torch.linalg.vector_norm(vector)) <= bound:
        assert torch.allclose(clipped, vector)
    else:
        assert math.isclose(norm, bound, rel_tol=1e-6)
        assert torch.allclose(clipped / norm, vector / torch.linalg.vector_norm(vector))


def test_non_finite_contribution_clips_to_zero() -> None:
    for bad in (float("nan"), float("inf")):
        vector = torch.ones(5)
        vector[2] = bad
        assert torch.equal(clip_l2(vector, 1.0), torch.zeros(5))


def _std_within_chi_square(samples: torch.Tensor, sigma: float, alpha: float = 1e-6) -> bool:
    """Two-sided chi-square test of the sample variance against sigma^2 (mean known to be 0)."""
    n = samples.numel()
    statistic = float((samples.double() ** 2).sum()) / sigma**2
    return stats.chi2.ppf(alpha / 2, n) <= statistic <= stats.chi2.ppf(1 - alpha / 2, n)


def test_noise_standard_deviation_is_sigma_not_sigma_squared() -> None:
    for sigma in (0.5, 2.0, 7.0):
        noise = gaussian_noise((200_000,), sigma, Randomness.secure().stream("noise", 1))
        assert _std_within_chi_square(noise, sigma)
        assert not _std_within_chi_square(noise, sigma**2)


def test_poisson_sampling_rate_within_binomial_bounds_and_sizes_vary() -> None:
    randomness = Randomness.secure()
    n, q, rounds = 400, 0.05, 500
    units = [f"u{i}" for i in range(n)]
    sizes = [len(randomness.poisson_sample("sample-users", r, units, q)) for r in range(1, rounds + 1)]
    total = sum(sizes)
    low, high = stats.binom.ppf([1e-6, 1 - 1e-6], n * rounds, q)
    assert low <= total <= high
    assert len(set(sizes)) > 5  # Poisson batches vary in size; a fixed batch would not


def test_secure_mode_seeds_from_the_os_and_seeded_mode_reproduces() -> None:
    a = gaussian_noise((8,), 1.0, Randomness.seeded(3).stream("noise", 1))
    b = gaussian_noise((8,), 1.0, Randomness.seeded(3).stream("noise", 1))
    assert torch.equal(a, b)
    c = gaussian_noise((8,), 1.0, Randomness.secure().stream("noise", 1))
    d = gaussian_noise((8,), 1.0, Randomness.secure().stream("noise", 1))
    assert not torch.equal(c, d)
    assert "root" not in repr(Randomness.secure()) and "_root" not in repr(Randomness.secure())


def test_noise_drawn_in_parallel_chunks_is_one_iid_gaussian_and_replays_when_seeded() -> None:
    """A draw large enough to be split over threads: every chunk has standard deviation sigma, chunks are
    uncorrelated (the child streams are independent), shapes and dtypes follow the tensors, and a
    seeded stream gives the same noise again."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        shapes = [torch.zeros(3, 5, dtype=torch.float64), torch.zeros(2 * PARALLEL_NOISE_VALUES + 7)]
        first = gaussian_noise_like(shapes, 1.5, Randomness.seeded(3).stream("noise", 1))
        again = gaussian_noise_like(shapes, 1.5, Randomness.seeded(3).stream("noise", 1))
        other = gaussian_noise_like(shapes, 1.5, Randomness.seeded(3).stream("noise", 2))
        torch.set_num_threads(1)  # a resumed run with other --threads draws the same noise
        one_thread = gaussian_noise_like(shapes, 1.5, Randomness.seeded(3).stream("noise", 1))
    finally:
        torch.set_num_threads(before)
    assert [t.shape for t in first] == [s.shape for s in shapes] and first[0].dtype == torch.float64
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(first, again, one_thread))
    assert not torch.equal(first[1], other[1])
    big = first[1].double()
    half = big.numel() // 2
    for chunk in (big[:half], big[half:]):
        chi = float((chunk**2).sum()) / 1.5**2
        assert stats.chi2.ppf(1e-6, chunk.numel()) <= chi <= stats.chi2.ppf(1 - 1e-6, chunk.numel())
    correlation = float(torch.corrcoef(torch.stack([big[:half][:100_000], big[half:][:100_000]]))[0, 1])
    assert abs(correlation) < 5 / math.sqrt(100_000)


def test_noise_drawn_ahead_is_the_same_noise_with_the_right_standard_deviation() -> None:
    """Drawn on a background thread while the step computes: the values are those of the round's own keyed
    stream, whichever thread draws them (a seeded stream gives the same numbers both ways), of std sigma, and a
    secure stream's noise is not the noise of any seeded stream (nothing logged reproduces it)."""
    from uedp.privacy.primitives import noise_ahead

    shapes = [torch.empty(700, 900), torch.empty(3, dtype=torch.float64)]
    ahead = noise_ahead(shapes, 2.5, Randomness.seeded(5).stream("noise", 4)).result()
    inline = gaussian_noise_like(shapes, 2.5, Randomness.seeded(5).stream("noise", 4))
    assert all(torch.equal(a, b) and a.dtype == t.dtype and a.shape == t.shape
               for a, b, t in zip(ahead, inline, shapes))
    assert float(ahead[0].std()) == pytest.approx(2.5, rel=0.01)
    secure = noise_ahead(shapes, 2.5, Randomness.secure().stream("noise", 4)).result()
    assert not torch.equal(secure[0], ahead[0])
    assert float(secure[0].std()) == pytest.approx(2.5, rel=0.01)


def test_device_noise_keys_are_a_64_bit_key_and_counter_per_chunk_from_the_rounds_stream() -> None:
    """The keys a CUDA device's Philox generator is seeded with (privacy.primitives.device_noise_keys): one
    per chunk of DEVICE_NOISE_VALUES, each a full 64-bit key and a 64-bit starting counter (a multiple of 4),
    a function of the round's secret stream only (a seeded run replays them, a secure one does not), distinct
    across chunks and rounds, and never shown by repr. The draw itself is tested on a GPU (tests/test_cuda.py)."""
    from uedp.privacy.primitives import DEVICE_NOISE_VALUES, device_noise_keys

    count = 3 * DEVICE_NOISE_VALUES + 1
    keys = device_noise_keys(Randomness.seeded(5).stream("noise", 4), count)
    assert len(keys) == 4 and len(device_noise_keys(Randomness.seeded(5).stream("noise", 4), 10)) == 1
    assert keys == device_noise_keys(Randomness.seeded(5).stream("noise", 4), count)
    assert all(0 <= k.seed < 1 << 64 and 0 <= k.offset < 1 << 64 and k.offset % 4 == 0 for k in keys)
    assert len({k.seed for k in keys}) == 4
    assert max(k.seed for k in keys).bit_length() > 56 and max(k.offset for k in keys).bit_length() > 56
    other_round = device_noise_keys(Randomness.seeded(5).stream("noise", 5), count)
    secure = device_noise_keys(Randomness.secure().stream("noise", 4), count)
    assert not {k.seed for k in keys} & ({k.seed for k in other_round} | {k.seed for k in secure})
    assert str(keys[0].seed) not in repr(keys) and "secret" in repr(keys[0])


def test_the_device_keys_strength_is_stated_as_the_64_bit_key_wherever_it_is_stated() -> None:
    """Issue 47, item 6: the docstrings said 126 secret bits, docs/PRIVACY.md 64 (once the Philox key is
    guessed, the counter can be read back from one block of output)."""
    import uedp.privacy.randomness as randomness_module
    from uedp.privacy.primitives import DeviceKey

    from support import REPO

    def flat(text: str | None) -> str:
        return " ".join((text or "").split())

    for stated in (flat(randomness_module.__doc__), flat(DeviceKey.__doc__)):
        assert "126" not in stated and "the key's 64 bits" in stated
    assert "The security is that of the 64-bit Philox key" in flat((REPO / "docs" / "PRIVACY.md").read_text())


def test_noise_for_cpu_tensors_never_takes_the_device_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tensors get the numpy-drawn secret noise (a CPU torch generator keeps 32 bits of a seed)."""
    from uedp.privacy import primitives

    def refuse(*args: object) -> None:
        raise AssertionError("the device path was taken for CPU tensors")

    monkeypatch.setattr(primitives, "_device_standard_normal", refuse)
    noise = primitives.noise_ahead([torch.empty(300, 40)], 1.0, Randomness.secure().stream("noise", 1)).result()
    assert noise[0].device.type == "cpu" and float(noise[0].std()) == pytest.approx(1.0, rel=0.05)
    assert primitives.gaussian_noise((50,), 1.0, Randomness.secure().stream("noise", 1), device="cpu").shape == (50,)


def test_cpu_noise_is_drawn_on_a_background_thread_only_beside_free_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drawing beside torch's threads on cores they already fill slows every operation of the round (its
    threads wait for the preempted one): the draw overlaps only where a CPU is left free, else it runs first.
    Same values either way."""
    import threading

    from uedp.privacy import primitives

    where: list[str] = []
    real = primitives._noise_shaped

    def recorded(*args: object) -> list[torch.Tensor]:
        where.append(threading.current_thread().name)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(primitives, "_noise_shaped", recorded)
    shapes = [torch.empty(300, 40)]
    draws = []
    for spare in (0, 1):
        monkeypatch.setattr(primitives, "available_cpus", lambda spare=spare: torch.get_num_threads() + spare)
        draws.append(primitives.noise_ahead(shapes, 1.0, Randomness.seeded(2).stream("noise", 1)).result()[0])
    assert where[0] == threading.current_thread().name and where[1].startswith("uedp-noise-ahead")
    assert torch.equal(draws[0], draws[1])
