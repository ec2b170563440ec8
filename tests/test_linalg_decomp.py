"""Decompositions and solvers (specs/linalg.yaml's second half) where the OpInfos do not look: LAPACK's
`info` for bad inputs, PyTorch's errors, batch broadcasting, and the gauge-free properties of eigh/svd
(whose vector signs need not match LAPACK's)."""

from __future__ import annotations

import pytest
import torch

from conftest import no_cpu_fallback

TOL = {"atol": 1e-4, "rtol": 1e-4}


def tpu(t):
    return t.to("tpu")


def spd(*batch, n=4, dtype=torch.float32):
    a = torch.randn(*batch, n, n, dtype=dtype)
    return a @ a.mT + n * torch.eye(n, dtype=dtype)


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_ex_info_counts_the_first_bad_minor(upper):
    a = spd(3)
    a[1, 2, 2] = -10.0  # the third leading minor of the second matrix is not positive definite
    with no_cpu_fallback():
        _, info = torch.linalg.cholesky_ex(tpu(a), upper=upper)
    assert info.cpu().tolist() == torch.linalg.cholesky_ex(a, upper=upper).info.tolist()


def test_cholesky_of_a_matrix_that_is_not_positive_definite_raises_like_cpu():
    a = -torch.eye(3)
    with pytest.raises(RuntimeError) as cpu_error:
        torch.linalg.cholesky(a)
    with pytest.raises(RuntimeError) as tpu_error:
        torch.linalg.cholesky(tpu(a))
    assert str(tpu_error.value) == str(cpu_error.value)


def test_inv_ex_and_lu_factor_ex_report_singular_matrices():
    a = torch.randn(2, 4, 4)
    a[1, :, 2] = 0
    with no_cpu_fallback():
        _, info = torch.linalg.inv_ex(tpu(a))
        _, _, lu_info = torch.linalg.lu_factor_ex(tpu(a))
    assert info.cpu().tolist() == torch.linalg.inv_ex(a).info.tolist()
    assert lu_info.cpu().tolist() == torch.linalg.lu_factor_ex(a).info.tolist()


@pytest.mark.parametrize("a_shape,b_shape", [((4, 4), (2, 3, 4, 2)), ((3, 1, 4, 4), (2, 4, 5)), ((2, 4, 4), (2, 4))])
def test_solve_broadcasts_batches_and_vectors(a_shape, b_shape):
    a = torch.randn(*a_shape) + 4 * torch.eye(4)
    b = torch.randn(*b_shape)
    with no_cpu_fallback():
        x = torch.linalg.solve(tpu(a), tpu(b))
    torch.testing.assert_close(x.cpu(), torch.linalg.solve(a, b), **TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_eigh_diagonalizes_with_orthonormal_vectors(dtype):
    a = torch.randn(3, 5, 5, dtype=dtype)
    with no_cpu_fallback():
        w, v = torch.linalg.eigh(tpu(a))
    w, v = w.cpu(), v.cpu()
    sym = a.tril() + a.tril(-1).mT
    torch.testing.assert_close(w, torch.linalg.eigvalsh(a), **TOL)
    torch.testing.assert_close(v @ torch.diag_embed(w) @ v.mT, sym, **TOL)
    torch.testing.assert_close(v.mT @ v, torch.eye(5, dtype=dtype).expand(3, 5, 5), **TOL)


@pytest.mark.parametrize("shape", [(4, 4), (2, 6, 3), (2, 3, 6)])
@pytest.mark.parametrize("full_matrices", [False, True])
def test_svd_reconstructs_with_orthonormal_factors(shape, full_matrices):
    a = torch.randn(*shape)
    with no_cpu_fallback():
        u, s, vh = torch.linalg.svd(tpu(a), full_matrices=full_matrices)
    u, s, vh = u.cpu(), s.cpu(), vh.cpu()
    expected_u, expected_s, expected_vh = torch.linalg.svd(a, full_matrices=full_matrices)
    assert u.shape == expected_u.shape and vh.shape == expected_vh.shape
    torch.testing.assert_close(s, expected_s, **TOL)
    k = s.shape[-1]
    torch.testing.assert_close(u[..., :k] * s.unsqueeze(-2) @ vh[..., :k, :], a, **TOL)
    eye_u = torch.eye(u.shape[-1]).expand(*u.shape[:-2], -1, -1)
    eye_v = torch.eye(vh.shape[-2]).expand(*vh.shape[:-2], -1, -1)
    torch.testing.assert_close(u.mT @ u, eye_u, **TOL)
    torch.testing.assert_close(vh @ vh.mT, eye_v, **TOL)


def test_matrix_exp_of_large_norms_scales_and_squares():
    a = torch.randn(2, 4, 4, dtype=torch.float64) * torch.tensor([0.01, 20.0], dtype=torch.float64).view(2, 1, 1)
    with no_cpu_fallback():
        e = torch.linalg.matrix_exp(tpu(a))
    torch.testing.assert_close(e.cpu(), torch.linalg.matrix_exp(a), rtol=1e-9, atol=1e-9)
