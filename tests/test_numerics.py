"""What "matches CPU" means for float32 math on tpu: PyTorch's matmul precision setting, accurate
transcendentals by default (torch.tpu.set_math_mode("fast") for the backend's approximations), exact
squares, and denormals (XLA flushes them to zero in arithmetic)."""

import math

import pytest
import torch
import torch.nn.functional as F

import torchtpu
from torchtpu import _compile
from conftest import EXCLUSIVE_DEVICE, metrics, run_python

ON_TPU = EXCLUSIVE_DEVICE  # a TPU is the device one process at a time may hold


def max_relative_error(got, x, fn):
    reference = fn(x.double())
    keep = reference != 0
    return float(((got.double() - reference).abs()[keep] / reference.abs()[keep]).max())


# CPU's float32 functions are within ~1.2e-7 of float64 here; accurate mode must be as close (a TPU's
# fast exp/log/tanh are 5e-6 to 4e-4 off).
BOUND = 5e-7
FUNCTIONS = {
    "exp": (torch.exp, -5, 5), "expm1": (torch.expm1, -5, 5), "log": (torch.log, 1e-3, 50),
    "log1p": (torch.log1p, -0.999, 5), "tanh": (torch.tanh, -5, 5), "sigmoid": (torch.sigmoid, -20, 20),
    "square": (torch.square, -5, 5), "pow2": (lambda v: v ** 2, -5, 5), "silu": (F.silu, -5, 5),
    "softplus": (F.softplus, -5, 5), "logsigmoid": (F.logsigmoid, -5, 5),
    "erfc": (torch.special.erfc, -3, 9),  # its tail, erfc(9) = 4e-37, is what log_ndtr and erfinv divide by
}


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_float32_math_is_as_accurate_as_cpu(name):
    fn, lo, hi = FUNCTIONS[name]
    x = torch.linspace(lo, hi, 100_001)
    assert torch.tpu.get_math_mode() == "accurate"
    assert max_relative_error(fn(x.to("tpu")).cpu(), x, fn) < BOUND
    assert max_relative_error(fn(x), x, fn) < BOUND  # the bound is CPU's own


def test_square_is_exact():
    x = torch.randn(10_000)
    assert torch.equal((x.to("tpu") ** 2).cpu(), x * x)
    assert torch.equal(torch.square(x.to("tpu")).cpu(), x * x)
    assert torch.equal((x.to("tpu") ** 3).cpu(), x * x * x)
    assert torch.equal((x.abs().to("tpu") ** 0.5).cpu(), x.abs().double().sqrt().float())  # x ** 0.5 is sqrt


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_sqrt_is_correctly_rounded(mode):
    # A v5e's float32 sqrt was an ulp low inside a fused block (sqrt(6), where CPU's scalar sqrt is
    # right); accurate mode corrects it to the correctly rounded value, float64's sqrt rounded to float32
    # (exact for sqrt); the v5e's own is up to two ulps off. PyTorch's vectorized CPU sqrt is an ulp off
    # on ~19% of these. Every normal input is checked (a TPU flushes denormals).
    x = torch.cat([torch.rand(50_000), torch.exp(torch.empty(50_000).uniform_(-87, 88)), torch.arange(1.0, 2000.0),
                   torch.tensor([0.0, 1e-30, 1e-40, 2.0 ** -78, 2.0 ** -126, 1.5e-38, 4.0, 6.0, float("inf"), -1.0,
                                 -1e-30, float("nan")])])
    with torch.tpu.eager_mode(mode):
        plain = torch.sqrt(x.to("tpu")).cpu()
        after_an_add = torch.sqrt(x.to("tpu") + 0).cpu()  # computed inside the same block in fused mode
    expected = x.double().sqrt().float()
    normal = x >= torch.finfo(torch.float32).tiny
    for got in (plain, after_an_add):
        assert torch.equal(got[normal], expected[normal])
        assert torch.equal(got.isnan(), expected.isnan())


def test_float32_pow_with_a_tensor_exponent_is_as_accurate_as_cpu():
    # XLA's pow is exp(y log x): |y log x| ulps off (a TPU's log is its fast one, op_db's pow and
    # __rpow__ failed there). Accurate mode carries y log2|x| in two floats; bases near 1 with large
    # exponents are the hard case.
    generator = torch.Generator().manual_seed(0)
    for base, exponent in [(0.5 + 1.5 * torch.rand(1 << 18, generator=generator), 40 * torch.randn(1 << 18, generator=generator)),
                           (20 * torch.rand(1 << 18, generator=generator), 10 * torch.randn(1 << 18, generator=generator)),
                           (9 * torch.randn(1 << 18, generator=generator), torch.randint(-9, 10, (1 << 18,), generator=generator).float())]:
        reference = torch.pow(base.double(), exponent.double())
        normal = (reference.abs() > 1.2e-38) & (reference.abs() < 3.4e38)
        got = torch.pow(base.to("tpu"), exponent.to("tpu")).cpu().double()
        assert float(((got - reference).abs() / reference.abs())[normal].max()) < BOUND
    # where the power is 0, 1, infinite or NaN, as CPU (no denormals: both flush them)
    special = torch.tensor([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -1.5, float("inf"), -float("inf"), float("nan"), 3.0])
    base, exponent = special.repeat_interleave(len(special)), special.repeat(len(special))
    got, want = torch.pow(base.to("tpu"), exponent.to("tpu")).cpu(), torch.pow(base, exponent)
    finite = torch.isfinite(want) & (want != 0)
    assert torch.equal(got[~finite].nan_to_num(nan=7.0), want[~finite].nan_to_num(nan=7.0))
    torch.testing.assert_close(got[finite], want[finite], rtol=BOUND, atol=0)


def test_math_mode_switch_and_cache_separation():
    x = torch.linspace(-3, 3, 1000).to("tpu")
    try:
        torch.tpu.set_math_mode("fast")
        assert torch.tpu.get_math_mode() == "fast"
        fast = torch.tanh(x).cpu()
    finally:
        torch.tpu.set_math_mode("accurate")
    accurate = torch.tanh(x).cpu()
    reference = torch.tanh(x.cpu().double())
    assert float((fast.double() - reference).abs().max()) < 1e-3  # an approximation, but of tanh
    assert float((accurate.double() - reference).abs().max()) < 1e-6
    with pytest.raises(ValueError, match="'accurate' or 'fast'"):
        torch.tpu.set_math_mode("sloppy")


def modules_looked_up() -> int:
    m = metrics()
    return m["compiles"] + m["memory_cache_hits"] + m["disk_cache_hits"]


def test_matmul_precision_is_part_of_the_cache_key():
    # Shapes no other test multiplies: a plan another test left cached would answer without a lookup.
    a, b = torch.randn(61, 67).to("tpu"), torch.randn(67, 59).to("tpu")
    reference = a.cpu().double() @ b.cpu().double()
    before = torch.get_float32_matmul_precision()
    try:
        errors = {}
        for precision in ("highest", "high", "medium"):
            torch.set_float32_matmul_precision(precision)
            compiles = modules_looked_up()
            got = (a @ b).cpu().double()
            errors[precision] = float((got - reference).abs().max() / reference.abs().max())
            # each setting is its own module (the text differs by its precision_config)
            assert modules_looked_up() > compiles, precision
    finally:
        torch.set_float32_matmul_precision(before)
    assert errors["highest"] < 1e-6, errors  # full float32, as PyTorch's default promises
    assert errors["high"] < 1e-4, errors
    if ON_TPU:
        assert errors["medium"] > errors["high"] > errors["highest"], errors  # one bfloat16 pass, then three


def test_matmul_precision_reaches_compiled_graphs():
    def f(a, b):
        return torch.nn.functional.linear(a, b).relu()

    compiled = torch.compile(f, backend="tpu")
    a, b = torch.randn(32, 64), torch.randn(16, 64)
    before = torch.get_float32_matmul_precision()
    try:
        # Computed under "highest": under "medium" PyTorch's own CPU matmul takes bfloat16 where the
        # host CPU has it (AMX / AVX512-BF16), so it is no reference there.
        torch.set_float32_matmul_precision("highest")
        expected = f(a, b)
        for precision in ("highest", "medium"):
            torch.set_float32_matmul_precision(precision)
            graphs = _compile.stats()["captures"]
            got = compiled(a.to("tpu"), b.to("tpu")).cpu()
            assert _compile.stats()["captures"] > graphs, precision  # captured anew under this setting
            # one bfloat16 pass over 64 products of N(0, 1) values: errors up to ~0.06 seen on a v5e
            tolerance = 1e-5 if precision == "highest" or not ON_TPU else 1.5e-1
            torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)
    finally:
        torch.set_float32_matmul_precision(before)


def test_denormals():
    # XLA flushes denormal operands and results of arithmetic to zero (a TPU always; XLA's CPU
    # plugin too); data movement keeps every bit, and normal values are exact.
    tiny = torch.tensor([1e-40, -3e-39, 1e-37])
    assert torch.equal(tiny.to("tpu").cpu(), tiny)
    got = (tiny.to("tpu") * torch.ones(3).to("tpu")).cpu()
    assert got[2] == tiny[2]
    for i in range(2):
        assert got[i] == tiny[i] or got[i] == 0, got


def test_digamma_near_its_poles():
    # The reflection's pi / tan(pi x) near a negative integer: CPU computes it in double; float32
    # must reduce the argument first (tan's period) or lose ~1e-5 relative there.
    x = torch.linspace(-9.99, -0.01, 200_001)
    x = x[(x - x.round()).abs() > 1e-3]
    reference = torch.digamma(x.double())
    error = ((torch.digamma(x.to("tpu")).cpu().double() - reference).abs() / reference.abs().clamp_min(1)).max()
    assert float(error) < 2e-6


HALF_MATMUL = """
import os, pathlib, torch, torchtpu
dtype = getattr(torch, os.environ["HALF_DTYPE"])
a = torch.randn(16, 32, dtype=dtype, device="tpu")
b = torch.randn(32, 8, dtype=dtype, device="tpu")
torch.testing.assert_close((a @ b).cpu(), a.cpu() @ b.cpu())
for path in pathlib.Path(os.environ["TORCHTPU_DUMP_DIR"]).iterdir():
    for line in path.read_text().splitlines():
        if "dot_general" in line:
            print(line.split(" : ")[-1].strip(), "HIGHEST" in line, "optimization_barrier" in path.read_text())
"""


@pytest.mark.parametrize("dtype,operand,exact", [("bfloat16", "bf16", False), ("float16", "f32", True)])
def test_half_matmul_gives_the_dot_its_half_operands(tmp_path, dtype, operand, exact):
    # A half-precision matmul computes in float32 and rounds once (as CPU). bfloat16: the dot takes the
    # bfloat16 operands with a float32 result (a TPU's MXU natively), not float32 copies of them.
    # float16: float32 copies at HIGHEST behind a barrier (one bfloat16 pass, a TPU's DEFAULT, rounds
    # float16's significands, and XLA on a TPU folded the converts into a float16 dot that did: a v5e's
    # float16 bmm was 4 ulps off CPU).
    result = run_python(HALF_MATMUL, env={"TORCHTPU_DUMP_DIR": str(tmp_path / "modules"), "HALF_DTYPE": dtype,
                                          "TORCHTPU_CACHE_DIR": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    dots = result.stdout.strip().splitlines()
    want = f"(tensor<16x32x{operand}>, tensor<32x8x{operand}>) -> tensor<16x8xf32> {exact} {exact}"
    assert dots and all(d == want for d in dots), dots


def _half_sums(dtype):
    # Rows whose float32 sum rounds differently when each step rounds to the half type (1 + h + h with
    # h half an ulp of 1: ties at each step give 1, once 1 + 2h), ties to even both ways, the largest
    # finite value plus half an ulp (to infinity) and less (stays), infinities and NaN.
    h = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
    big = torch.finfo(dtype).max
    ulp_of_big = 2.0 ** (math.floor(math.log2(big)) - (7 if dtype == torch.bfloat16 else 10))
    rows = [[1.0, h, h], [1.0, h, 0.0], [1 + 2 * h, h, 0.0], [-1.0, -h, -h], [big, ulp_of_big / 2, 0.0],
            [big, ulp_of_big / 4, 0.0], [float("inf"), 1.0, 0.0], [float("-inf"), float("inf"), 0.0],
            [float("nan"), 1.0, 2.0], [3.0, -3.0, 2.0**-10]]
    return torch.tensor(rows, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_half_reductions_round_their_float32_result_once(mode, dtype):
    # CPU sums bfloat16 and float16 in float32 and rounds once; XLA on a TPU made such a reduce keep
    # a bfloat16 running sum (a v5e's bfloat16 bilinear interpolate, two taps a sum, missed CPU's values).
    torch.manual_seed(0)
    x = _half_sums(dtype)
    image = torch.randn(2, 3, 7, 6, dtype=dtype)
    # Multiples of 1/8 below 2^12 in magnitude: float32 sums them exactly in any order.
    wide = (torch.randint(-100, 100, (64, 300)) / 8).to(dtype)
    with torch.tpu.eager_mode(mode):
        got = [x.to("tpu").sum(1).cpu(), x.to("tpu").sum(1, keepdim=True).t().cpu(),
               F.interpolate(image.to("tpu"), size=(5, 13), mode="bilinear").cpu(),
               wide.to("tpu").sum(0).cpu(), wide.to("tpu").float().sum(1).to(dtype).cpu()]
    want = [x.sum(1), x.sum(1, keepdim=True).t(), F.interpolate(image, size=(5, 13), mode="bilinear"),
            wide.sum(0), wide.float().sum(1).to(dtype)]
    for g, w in zip(got, want):
        assert torch.equal(g.isnan(), w.isnan()), (g, w)
        bits = lambda t: torch.where(t.isnan(), 0, t).view(torch.int16)
        assert torch.equal(bits(g), bits(w)), (g, w)


HALF_SUM = """
import os, pathlib, torch, torch.nn.functional as F, torchtpu
x = torch.randn(4, 6, 5, dtype=getattr(torch, os.environ["HALF_DTYPE"]), device="tpu")
x.sum(1).cpu(); x.sum(2, keepdim=True).transpose(0, 2).cpu()
with torch.tpu.eager_mode("fused"):  # one block: the float32 sum, then its cast
    x.float().sum(0).to(x.dtype).cpu()
F.interpolate(x[None], size=(8, 9), mode="bilinear").cpu()
for path in pathlib.Path(os.environ["TORCHTPU_DUMP_DIR"]).iterdir():
    text = path.read_text()
    if "stablehlo.reduce(" in text and ("x" + os.environ["HALF_TYPE"] + ">") in text.split("return")[-1]:
        print("rounded on the bits" if "shift_right_logical" in text else "converted: " + path.name)
"""


@pytest.mark.parametrize("dtype,short", [("bfloat16", "bf16"), ("float16", "f16")])
def test_a_float32_sum_reaches_a_half_type_through_its_rounded_bits(tmp_path, dtype, short):
    # The structure that keeps XLA on a TPU from folding the convert into the reduce: every module
    # that sums in float32 and returns bfloat16 or float16 rounds on the bits before its convert.
    result = run_python(HALF_SUM, env={"TORCHTPU_DUMP_DIR": str(tmp_path / "modules"), "HALF_DTYPE": dtype,
                                       "HALF_TYPE": short, "TORCHTPU_CACHE_DIR": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) >= 4 and set(lines) == {"rounded on the bits"}, lines
